"""Simulator speed and hit rates on a full Mooncake trace and a 10k-request synthetic chat trace.

  python -m experiments.bench_sim [--trace FILE] [--capacities 1e10,4e10,8e10]
      [--core vllm_default,flop_aware,...] [--backend jax] [--core-block-size 512]
      [--chat-requests 10000]
      [--compat / --no-compat]

Prints one line per (trace, capacity, policy): replay wall seconds (trace parsing excluded;
for core policies JAX compilation included: the first replay of a config in this process, with
the persistent compilation cache as found, see `cache` in the header), requests/s, input
tokens/s, token hit rate, fraction of the infinite-cache oracle at the same block size, states
admitted / evicted (core counters) and the scan's scheduler steps; the tuned alpha for
marconi_compat. Core policies run through `hybrid_cache.sim.core_sim.replay` (backend jax = one
jitted lax.scan per chunk of requests, `core_scan.py`). Single process, wall clock
(time.perf_counter), plus the process CPU seconds of each replay (`cpu_s`), since this machine
is shared.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from hybrid_cache import persistent_cache
from hybrid_cache.sim import synthetic
from hybrid_cache.sim import trace as trace_lib
from hybrid_cache.sim.cost_model import get_model
from hybrid_cache.sim.oracle import oracle_reused
from hybrid_cache.sim.policies import CORE_POLICIES
from hybrid_cache.sim.simulate import simulate

POLICIES = (
  "oracle",
  "marconi_compat_sglang",
  "marconi_compat_static:0",
  "marconi_compat_static:1",
  "marconi_compat",
  "marconi_compat_vllm",
)


def _run(trace, model, cap, pol, block_size, core, oracle):
  c0 = time.process_time()
  triples, extra = simulate(trace, model, cap, pol, block_size, core=core)
  cpu = time.process_time() - c0
  reused = sum(t[2] for t in triples)
  w = extra["wall_s"]
  frac = f"{reused / oracle:9.3f}" if oracle else f"{'-':>9}"
  label = pol if core is None else f"{pol} ({core['backend']}, B={block_size})"
  adm = extra.get("states_admitted", "")
  ev = extra.get("states_evicted", "")
  print(
    f"{cap:9.0e} {label:<36} {w:7.2f} {cpu:7.2f} {len(triples) / w:8.0f} "
    f"{trace.input_tokens / w / 1e6:7.2f} {reused / trace.input_tokens:7.4f} {frac} "
    f"{adm!s:>8} {ev!s:>8} {extra.get('steps', '')!s:>7} {extra.get('tuned_alpha', '')}",
    flush=True,
  )
  return reused


HEADER = (
  f"{'capacity':>9} {'policy':<36} {'wall_s':>7} {'cpu_s':>7} {'req/s':>8} {'Mtok/s':>7} "
  f"{'hit':>7} {'of_oracle':>9} {'st_adm':>8} {'st_evict':>8} {'steps':>7} alpha"
)


def _cores(trace, model, cap, pols, backend, block_size, oracle):
  for pol in pols:
    try:
      _run(trace, model, cap, pol, block_size, {"backend": backend}, oracle)
    except ValueError as e:
      print(f"{cap:9.0e} {pol}: skipped ({e})", flush=True)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--trace", default="experiments/traces/mooncake_conversation_trace.jsonl")
  p.add_argument("--capacities", default="1e10,4e10,8e10")
  p.add_argument("--model", default="marconi_7b")
  p.add_argument("--core", default=",".join(CORE_POLICIES), help="core policies ('' = none)")
  p.add_argument("--backend", default="jax", help="core backend: jax, jax_protocol, reference")
  p.add_argument("--core-block-size", type=int, default=512)
  p.add_argument("--chat-requests", type=int, default=10_000, help="0 = skip the chat trace")
  p.add_argument("--chat-block-size", type=int, default=128)
  p.add_argument("--chat-capacity", type=float, default=5e9)
  p.add_argument("--no-compat", action="store_true", help="skip the marconi_compat policies")
  p.add_argument("--no-mooncake", action="store_true", help="skip the Mooncake trace")
  args = p.parse_args()
  cache = persistent_cache.enable()
  model = get_model(args.model)
  cores = [c for c in args.core.split(",") if c]
  print(
    f"{platform.processor() or 'cpu'}, {os.cpu_count()} cpus, load {os.getloadavg()}, "
    f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, cache {cache} "
    f"({len(os.listdir(cache)) if os.path.isdir(cache) else 0} entries)",
    flush=True,
  )
  if args.chat_requests:
    chat = synthetic.chat(seed=0, num_sessions=args.chat_requests // 10 + 100)
    chat = chat.head(args.chat_requests)
    print(f"synthetic chat: {len(chat)} requests, {chat.input_tokens} input tokens")
    print(HEADER)
    if not args.no_compat:
      o = int(oracle_reused(chat, 1).sum())
      for pol in ("marconi_compat_sglang", "marconi_compat_static:1", "marconi_compat_vllm"):
        _run(chat, model, args.chat_capacity, pol, None, None, o)
    ob = int(oracle_reused(chat, args.chat_block_size).sum())
    _cores(chat, model, args.chat_capacity, cores, args.backend, args.chat_block_size, ob)
  if args.no_mooncake:
    return
  t0 = time.perf_counter()
  trace = trace_lib.load_mooncake(args.trace)
  print(
    f"trace {os.path.basename(args.trace)}: {len(trace)} requests, {trace.input_tokens} input "
    f"tokens, parsed in {time.perf_counter() - t0:.2f} s"
  )
  print(HEADER)
  oracle = int(oracle_reused(trace, 1).sum())
  ob = int(oracle_reused(trace, args.core_block_size).sum())
  for cap in (float(c) for c in args.capacities.split(",")):
    if not args.no_compat:
      for pol in POLICIES:
        _run(trace, model, cap, pol, None, None, oracle)
    _cores(trace, model, cap, cores, args.backend, args.core_block_size, ob)


if __name__ == "__main__":
  main()
