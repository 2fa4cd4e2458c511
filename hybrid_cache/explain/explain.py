"""What vLLM 0.33 hits on a model and a trace, why the rest is recomputed, and what recovers it.

`explain(trace args, model config, target, flags, capacity)` replays the trace through the
simulator's exact path (`hybrid_cache.sim.cli.run`, the cache core on vLLM's derived geometry,
`hybrid_cache.geometry`) under a few arms, each relaxing one of vLLM's limits, and reads the
per-request hits (`--dump`). Per request, with M = the reusable prefix of an infinite
token-exact cache (`sim.oracle.oracle_matched`, capped at input - 1 as vLLM caps hits):

  hit            what vLLM hits: `vllm_default` at the given capacity           (arm A0)
  below the block floor
                 M is under one vLLM block: vLLM cannot hit it at all (M - A0)
  and, for the others:
  evicted        + what the same rules hit with unbounded memory                A1 - A0
  not retained   + what dense retention adds there (interval None, a state at
                 every chunk end: `vllm_align_dense`)                           A2 - A1
  partial block  + what hits at the hash block `prefix_match_unit` add there
                 (vLLM's partial hits)                                          A3 - A2
  no state at the prefix end
                 the rest, M - A3: vLLM keeps a recurrent state only where a
                 chunk ends (a block boundary; the junction, rounded down to a
                 block): the first re-sighting of a shared prefix computes its
                 junction state, so only later requests hit, and the tokens
                 between the last block boundary and the divergence are
                 recomputed every time

A request's `reason` is its largest loss ("nothing_lost" when it hit all it could). Each
difference is clipped at 0 (the arms are replays, not nested sets; what does not add up
is reported as `unattributed`). Recoveries, each at the given capacity against A0: more KV
memory (A1), `prefix_cache_retention_interval=None` (dense), `prefix_match_unit=u` (u: the
largest divisor of vLLM's block <= 64, a multiple of 16 where one exists), the project's
`adaptive` policy, and the bound M.

Example::

  python -m hybrid_cache.explain --trace ../shared/traces/mooncake_conversation_trace.jsonl \\
      --format mooncake --limit 300 --model-config configs/hf/qwen3_5_0p8b --target sm90 \\
      --capacity-bytes 2e10 --out runs/explain
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from typing import Any

import numpy as np

from hybrid_cache import geometry as geometry_lib
from hybrid_cache.sim import cli as sim_cli
from hybrid_cache.sim.cli_args import _load_trace
from hybrid_cache.sim.oracle import oracle_matched

REASONS = (
  "hit",
  "below_block_floor",
  "evicted",
  "not_retained",
  "partial_block",
  "no_state_at_prefix_end",
  "unattributed",
)
RECOVERIES = {
  "kv_memory": "more KV memory (gpu_memory_utilization / kv_cache_memory_bytes)",
  "dense_retention": "vLLM flag prefix_cache_retention_interval=None (a state per chunk end)",
  "prefix_match_unit": "vLLM flag prefix_match_unit={u} (partial hits)",
  "adaptive": "project policy adaptive (states at the branch point and a continuation)",
  "bound": "the infinite token-exact cache (no policy exceeds it)",
}


@dataclasses.dataclass(frozen=True)
class TraceArgs:
  """The simulator's trace options (`python -m hybrid_cache.sim` names them alike)."""

  trace: str
  format: str
  limit: int | None = None
  max_input: int | None = None
  seed: int = 0


def match_unit(block_size: int) -> int:
  """The `prefix_match_unit` tried: the largest divisor of `block_size` that is <= 64 and a
  multiple of 16, else the largest divisor <= 64."""
  divisors = [d for d in range(1, min(64, block_size) + 1) if block_size % d == 0]
  sixteens = [d for d in divisors if d % 16 == 0]
  return max(sixteens or divisors)


def _replay(
  trace_args: TraceArgs, model_config: str, target: str, flags, policy, capacity, extra=()
):
  """Per-request tokens reused (int64[n]) and the summary of one replay."""
  with tempfile.TemporaryDirectory() as tmp:
    dump = os.path.join(tmp, "dump.json")
    argv = [
      f"--trace={trace_args.trace}",
      f"--format={trace_args.format}",
      f"--seed={trace_args.seed}",
      f"--model-config={model_config}",
      f"--target={target}",
      f"--policy={policy}",
      f"--capacity-bytes={capacity}",
      f"--dump={dump}",
      "--no-oracle",
      *extra,
    ]
    if trace_args.limit is not None:
      argv.append(f"--limit={trace_args.limit}")
    if trace_args.max_input is not None:
      argv.append(f"--max-input={trace_args.max_input}")
    if flags is not None:
      argv.append(f"--vllm-flags={json.dumps(flags)}")
    summary = sim_cli.run(argv)
    with open(dump) as f:
      reused = np.array([t[2] for t in json.load(f)], dtype=np.int64)
  return reused, summary


def _unbounded_capacity(g, trace) -> float:
  """Bytes that hold every block of every request in every group, with room for states."""
  tokens = sum(r.num_tokens for r in trace.requests)
  blocks = math.ceil(tokens / g.block_size) + 8 * len(trace.requests)
  return float(blocks * len(g.groups) * g.bytes_per_block)


