"""Compile cost and memory of many different cache configs in ONE process (issue 13).

Builds N scenario configs that all differ (pool size, block sizes, group mix, windows,
retention, token budget, watermark, full-sequence gate, max_model_len), replays one small
scenario per config through `hybrid_cache.replay.replay.replay(sc, backend="jax")` and reports per
config: the process's memory mappings (`/proc/self/maps` lines), RSS (`VmRSS` of
`/proc/self/status`), wall seconds and XLA compilations.

Compilations are counted with a JAX monitoring listener on
`/jax/core/compile/backend_compile_duration` (`jax._src.dispatch.BACKEND_COMPILE_EVENT`): JAX
records it once around every backend compile of a lowered program (jitted functions and the
small programs of eager ops alike), whether or not a persistent compilation cache serves it.
That is more robust than parsing `jax_log_compiles` log lines (format and logger names change
between versions).

  python -m experiments.bench_compile [--num-configs 50] [--vary all|dynamic]
      [--scenarios tests/hybrid_cache/scenarios] [--max-live K] [--report 10,50] [--json OUT.json]

`--vary all` (default) changes the static structure too (groups, block sizes, windows), so
most configs need their own programs; `--vary dynamic` keeps one model (full + swa + mamba,
block 4, window 8) and changes only pool size, token budget, watermark, full-sequence gate,
retention and max_model_len: a sweep of one model's serving settings.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import jax

from hybrid_cache.config import CacheConfig
from hybrid_cache.replay import replay as replay_lib
from hybrid_cache.replay import scenario as scenario_lib

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileCounter:
  """Counts backend compilations (and their seconds) through a JAX monitoring listener."""

  def __init__(self):
    self.count = 0
    self.seconds = 0.0
    jax.monitoring.register_event_duration_secs_listener(self._on_event)

  def _on_event(self, event: str, duration: float, **kwargs) -> None:
    del kwargs
    if event == COMPILE_EVENT:
      self.count += 1
      self.seconds += duration

  def close(self) -> None:
    jax.monitoring.unregister_event_duration_listener(self._on_event)


def num_maps() -> int:
  """Lines of /proc/self/maps: the process's memory mappings (the kernel caps them at
  vm.max_map_count, 65,530 by default)."""
  with open("/proc/self/maps") as f:
    return sum(1 for _ in f)


def rss_mib() -> float:
  """Resident set size (VmRSS of /proc/self/status) in MiB."""
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024.0
  return float("nan")


def make_config_dict(i: int) -> dict:
  """The i-th config of the sweep (all different; every field below varies with i).

  Group mixes: full; full+swa; full+mamba; full+swa+mamba; swa+mamba; block sizes 2, 4, 8
  (a few with a mixed per-group size); retention None / 0 / k * scheduler block; the other
  fields cycle with coprime periods, and num_blocks grows with i so no two configs are equal.
  """
  bs = (2, 4, 8)[i % 3]
  mix = i % 5
  window = bs * (1 + (i // 5) % 4) + (i % 2)  # 1..4 blocks, sometimes not block aligned
  groups: list[dict] = []
  if mix in (0, 1, 2, 3):
    groups.append({"type": "full"})
  if mix in (1, 3, 4):
    groups.append({"type": "swa", "window": window})
  if mix in (2, 3, 4):
    m: dict = {"type": "mamba"}
    if mix == 2 and i % 7 == 0:
      m["block_size"] = 2 * bs  # mixed sizes: scheduler block 2 * bs, partial hits
    groups.append(m)
  sbs = 2 * bs if any(g.get("block_size") for g in groups) else bs
  ret = (None, 0, sbs, 2 * sbs, 4 * sbs)[(i // 3) % 5]
  if mix == 0:
    ret = None  # retention needs a swa or mamba group
  cfg = {
    "block_size": bs,
    "num_blocks": 48 + i,
    "groups": groups,
    "retention_interval": ret,
    "max_num_batched_tokens": (16, 24, 64, 8192)[i % 4],
    "watermark": (0.0, 0.01, 0.05)[i % 3],
    "full_sequence_must_fit": bool(i % 2),
    "max_model_len": (128, 200, 512, 1000, 4096)[i % 5],
  }
  return cfg


def make_dynamic_config_dict(i: int) -> dict:
  """The i-th config of a sweep of one model's serving settings (all different)."""
  return {
    "block_size": 4,
    "num_blocks": 48 + 3 * i,
    "groups": [{"type": "full"}, {"type": "swa", "window": 8}, {"type": "mamba"}],
    "retention_interval": (None, 0, 4, 8, 16)[i % 5],
    "max_num_batched_tokens": (8, 16, 24, 64, 8192)[(i // 5) % 5],
    "watermark": (0.0, 0.01, 0.05)[i % 3],
    "full_sequence_must_fit": bool(i % 2),
    "max_model_len": (64, 100, 128, 200, 256, 512)[i % 6],
  }


def make_scenario(i: int, vary: str = "all") -> dict:
  """Two requests sharing a 24-token prefix: prefill A, prefill B, free both, lookup A."""
  cfg = make_config_dict(i) if vary == "all" else make_dynamic_config_dict(i)
  CacheConfig.from_dict(cfg)  # validate here: a bad config names its index
  return {
    "name": f"bench_{i:04d}",
    "description": "bench_compile",
    "config": cfg,
    "prompts": {
      "A": {"range": [0, 40]},
      "B": {"concat": [{"range": [0, 24]}, {"range": [500, 517]}]},
    },
    "actions": [
      {"op": "prefill", "req": "A"},
      {"op": "prefill", "req": "B"},
      {"op": "free", "req": "A"},
      {"op": "free", "req": "B"},
      {"op": "lookup", "req": "A"},
      {"op": "state"},
    ],
  }


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="python -m experiments.bench_compile", description=__doc__)
  ap.add_argument("--num-configs", type=int, default=50)
  ap.add_argument("--vary", choices=("all", "dynamic"), default="all")
  ap.add_argument("--max-live", type=int, default=None, help="compile-key registry capacity")
  ap.add_argument("--scenarios", default=None, help="replay these scenario files/dirs first")
  ap.add_argument("--report", default="10,50,100,200,300,400,500", help="configs to report at")
  ap.add_argument("--every", type=int, default=0, help="also print every k-th config (0: off)")
  ap.add_argument("--json", default=None, help="write all per-config rows to this file")
  args = ap.parse_args(argv)
  report = {int(x) for x in args.report.split(",") if x}
  try:
    from hybrid_cache.core import compile_cache  # noqa: PLC0415 - absent before issue 13
  except ImportError:
    compile_cache = None
  if args.max_live is not None and compile_cache is not None:
    compile_cache.set_max_live_keys(args.max_live)
  counter = CompileCounter()
  print(
    f"jax {jax.__version__} backend {jax.default_backend()} pid {os.getpid()} "
    f"load {os.getloadavg()[0]:.2f}",
    flush=True,
  )
  print(f"start: maps {num_maps()} rss {rss_mib():.0f} MiB", flush=True)
  if args.scenarios:
    files = replay_lib._expand([args.scenarios])  # noqa: SLF001 - the CLI's own expansion
    t0, c0 = time.perf_counter(), counter.count
    for path in files:
      replay_lib.replay(scenario_lib.load(path), backend="jax")
    print(
      f"scenarios: {len(files)} files, {counter.count - c0} compilations, "
      f"{time.perf_counter() - t0:.1f} s, maps {num_maps()} rss {rss_mib():.0f} MiB",
      flush=True,
    )
  rows = []
  t_all, c_all = time.perf_counter(), counter.count
  print("config  maps     rss_MiB  seconds  compiles  compile_s", flush=True)
  for i in range(args.num_configs):
    sc = make_scenario(i, args.vary)
    c0, s0 = counter.count, counter.seconds
    t0 = time.perf_counter()
    replay_lib.replay(sc, backend="jax")
    dt = time.perf_counter() - t0
    gc.collect()
    row = dict(
      config=i + 1,
      maps=num_maps(),
      rss_mib=round(rss_mib(), 1),
      seconds=round(dt, 3),
      compiles=counter.count - c0,
      compile_s=round(counter.seconds - s0, 3),
    )
    rows.append(row)
    if (i + 1) in report or (args.every and (i + 1) % args.every == 0) or i == 0:
      print(
        f"{row['config']:6d}  {row['maps']:7d}  {row['rss_mib']:7.0f}  {row['seconds']:7.2f}"
        f"  {row['compiles']:8d}  {row['compile_s']:9.2f}",
        flush=True,
      )
  n = len(rows)
  if n:
    total = time.perf_counter() - t_all
    print(
      f"total: {n} configs, {counter.count - c_all} compilations, {total:.1f} s "
      f"({total / n:.2f} s/config), final maps {num_maps()} rss {rss_mib():.0f} MiB, "
      f"load {os.getloadavg()[0]:.2f}",
      flush=True,
    )
  if compile_cache is not None:
    print(
      f"registry: {len(compile_cache.live_keys())} live keys (max {compile_cache.max_live_keys()})"
      f", {compile_cache.evictions()} evictions",
      flush=True,
    )
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=0)
  counter.close()
  return 0


if __name__ == "__main__":
  sys.exit(main())
