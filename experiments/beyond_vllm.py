"""Beyond vLLM (issue 15): `adaptive` vs the best vLLM setting vs `offline_bound`, per capacity.

`adaptive` here is either the cache core's profile (`adaptive`, on pages of the checkpoint unit)
or the simulator's unit cache (`ckpt_adaptive`, the default: KV pages of `block_size`,
checkpoints at multiples of the unit, fast on the full Mooncake trace); each present one gets
its ratios (`<name>_over_vllm`, `<name>_of_bound`).

For one trace (a file, or a synthetic generator over several seeds) and a list of capacities,
replays every policy through `hybrid_cache.sim.simulate.simulate` in one process and reports per
(seed, capacity): FLOPs saved and token hit rate of each policy, `vllm_default`'s share of the
token-level infinite cache (`oracle_reused(trace, 1)`, which picks the capacities: the issue asks
for 20-60%), vLLM best = max(`vllm_default`, `vllm_default` with hash block
`partial_hash_block`), `adaptive / vLLM best`, `adaptive / bound` and `bound / vLLM best`
(the headroom any policy has). Plots FLOPs saved against capacity (first seed) into the workdir.
Policy `core_fine_keys` (not in the defaults) is the jitted core with `--fine-keys`: vLLM's rules
plus states and hits at multiples of the checkpoint unit (`CacheConfig.fine_keys`).

  python -m experiments.run --gin_file=configs/experiments/beyond_vllm.gin
  python -m experiments.beyond_vllm --trace agentic --format synthetic --seeds 0 1 2 \
      --capacities 1e11 2e11
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments import plotting
from hybrid_cache import cli_util
from hybrid_cache.sim import synthetic
from hybrid_cache.sim import trace as trace_lib
from hybrid_cache.sim.cost_model import get_model
from hybrid_cache.sim.metrics import flops_saved
from hybrid_cache.sim.oracle import oracle_reused
from hybrid_cache.sim.policies import CORE_POLICIES
from hybrid_cache.sim.policies import UNIT_ADAPTIVE
from hybrid_cache.sim.simulate import simulate

DEFAULT_POLICIES = ("vllm_default", "vllm_partial", UNIT_ADAPTIVE, "offline_bound")
ADAPTIVE = ("adaptive", UNIT_ADAPTIVE)  # the core's and the unit cache's: ratios reported


def load(
  trace: str, fmt: str, seed: int, limit: int | None = None, params: Mapping | None = None
) -> trace_lib.Trace:
  """The trace file (or synthetic generator `trace` at `seed` with keyword `params`), first
  `limit` requests. `fmt` "sharegpt": `trace` is a ShareGPT JSON or "default" (the packaged
  copy, extra `sharegpt`); seed k takes the k-th disjoint set of sessions
  (`load_sharegpt(first_session=k * num_sessions)`, `params` its other keywords)."""
  if fmt == "synthetic":
    t = synthetic.generate(trace, seed=seed, **dict(params or {}))
  elif fmt == "sharegpt":
    from hybrid_cache.sim.sharegpt import load_sharegpt

    kw = {"num_sessions": 100} | dict(params or {})
    path = None if trace == "default" else trace
    t = load_sharegpt(path, first_session=seed * kw["num_sessions"], **kw)
  else:
    if not os.path.isfile(trace):
      raise ValueError(f"trace file {trace!r} does not exist")
    t = trace_lib.load(trace, fmt, limit=limit)
  return t if limit is None else t.head(limit)


def _row(trace, model, cap, policy, block, unit, hbs, iterations, backend) -> dict[str, Any]:
  name, core = policy, {"backend": backend}
  size = block
  if policy == "vllm_partial":
    name, core = "vllm_default", {"backend": backend, "hash_block_size": hbs}
  if policy == "core_fine_keys":  # beyond vLLM: the core's own states at multiples of U
    name, core = "vllm_default", {"backend": backend, "checkpoint_unit": unit}
  if policy in ("offline_bound", "adaptive"):  # (the core's `adaptive`: pages of U)
    size = unit
  t0 = time.perf_counter()
  triples, extra = simulate(
    trace,
    model,
    cap,
    name,
    size,
    core=core if name in CORE_POLICIES else None,
    bound_iterations=iterations,
    checkpoint_unit=unit,
  )
  reused = np.array([t[2] for t in triples], np.int64)
  row = {
    "policy": policy,
    "flops_saved": flops_saved(model, reused),
    "tokens_reused": int(reused.sum()),
    "wall_s": time.perf_counter() - t0,
  }
  if policy == "offline_bound":
    row["flops_saved"] = extra["bound_flops_saved"]
    row["tokens_reused"] = extra["bound_tokens_reused"]
    row["clairvoyant_flops_saved"] = extra["clairvoyant_flops_saved"]
  if policy == UNIT_ADAPTIVE:
    row["alpha_requests"] = extra.get("alpha_requests")
  if policy == "adaptive":
    row["weighting_tuning"] = extra.get("weighting_tuning")
  return row


def compare(
  trace: str,
  fmt: str,
  capacities: Sequence[float],
  seeds: Sequence[int] = (0,),
  model: str = "marconi_7b",
  policies: Sequence[str] = DEFAULT_POLICIES,
  block_size: int = 512,
  checkpoint_unit: int = 64,
  partial_hash_block: int = 64,
  bound_iterations: int = 500,
  limit: int | None = None,
  progress=None,
  params: Mapping | None = None,
  backend: str = "jax",
) -> list[dict[str, Any]]:
  """One record per (seed, capacity): per-policy FLOPs/tokens and the ratios (module doc)."""
  m = get_model(model)
  out = []
  for seed in seeds:
    tr = load(trace, fmt, seed, limit, params)
    tok_oracle = int(oracle_reused(tr, 1).sum())
    for cap in capacities:
      rows = {}
      for p in ("vllm_default",) + tuple(x for x in policies if x != "vllm_default"):
        rows[p] = _row(
          tr, m, cap, p, block_size, checkpoint_unit, partial_hash_block, bound_iterations, backend
        )
        if progress is not None:
          progress(f"seed {seed} capacity {cap:g} {p}: {rows[p]['flops_saved']:.4g} FLOPs")
      vs = [rows[p]["flops_saved"] for p in ("vllm_default", "vllm_partial") if p in rows]
      vbest = max(vs) if vs else None
      rec = {
        "seed": seed,
        "capacity_bytes": cap,
        "requests": len(tr),
        "input_tokens": tr.input_tokens,
        "vllm_default_of_token_oracle": (
          rows["vllm_default"]["tokens_reused"] / tok_oracle if tok_oracle else 0.0
        ),
        "vllm_best_flops": vbest,
        "rows": rows,
      }
      b = rows["offline_bound"]["flops_saved"] if "offline_bound" in rows else None
      if b is not None:
        rec["bound_over_vllm"] = b / vbest if vbest else None
      for a in (a for a in ADAPTIVE if a in rows):
        if vbest:
          rec[f"{a}_over_vllm"] = rows[a]["flops_saved"] / vbest
        if b:
          rec[f"{a}_of_bound"] = rows[a]["flops_saved"] / b
      out.append(rec)
  return out


def run(
  workdir: str,
  seed: int = 0,
  trace: str = "agentic",
  fmt: str = "synthetic",
  capacities: Sequence[float] = (1e11, 2e11),
  seeds: Sequence[int] | None = None,
  model: str = "marconi_7b",
  policies: Sequence[str] = DEFAULT_POLICIES,
  block_size: int = 512,
  checkpoint_unit: int = 64,
  partial_hash_block: int = 64,
  bound_iterations: int = 500,
  limit: int | None = None,
  params: Mapping | None = None,
  backend: str = "jax",
) -> dict[str, Any]:
  """`experiments.run` entry: `compare`, then a plot of FLOPs saved vs capacity (first seed)."""
  seeds = (seed,) if seeds is None else tuple(seeds)
  recs = compare(
    trace,
    fmt,
    capacities,
    seeds,
    model,
    policies,
    block_size,
    checkpoint_unit,
    partial_hash_block,
    bound_iterations,
    limit,
    progress=lambda s: print(s, file=sys.stderr, flush=True),
    params=params,
    backend=backend,
  )
  first = [r for r in recs if r["seed"] == seeds[0]]
  names = list(first[0]["rows"]) if first else []
  series = {p: {"flops_saved": [r["rows"][p]["flops_saved"] for r in first]} for p in names}
  plot = None
  if workdir and first:
    plot = plotting.line_chart(
      os.path.join(workdir, "flops_vs_capacity.png"),
      f"{trace} (seed {seeds[0]}), {model}, B={block_size}, U={checkpoint_unit}",
      [r["capacity_bytes"] for r in first],
      series,
      ["flops_saved"],
      "capacity (bytes)",
    )
  return {"records": recs, "plot": plot}


def main(argv: list[str] | None = None) -> int:
  """Runs the comparison; returns the exit status (2 with one `error:` line on bad input)."""
  p = cli_util.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--trace", required=True)
  p.add_argument(
    "--format", required=True, choices=("mooncake", "marconi", "synthetic", "sharegpt")
  )
  p.add_argument("--capacities", type=float, nargs="+", required=True)
  p.add_argument("--seeds", type=int, nargs="+", default=[0])
  p.add_argument("--model", default="marconi_7b")
  p.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES))
  p.add_argument("--limit", type=int, default=None)
  p.add_argument("--out", default=None, help="write the records (JSON) here")
  try:
    a = p.parse_args(argv)
  except SystemExit as e:  # usage errors (printed by the parser) and --help
    return e.code if isinstance(e.code, int) else cli_util.USAGE_ERROR
  try:
    recs = compare(
      a.trace,
      a.format,
      a.capacities,
      a.seeds,
      a.model,
      a.policies,
      limit=a.limit,
      progress=lambda s: print(s, file=sys.stderr, flush=True),
    )
  except (ValueError, ImportError) as e:  # a trace, seed or capacity the replay rejects
    print(f"error: {cli_util.one_line(e)}", file=sys.stderr)
    return cli_util.USAGE_ERROR
  except OSError as e:  # a trace file that cannot be read
    print(f"error: trace file {a.trace!r}: {cli_util.os_error_text(e)}", file=sys.stderr)
    return cli_util.USAGE_ERROR
  text = json.dumps(recs, indent=1)
  if a.out:
    with open(a.out, "w", encoding="utf-8") as f:
      f.write(text + "\n")
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
