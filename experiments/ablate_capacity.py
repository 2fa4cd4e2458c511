"""Hit rate and TTFT vs capacity for every simulator policy on several traces (+ oracle bound).

  python -m experiments.ablate_capacity [--out DIR] [--limit N] [--backend reference|jax]
      [--traces conversation,synthetic,chat] [--policies a,b,...] [--block-size 64]

Writes DIR/results.json (one record per trace x policy x capacity: the simulator summary, or
`skipped` with the reason when the capacity cannot hold the longest request in the core's
pages), DIR/hit_rate_vs_capacity.png and DIR/ttft_p95_vs_capacity.png (one panel per trace, one
line per policy, the infinite-cache oracle dashed). Mooncake traces: the two files of
`experiments/traces/` (copies of `shared/traces/`, see MANIFEST.md), first `--limit` requests;
chat: the seeded synthetic chat generator.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from hybrid_cache.sim import synthetic
from hybrid_cache.sim import trace as trace_lib
from hybrid_cache.sim.cost_model import get_model
from hybrid_cache.sim.metrics import summarize
from hybrid_cache.sim.oracle import oracle_reused
from hybrid_cache.sim.policies import parse_policy
from hybrid_cache.sim.simulate import simulate

HERE = os.path.dirname(os.path.abspath(__file__))
TRACE_FILES = {
  "conversation": os.path.join(HERE, "traces", "mooncake_conversation_trace.jsonl"),
  "synthetic": os.path.join(HERE, "traces", "mooncake_synthetic_trace.jsonl"),
}
DEFAULT_CAPACITIES = {
  "conversation": (1e10, 2e10, 4e10, 8e10),
  "synthetic": (1e10, 2e10, 4e10, 8e10),
  "chat": (2e9, 5e9, 1e10, 2e10),
}
# Core policies' block size per trace: 512 = Mooncake's hash block (exact; a marconi_7b page is
# then KV-bound: 33.5 MB of KV vs a 26.8 MB state); chat: 128 (the state-bound page wastes 69%
# of each full-attention page, reported as page_padding).
DEFAULT_BLOCK_SIZES = {"conversation": 512, "synthetic": 512, "chat": 128}
DEFAULT_POLICIES = (
  "marconi_compat_sglang",
  "marconi_compat",
  "marconi_compat_static:1",
  "marconi_compat_vllm",
  "align_dense_no_junction",
  "vllm_align_dense",
  "vllm_default",
  "all_dense_no_junction",
)


def load_traces(names, limit: int | None, chat_sessions: int = 100) -> dict:
  out = {}
  for name in names:
    if name in TRACE_FILES:
      out[name] = trace_lib.load_mooncake(TRACE_FILES[name], limit=limit)
    elif name == "chat":
      tr = synthetic.chat(seed=0, num_sessions=chat_sessions)
      out[name] = tr.head(limit) if limit else tr
    else:
      raise ValueError(f"trace must be one of {(*TRACE_FILES, 'chat')}, got {name!r}")
  return out


def run_ablation(
  traces,
  capacities,
  policies,
  model_name="marconi_7b",
  block_size=None,
  backend="reference",
  log=print,
) -> list[dict]:
  """One record per (trace, policy, capacity); the oracle once per trace (capacity None).

  block_size: the core policies' block size (None: `DEFAULT_BLOCK_SIZES` per trace, else 64).
  """
  model = get_model(model_name)
  records = []
  for tname, tr in traces.items():
    oracle = oracle_reused(tr, 1).tolist()
    s = summarize([(int(x > 0), r.num_input_tokens, x) for r, x in zip(tr.requests, oracle)], model)
    records.append({"trace": tname, "policy": "oracle", "capacity_bytes": None} | s)
    for pol in policies:
      for cap in capacities[tname]:
        core = parse_policy(pol).kind == "core"
        t0 = time.perf_counter()
        rec = {"trace": tname, "policy": pol, "capacity_bytes": cap}
        try:
          tri, extra = simulate(
            tr,
            model,
            cap,
            pol,
            (block_size or DEFAULT_BLOCK_SIZES.get(tname, 64)) if core else None,
            core={"backend": backend} if core else None,
          )
        except ValueError as e:
          records.append(rec | {"skipped": str(e)})
          log(f"{tname:13s} {pol:24s} {cap:8.0e} skipped: {e}")
          continue
        oracle_b = oracle_reused(tr, extra["block_size"]).tolist() if core else oracle
        rec |= summarize(tri, model, oracle_reused=oracle_b) | {
          k: v for k, v in extra.items() if isinstance(v, int | float | str | list | type(None))
        }
        records.append(rec)
        log(
          f"{tname:13s} {pol:24s} {cap:8.0e} hit {rec['token_hit_rate']:.4f} "
          f"p95 {rec['ttft_p95_ms']:.0f} ms ({time.perf_counter() - t0:.1f} s)"
        )
  return records


def plot(records, out_dir: str) -> list[str]:
  """hit_rate_vs_capacity.png and ttft_p95_vs_capacity.png; returns their paths."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  traces = list(dict.fromkeys(r["trace"] for r in records))
  paths = []
  for key, label, fname in (
    ("token_hit_rate", "token hit rate", "hit_rate_vs_capacity.png"),
    ("ttft_p95_ms", "simulated TTFT P95 (ms)", "ttft_p95_vs_capacity.png"),
  ):
    fig, axes = plt.subplots(1, len(traces), figsize=(5 * len(traces), 4), squeeze=False)
    for ax, t in zip(axes[0], traces):
      rows = [r for r in records if r["trace"] == t and "skipped" not in r]
      for pol in dict.fromkeys(r["policy"] for r in rows):
        pts = sorted(
          (r["capacity_bytes"], r[key])
          for r in rows
          if r["policy"] == pol and r["capacity_bytes"] is not None
        )
        if pts:
          ax.plot([p[0] / 1e9 for p in pts], [p[1] for p in pts], marker="o", label=pol)
      for r in rows:
        if r["policy"] == "oracle":
          ax.axhline(r[key], color="k", linestyle="--", label="oracle (infinite cache)")
      ax.set_xscale("log")
      ax.set_xlabel("capacity (GB)")
      ax.set_ylabel(label)
      ax.set_title(t)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out_dir, fname)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    paths.append(path)
  return paths


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", default="results/ablate_capacity")
  p.add_argument("--traces", default="conversation,synthetic,chat")
  p.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
  p.add_argument("--limit", type=int, default=1000, help="requests per trace (0 = all)")
  p.add_argument("--block-size", type=int, default=None, help="core policies' block size")
  p.add_argument("--backend", default="reference", help="core policies: reference or jax")
  p.add_argument("--model", default="marconi_7b")
  args = p.parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  names = [t for t in args.traces.split(",") if t]
  traces = load_traces(names, args.limit or None)
  caps = {t: DEFAULT_CAPACITIES[t] for t in names}
  t0 = time.perf_counter()
  recs = run_ablation(
    traces,
    caps,
    [x for x in args.policies.split(",") if x],
    args.model,
    args.block_size,
    args.backend,
  )
  with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
    json.dump({"args": vars(args), "records": recs}, f, indent=1)
  for path in plot(recs, args.out):
    print("wrote", path)
  print(f"done in {time.perf_counter() - t0:.1f} s -> {args.out}/results.json")


if __name__ == "__main__":
  main()
