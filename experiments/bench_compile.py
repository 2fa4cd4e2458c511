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

  python -m experiments.bench_compile [--num-configs 50] [--vary all|dynamic|families]
      [--scenarios tests/hybrid_cache/scenarios] [--max-live K] [--report 10,50] [--json OUT.json]
      [--seed S] [--trees before=PATH,after=PATH]

`--vary all` (default) changes the static structure too (groups, block sizes, windows), so
most configs need their own programs; `--vary dynamic` keeps one model (full + swa + mamba,
block 4, window 8) and changes only pool size, token budget, watermark, full-sequence gate,
retention and max_model_len: a sweep of one model's serving settings. `--vary families` replays
the differential generator's scenarios (`tests/hybrid_cache/vllm_diff/generator.py`, seeds
`--seed` on): configurations drawn from its compile families (group structure and block sizes
fixed per family, pool size, token budget, retention, watermark, windows of some families and
`max_model_len` drawn per scenario), as a suite or a notebook sweep meets them.

Per configuration it also replays the same scenario a second time: `new_s` = first - second
replay, the seconds the new configuration cost beyond running it (compiling, tracing,
loading). The summary gives its median, mean and 90th percentile.

`--trees name=PATH,...` runs this benchmark (same arguments) once per source tree, each in its
own processes with that tree's `hybrid_cache` (e.g. a `git worktree` of the commit before a
change), twice each: with an empty persistent compilation cache ("cold") and again with the
cache the cold run wrote ("warm"), and prints the summaries side by side.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import jax

from hybrid_cache.config import CacheConfig
from hybrid_cache.replay import replay as replay_lib
from hybrid_cache.replay import scenario as scenario_lib

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


FIELD_BASE = {
  "block_size": 4,
  "num_blocks": 60,
  "groups": [{"type": "full"}, {"type": "swa", "window": 7}, {"type": "mamba"}],
  "max_num_batched_tokens": 8192,
  "max_model_len": 128,
}


def _with_groups(*groups: dict) -> dict:
  return {"groups": list(groups)}


# (static field, what changes from FIELD_BASE); each changes one field of the compile key
# (`compile_cache.compile_key`), but the first two, which are runtime parameters (controls)
FIELD_VARIANTS: tuple[tuple[str, dict], ...] = (
  (
    "(runtime) retention_interval, watermark, budget",
    {"retention_interval": 8, "watermark": 0.1, "max_num_batched_tokens": 16},
  ),
  ("(bucket) num_blocks 60 -> 50", {"num_blocks": 50}),
  ("num_blocks bucket 64 -> 128", {"num_blocks": 100}),
  ("max_model_len bucket (table width 32 -> 64)", {"max_model_len": 200}),
  ("max_requests 64 -> 128", {"max_requests": 128}),
  ("block_size 4 -> 8", {"block_size": 8}),
  (
    "window 7 -> 9",
    _with_groups({"type": "full"}, {"type": "swa", "window": 9}, {"type": "mamba"}),
  ),
  (
    "a second swa group",
    _with_groups(
      {"type": "full"},
      {"type": "swa", "window": 7},
      {"type": "swa", "window": 3},
      {"type": "mamba"},
    ),
  ),
  ("group kinds (no swa)", _with_groups({"type": "full"}, {"type": "mamba"})),
  (
    "recurrent mode all",
    _with_groups({"type": "full"}, {"type": "swa", "window": 7}, {"type": "mamba", "mode": "all"}),
  ),
  (
    "partial hits (mamba block 8)",
    _with_groups(
      {"type": "full"}, {"type": "swa", "window": 7}, {"type": "mamba", "block_size": 8}
    ),
  ),
  (
    "fine_keys (hash block 2)",
    {
      "fine_keys": True,
      "hash_block_size": 2,
      **_with_groups(
        {"type": "full"}, {"type": "swa", "window": 7, "block_size": 2}, {"type": "mamba"}
      ),
    },
  ),
  (
    "eviction flop_aware",
    {
      "eviction": "flop_aware",
      "eviction_flops_linear": (1.0, 1.0, 1.0),
      "eviction_flops_quadratic": (0.0, 0.0, 0.0),
      "eviction_block_bytes": (1.0, 1.0, 1.0),
    },
  ),
  ("eviction chain_value", {"eviction": "chain_value"}),
  ("placement junctions", {"placement": "junctions"}),
  ("admission second_sighting", {"admission": "second_sighting"}),
  ("retention state_chain (+ pinning)", {"retention": "state_chain", "pinning": True}),
  ("pinning", {"pinning": True}),
  ("speculative tokens 2", {"num_speculative_tokens": 2}),
  ("state_slots (second pool)", {"state_slots": 16}),
  ("prefix caching off", {"enable_prefix_caching": False}),
)


