"""Simulator speed and hit rates of the marconi_compat policies on a full Mooncake trace.

  python -m experiments.bench_sim [--trace FILE] [--capacities 1e10,4e10,8e10]

Prints one line per (capacity, policy): requests/s and input tokens/s of the replay loop only
(trace parsing excluded), token hit rate, fraction of the infinite-cache oracle, and the tuned
alpha for marconi_compat. Single process, wall clock (time.perf_counter).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from hybrid_cache.sim import trace as trace_lib
from hybrid_cache.sim.cli import simulate
from hybrid_cache.sim.cost_model import get_model

POLICIES = (
  "oracle",
  "marconi_compat_sglang",
  "marconi_compat_static:0",
  "marconi_compat_static:1",
  "marconi_compat",
)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--trace", default="../shared/traces/mooncake_conversation_trace.jsonl")
  p.add_argument("--capacities", default="1e10,4e10,8e10")
  p.add_argument("--model", default="marconi_7b")
  args = p.parse_args()
  t0 = time.perf_counter()
  trace = trace_lib.load_mooncake(args.trace)
  print(
    f"trace {os.path.basename(args.trace)}: {len(trace)} requests, {trace.input_tokens} input "
    f"tokens, parsed in {time.perf_counter() - t0:.2f} s; {platform.processor() or 'cpu'}, "
    f"{os.cpu_count()} cpus"
  )
  model = get_model(args.model)
  print(
    f"{'capacity':>9} {'policy':<26} {'wall_s':>7} {'req/s':>8} {'Mtok/s':>7} "
    f"{'hit':>7} {'of_oracle':>9} alpha"
  )
  oracle = None
  for cap in (float(c) for c in args.capacities.split(",")):
    for pol in POLICIES:
      triples, extra = simulate(trace, model, cap, pol)
      reused = sum(t[2] for t in triples)
      if pol == "oracle":
        oracle = reused
      w = extra["wall_s"]
      frac = f"{reused / oracle:9.3f}" if oracle else f"{'-':>9}"
      print(
        f"{cap:9.0e} {pol:<26} {w:7.2f} {len(triples) / w:8.0f} "
        f"{trace.input_tokens / w / 1e6:7.1f} {reused / trace.input_tokens:7.4f} {frac} "
        f"{extra.get('tuned_alpha', '')}"
      )


if __name__ == "__main__":
  main()
