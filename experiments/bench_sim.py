"""Simulator speed and hit rates on a full Mooncake trace and a 10k-request synthetic chat trace.

  python -m experiments.bench_sim [--trace FILE] [--capacities 1e10,4e10,8e10]
      [--core lru:reference,lru:jax] [--core-block-size 512] [--chat-requests 10000]

Prints one line per (capacity, policy): requests/s and input tokens/s of the replay loop only
(trace parsing excluded), token hit rate, fraction of the infinite-cache oracle, and the tuned
alpha for marconi_compat. Core policies (`--core POLICY:BACKEND,...`) run through the
CacheManager protocol (`hybrid_cache.sim.core_sim`); their wall time includes the jitted
core's compilation (jax backend), reported separately on a 1-request warm-up. Single process,
wall clock (time.perf_counter).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from hybrid_cache.sim import core_sim
from hybrid_cache.sim import synthetic
from hybrid_cache.sim import trace as trace_lib
from hybrid_cache.sim.cli import simulate
from hybrid_cache.sim.cost_model import get_model
from hybrid_cache.sim.oracle import oracle_reused

POLICIES = (
  "oracle",
  "marconi_compat_sglang",
  "marconi_compat_static:0",
  "marconi_compat_static:1",
  "marconi_compat",
  "marconi_compat_vllm",
)


def _run(trace, model, cap, pol, block_size, core, oracle):
  triples, extra = simulate(trace, model, cap, pol, block_size, core=core)
  reused = sum(t[2] for t in triples)
  w = extra["wall_s"]
  frac = f"{reused / oracle:9.3f}" if oracle else f"{'-':>9}"
  label = pol if core is None else f"{pol} ({core['backend']}, B={block_size})"
  print(
    f"{cap:9.0e} {label:<34} {w:7.2f} {len(triples) / w:8.0f} "
    f"{trace.input_tokens / w / 1e6:7.2f} {reused / trace.input_tokens:7.4f} {frac} "
    f"{extra.get('tuned_alpha', '')}",
    flush=True,
  )
  return reused


def _core(trace, model, cap, spec, block_size, oracle):
  pol, backend = spec.split(":")
  core = {"backend": backend}
  if backend == "jax":  # compile once on a 1-request trace with the same shapes
    t0 = time.perf_counter()
    cfg, _ = core_sim.build_config(trace, model, cap, pol, block_size)
    core_sim.run_core(trace.head(1), cfg, backend)
    print(f"{'':9} {pol} (jax): warm-up incl. compile {time.perf_counter() - t0:.1f} s")
  _run(trace, model, cap, pol, block_size, core, oracle)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--trace", default="experiments/traces/mooncake_conversation_trace.jsonl")
  p.add_argument("--capacities", default="1e10,4e10,8e10")
  p.add_argument("--model", default="marconi_7b")
  p.add_argument("--core", default="lru:reference,lru:jax", help="POLICY:BACKEND,... ('' = none)")
  p.add_argument("--core-block-size", type=int, default=512)
  p.add_argument("--chat-requests", type=int, default=10_000, help="0 = skip the chat trace")
  args = p.parse_args()
  model = get_model(args.model)
  cores = [c for c in args.core.split(",") if c]
  if args.chat_requests:
    chat = synthetic.chat(seed=0, num_sessions=args.chat_requests // 10 + 100)
    chat = chat.head(args.chat_requests)
    o = int(oracle_reused(chat, 1).sum())
    print(f"synthetic chat: {len(chat)} requests, {chat.input_tokens} input tokens")
    for pol in ("marconi_compat_sglang", "marconi_compat_static:1", "marconi_compat_vllm"):
      _run(chat, model, 5e9, pol, None, None, o)
    ob = int(oracle_reused(chat, 128).sum())
    for spec in cores:
      _core(chat, model, 5e9, spec, 128, ob)
  t0 = time.perf_counter()
  trace = trace_lib.load_mooncake(args.trace)
  print(
    f"trace {os.path.basename(args.trace)}: {len(trace)} requests, {trace.input_tokens} input "
    f"tokens, parsed in {time.perf_counter() - t0:.2f} s; {platform.processor() or 'cpu'}, "
    f"{os.cpu_count()} cpus"
  )
  print(
    f"{'capacity':>9} {'policy':<34} {'wall_s':>7} {'req/s':>8} {'Mtok/s':>7} "
    f"{'hit':>7} {'of_oracle':>9} alpha"
  )
  oracle = None
  for cap in (float(c) for c in args.capacities.split(",")):
    for pol in POLICIES:
      reused = _run(trace, model, cap, pol, None, None, oracle)
      if pol == "oracle":
        oracle = reused
    ob = int(oracle_reused(trace, args.core_block_size).sum())
    for spec in cores:
      try:
        _core(trace, model, cap, spec, args.core_block_size, ob)
      except ValueError as e:
        print(f"{cap:9.0e} {spec}: skipped ({e})")


if __name__ == "__main__":
  main()