def field_scenario(i: int) -> tuple[str, dict]:
  """`--vary fields`: (name, scenario) of FIELD_BASE (i = 0) or its (i - 1)-th variant."""
  name, change = ("base", {}) if i == 0 else FIELD_VARIANTS[i - 1]
  cfg = {**FIELD_BASE, **change}
  CacheConfig.from_dict(dict(cfg))
  sc = _two_requests(cfg)
  sc["name"] = f"field_{i:02d}"
  return name, sc


def make_scenario(i: int, vary: str = "all", seed: int = 0) -> dict:
  """`families`: the generator's scenario of seed `seed + i`. Else two requests sharing a
  24-token prefix: prefill A, prefill B, free both, lookup A."""
  if vary == "families":
    sys.path.insert(0, _REPO)  # the generator lives with the tests
    from tests.hybrid_cache.vllm_diff import generator  # noqa: PLC0415

    return generator.generate(seed + i)
  if vary == "fields":
    return field_scenario(i)[1]
  cfg = make_config_dict(i) if vary == "all" else make_dynamic_config_dict(i)
  CacheConfig.from_dict(cfg)  # validate here: a bad config names its index
  sc = _two_requests(cfg)
  sc["name"] = f"bench_{i:04d}"
  return sc


def _two_requests(cfg: dict) -> dict:
  return {
    "name": "bench",
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
  ap.add_argument("--vary", choices=("all", "dynamic", "families", "fields"), default="all")
  ap.add_argument("--seed", type=int, default=29_000_000, help="first seed (--vary families)")
  ap.add_argument("--trees", default=None, help="name=PATH,...: compare source trees (doc)")
  ap.add_argument(
    "--compile-cache",
    action="store_true",
    help="use JAX's persistent compilation cache ($HYBRID_CACHE_JAX_CACHE; default: none)",
  )
  ap.add_argument("--max-live", type=int, default=None, help="compile-key registry capacity")
  ap.add_argument("--scenarios", default=None, help="replay these scenario files/dirs first")
  ap.add_argument("--report", default="10,50,100,200,300,400,500", help="configs to report at")
  ap.add_argument("--every", type=int, default=0, help="also print every k-th config (0: off)")
  ap.add_argument("--json", default=None, help="write all per-config rows to this file")
  args = ap.parse_args(argv)
  if args.trees:
    return compare_trees(args, argv if argv is not None else sys.argv[1:])
  report = {int(x) for x in args.report.split(",") if x}
  if args.compile_cache:
    from hybrid_cache import persistent_cache  # noqa: PLC0415

    print(f"persistent compilation cache: {persistent_cache.enable()}", flush=True)
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
  print("config  maps     rss_MiB  seconds  new_s  compiles  compile_s", flush=True)
  num = len(FIELD_VARIANTS) + 1 if args.vary == "fields" else args.num_configs
  for i in range(num):
    sc = make_scenario(i, args.vary, args.seed)
    c0, s0 = counter.count, counter.seconds
    t0 = time.perf_counter()
    replay_lib.replay(sc, backend="jax")
    dt = time.perf_counter() - t0
    t1 = time.perf_counter()
    replay_lib.replay(sc, backend="jax")
    rerun = time.perf_counter() - t1
    gc.collect()
    row = dict(
      config=i + 1,
      maps=num_maps(),
      rss_mib=round(rss_mib(), 1),
      seconds=round(dt, 3),
      new_s=round(max(dt - rerun, 0.0), 3),
      compiles=counter.count - c0,
      compile_s=round(counter.seconds - s0, 3),
    )
    if args.vary == "fields":
      row["field"] = field_scenario(i)[0]
      print(
        f"  {row['field']:45s} new {row['new_s']:5.2f} s  {row['compiles']} programs "
        f"({row['compile_s']:.2f} s compiling)",
        flush=True,
      )
    rows.append(row)
    if (i + 1) in report or (args.every and (i + 1) % args.every == 0) or i == 0:
      print(
        f"{row['config']:6d}  {row['maps']:7d}  {row['rss_mib']:7.0f}  {row['seconds']:7.2f}"
        f"  {row['new_s']:5.2f}  {row['compiles']:8d}  {row['compile_s']:9.2f}",
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
    print("new config: " + format_summary(summarize(rows)), flush=True)
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


def summarize(rows: list[dict]) -> dict:
  """Median / mean / 90th percentile of `new_s`, configs that compiled, total wall."""
  new = sorted(r["new_s"] for r in rows)
  return dict(
    configs=len(rows),
    median_s=statistics.median(new),
    mean_s=statistics.fmean(new),
    p90_s=new[min(len(new) - 1, int(0.9 * len(new)))],
    compiled=sum(1 for r in rows if r["compiles"]),
    compiles=sum(r["compiles"] for r in rows),
    total_s=sum(r["seconds"] for r in rows),
  )


def format_summary(s: dict) -> str:
  return (
    f"median {s['median_s']:.3f} s, mean {s['mean_s']:.3f} s, p90 {s['p90_s']:.3f} s; "
    f"{s['compiled']} of {s['configs']} configs compiled ({s['compiles']} programs); "
    f"replays {s['total_s']:.1f} s"
  )


def _strip_trees(argv: list[str]) -> list[str]:
  out, skip = [], False
  for a in argv:
    if skip:
      skip = False
    elif a == "--trees":
      skip = True
    elif not a.startswith("--trees="):
      out.append(a)
  return out


def compare_trees(args, argv: list[str]) -> int:
  """`--trees`: this script, once per tree and cache state, in its own process (doc)."""
  trees = []
  for item in args.trees.split(","):
    name, sep, path = item.partition("=")
    if not sep or not os.path.isdir(os.path.join(path, "hybrid_cache")):
      print(f"--trees: {item!r} must be name=PATH of a source tree", file=sys.stderr)
      return 2
    trees.append((name, os.path.abspath(path)))
  base = [a for a in _strip_trees(argv) if not a.startswith(("--json", "--compile-cache"))]
  results = []
  for name, path in trees:
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as out:
      for state in ("cold", "warm"):
        rows_file = os.path.join(out, f"{state}.json")
        env = dict(os.environ, PYTHONPATH=path, HYBRID_CACHE_JAX_CACHE=cache)
        cmd = [sys.executable, os.path.abspath(__file__), *base, "--compile-cache"]
        cmd += ["--json", rows_file]
        print(f"== {name} ({path}), persistent cache {state}", flush=True)
        proc = subprocess.run(cmd, cwd=path, env=env, check=False)
        if proc.returncode:
          print(f"{name} {state}: exit {proc.returncode}", file=sys.stderr)
          return proc.returncode
        with open(rows_file) as f:
          results.append((name, state, summarize(json.load(f))))
  print("\ntree    cache  seconds per new configuration")
  for name, state, s in results:
    print(f"{name:7s} {state:5s}  {format_summary(s)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