def explain(
  trace_args: TraceArgs,
  model_config: str,
  target: str = geometry_lib.DEFAULT_TARGET,
  vllm_flags: dict | None = None,
  capacity_bytes: float = 40e9,
) -> dict[str, Any]:
  """The per-request explanation and the recoveries (module docstring)."""
  g = geometry_lib.derive(model_config, target, vllm_flags)
  trace = _load_trace(trace_args)  # the simulator's loader reads these same option names
  inputs = np.array([r.num_input_tokens for r in trace.requests], dtype=np.int64)
  bound = np.minimum(oracle_matched(trace), inputs - 1).clip(min=0)
  unbounded = max(_unbounded_capacity(g, trace), capacity_bytes)
  u = match_unit(g.block_size)
  pmu = {**(vllm_flags or {}), "prefix_match_unit": u}

  def replay(policy, capacity, flags_=vllm_flags or None):
    return _replay(trace_args, model_config, target, flags_, policy, capacity)

  a0, s0 = replay("vllm_default", capacity_bytes)
  a1, _ = replay("vllm_default", unbounded)
  a2, _ = replay("vllm_align_dense", unbounded)
  a3, _ = replay("vllm_align_dense", unbounded, pmu)
  dense_c, _ = replay("vllm_align_dense", capacity_bytes)
  pmu_c, _ = replay("vllm_default", capacity_bytes, pmu)
  adaptive_c, _ = replay("adaptive", capacity_bytes)

  def gain(x, y):
    return np.maximum(x - y, 0)

  over = bound >= g.block_size  # requests whose reusable prefix spans at least one block
  parts = {
    "hit": a0,
    "below_block_floor": np.where(over, 0, gain(bound, a0)),
    "evicted": np.where(over, gain(a1, a0), 0),
    "not_retained": np.where(over, gain(a2, a1), 0),
    "partial_block": np.where(over, gain(a3, a2), 0),
    "no_state_at_prefix_end": np.where(over, gain(bound, np.maximum(a3, a0)), 0),
  }
  attributed = sum(parts.values())
  parts["unattributed"] = bound - attributed  # may be negative where the arms overlap
  per_request = [
    {
      "request": i,
      "input_tokens": int(inputs[i]),
      "reusable": int(bound[i]),
      **{k: int(v[i]) for k, v in parts.items()},
      "reason": max(REASONS[1:-1], key=lambda k: parts[k][i])
      if bound[i] > a0[i]
      else "nothing_lost",
    }
    for i in range(len(inputs))
  ]
  vllm_total = int(a0.sum())
  recoveries = {
    "kv_memory": int(a1.sum()) - vllm_total,
    "dense_retention": int(dense_c.sum()) - vllm_total,
    "prefix_match_unit": int(pmu_c.sum()) - vllm_total,
    "adaptive": int(adaptive_c.sum()) - vllm_total,
    "bound": int(bound.sum()) - vllm_total,
  }
  return {
    "vllm_geometry": g.summary(),
    "requests": len(inputs),
    "input_tokens": int(inputs.sum()),
    "reusable_tokens": int(bound.sum()),
    "vllm_cached_tokens": vllm_total,
    "vllm_request_hit_rate": float((a0 > 0).mean()) if len(a0) else 0.0,
    "capacity_bytes": capacity_bytes,
    "prefix_match_unit_tried": u,
    "lost_tokens": {k: int(v.sum()) for k, v in parts.items() if k != "hit"},
    "requests_by_reason": {
      r: sum(1 for p in per_request if p["reason"] == r) for r in (*REASONS[1:-1], "nothing_lost")
    },
    "recoveries": {
      k: {"tokens": v, "what": RECOVERIES[k].format(u=u)} for k, v in recoveries.items()
    },
    "per_request": per_request,
    "flops_saved_vllm": s0["flops_saved"],
  }


def table(result: dict[str, Any]) -> str:
  """The summary as text: where the reusable tokens went, and what recovers them."""
  total = max(1, result["reusable_tokens"])
  lines = [
    result["vllm_geometry"],
    f"{result['requests']} requests, {result['input_tokens']:,} prompt tokens, "
    f"{result['reusable_tokens']:,} reusable (infinite token-exact cache)",
    f"  {'hit by vLLM':<28}{result['vllm_cached_tokens']:>14,}"
    f"{100 * result['vllm_cached_tokens'] / total:>8.1f}%",
  ]
  for k, v in result["lost_tokens"].items():
    n = result["requests_by_reason"].get(k)
    count = "" if n is None else f"   {n} requests"
    lines.append(f"  {k.replace('_', ' '):<28}{v:>14,}{100 * v / total:>8.1f}%{count}")
  lines.append("recovered at the same capacity:")
  for r in result["recoveries"].values():
    lines.append(f"  {r['tokens']:>+14,}  {r['what']}")
  return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> str:
  """Two panels: where the reusable tokens went, and the tokens each recovery adds."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
  names = ["hit", *[k for k in result["lost_tokens"] if k != "unattributed"]]
  values = [result["vllm_cached_tokens"], *[result["lost_tokens"][k] for k in names[1:]]]
  left.barh([n.replace("_", " ") for n in names], values, color="#4c72b0")
  left.invert_yaxis()
  left.set_title("reusable prompt tokens: where they went")
  rec = result["recoveries"]
  right.barh(list(rec), [r["tokens"] for r in rec.values()], color="#55a868")
  right.invert_yaxis()
  right.set_title("tokens recovered at the same capacity")
  fig.suptitle(result["vllm_geometry"][:110], fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def write(result: dict[str, Any], out_dir: str) -> list[str]:
  """`explain.json` (everything), `requests.jsonl` (one line per request), `explain.png`."""
  os.makedirs(out_dir, exist_ok=True)
  paths = [os.path.join(out_dir, n) for n in ("explain.json", "requests.jsonl", "explain.png")]
  with open(paths[0], "w") as f:
    json.dump({k: v for k, v in result.items() if k != "per_request"}, f, indent=1)
  with open(paths[1], "w") as f:
    for row in result["per_request"]:
      f.write(json.dumps(row) + "\n")
  plot(result, paths[2])
  return paths
