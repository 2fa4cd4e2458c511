"""Benchmark of the jitted cache core.

1. Batched admissions (lookup + split + allocate + cache) through `JaxCacheManager.schedule`
   vs `PythonCacheManager.schedule` on the same requests, at batch sizes 1, 16 and 64: µs per
   request and the ratio. Hashing (host, identical for both) is excluded.
2. 10k admissions as one `lax.scan` over the jitted step vs a Python loop of jitted, donated
   calls (each admission preempts the request again so the pool is stationary).

  PYTHONPATH=. python -m experiments.bench_scheduler [--rounds 6] [--scan_steps 10000]
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.core import release
from hybrid_cache.core import scheduler
from hybrid_cache.core.layout import layout
from hybrid_cache.factory import make_manager
from hybrid_cache.types import ScheduleEntry


def make_config(max_requests: int) -> CacheConfig:
  return CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("swa", window=64), GroupSpec("mamba")),
    block_size=16,
    num_blocks=4096,
    max_model_len=512,
    max_num_batched_tokens=64 * 512,
    max_requests=max_requests,
  )


def make_prompts(n: int, seed: int) -> list[list[int]]:
  """Requests from 8 shared-prefix families (prefix 64-256 tokens) plus a unique suffix."""
  rng = np.random.default_rng(seed)
  fams = [rng.integers(0, 30000, size=256).tolist() for _ in range(8)]
  out = []
  for i in range(n):
    f = fams[rng.integers(0, 8)]
    cut = int(rng.integers(64, 257))
    suffix = rng.integers(0, 30000, size=int(rng.integers(16, 200))).tolist()
    out.append(f[:cut] + suffix + [i])
  return out


def time_batches(manager, prompts, batch: int, rounds: int) -> tuple[float, float]:
  """(wall, process CPU) µs per entry: add `batch` requests, ONE schedule call (timed), free them.

  Process CPU time (all threads of this process) is far less sensitive to other jobs on a
  shared machine than wall time; both are reported.
  """
  total, cpu, count = 0.0, 0.0, 0
  for r in range(rounds + 1):  # round 0 warms up (compiles)
    names = [f"r{r}_{i}" for i in range(batch)]
    for i, name in enumerate(names):
      manager.add_request(name, prompts[(r * batch + i) % len(prompts)])
    entries = [ScheduleEntry(n) for n in names]
    c0, t0 = time.process_time(), time.perf_counter()
    res = manager.schedule(entries)
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    # same-family requests in one step can be deferred by the same-step rule (both backends)
    assert any(e.scheduled_tokens > 0 for e in res.entries)
    if r:
      total += dt
      cpu += dc
      count += batch
    for name in names:
      manager.free(name)
  return 1e6 * total / count, 1e6 * cpu / count


def bench_batches(rounds: int) -> list[tuple[int, float, float, float, float]]:
  rows = []
  prompts = make_prompts(512, seed=0)
  for batch in (1, 16, 64):
    cfg = make_config(max_requests=max(batch, 1))
    # reference first, each after a full GC: the jitted run leaves ~50k more live Python objects
    # (tracing caches) that made later pure-Python timings up to 2x slower in the same process
    gc.collect()
    ref_us, ref_cpu = time_batches(make_manager(cfg, "reference"), prompts, batch, rounds)
    gc.collect()
    jit_us, jit_cpu = time_batches(make_manager(cfg, "jax"), prompts, batch, rounds)
    rows.append((batch, jit_us, ref_us, jit_cpu, ref_cpu))
    print(
      f"batch {batch:3d}: jitted {jit_us:9.1f} us/request  reference {ref_us:9.1f} us/request"
      f"  reference/jitted {ref_us / jit_us:5.2f}x  | CPU time: jitted {jit_cpu:7.1f}"
      f" reference {ref_cpu:7.1f}  ratio {ref_cpu / jit_cpu:5.2f}x",
      flush=True,
    )
  return rows


def _admit_and_preempt(config, state, slot):
  state, out = scheduler.admit_one(config, state, slot, jnp.int32(-1))
  state = release.release(layout(config), state, slot, preempt=True)
  return state, out["scheduled"]


@functools.partial(jax.jit, static_argnames=("config",), donate_argnums=(1,))
def _scan(config, state, slots):
  return jax.lax.scan(functools.partial(_admit_and_preempt, config), state, slots)


@functools.partial(jax.jit, static_argnames=("config",), donate_argnums=(1,))
def _one(config, state, slot):
  return _admit_and_preempt(config, state, slot)


def bench_scan(steps: int) -> tuple[float, float]:
  cfg = make_config(max_requests=64)
  m = make_manager(cfg, "jax")
  for i, p in enumerate(make_prompts(64, seed=1)):
    m.add_request(f"s{i}", p)
  slots = np.arange(steps, dtype=np.int32) % 64
  # scan: warm up with the same shape (compile), then time a second run
  state = m.state
  state, _ = _scan(cfg, state, jnp.asarray(slots))
  jax.block_until_ready(state)
  t0 = time.perf_counter()
  state, sched = _scan(cfg, state, jnp.asarray(slots))
  jax.block_until_ready(sched)
  scan_us = 1e6 * (time.perf_counter() - t0) / steps
  assert int(np.asarray(sched).min()) > 0
  # python loop of jitted calls
  state, _ = _one(cfg, state, np.int32(0))
  jax.block_until_ready(state)
  t0 = time.perf_counter()
  for s in slots:
    state, _ = _one(cfg, state, np.int32(s))
  jax.block_until_ready(state)
  loop_us = 1e6 * (time.perf_counter() - t0) / steps
  print(
    f"{steps} admissions: lax.scan {scan_us:8.1f} us/admission  python loop of jitted calls "
    f"{loop_us:8.1f} us/admission  loop/scan {loop_us / scan_us:5.2f}x",
    flush=True,
  )
  return scan_us, loop_us


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=6)
  parser.add_argument("--scan_steps", type=int, default=10000)
  args = parser.parse_args(argv)
  print("command: PYTHONPATH=. python -m experiments.bench_scheduler " + " ".join(sys.argv[1:]))
  print(f"jax {jax.__version__}, backend {jax.default_backend()}, {platform.processor() or ''}")
  print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
  bench_batches(args.rounds)
  bench_scan(args.scan_steps)
  print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
