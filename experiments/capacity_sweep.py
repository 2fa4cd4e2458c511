"""Capacity sweep of one checkpoint policy in one replay (issue 15): hit rate and FLOPs saved
against capacity.

`hybrid_cache.sim.checkpoint_policies.sweep_checkpoint` replays the trace once for all
capacities (the trie walk, unit hashes and candidate points shared; one set of caches per
capacity), so every point equals its own `python -m hybrid_cache.sim ... --capacity-bytes C`
run. Capacities are `num_points` log-spaced values in [cap_min, cap_max] unless `capacities`
lists them. Writes `sweep.png` (token hit rate and FLOPs saved vs capacity) into the workdir;
a tqdm bar counts requests.

  python -m experiments.run --gin_file=configs/experiments/capacity_sweep.gin
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue as queue_lib
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments import plotting
from hybrid_cache.sim import synthetic
from hybrid_cache.sim import trace as trace_lib
from hybrid_cache.sim.checkpoint_policies import sweep_checkpoint
from hybrid_cache.sim.cost_model import get_model
from hybrid_cache.sim.metrics import summarize
from hybrid_cache.sim.simulate import check_capacity

POINT_FIELDS = ("states_admitted", "states_evicted", "final_cache_bytes", "weighting")


def _sweep_part(args):
  trace, model, caps, policy, unit, block_size, queue = args
  progress = None
  if queue is not None:
    done = [0]

    def progress(n: int) -> None:  # requests replayed, reported every 64 and at the end
      if n - done[0] >= 64 or n == len(trace):
        queue.put(n - done[0])
        done[0] = n

  return sweep_checkpoint(
    trace, get_model(model), caps, policy, unit, block_size, progress=progress
  )


def default_processes(num_points: int) -> int:
  """The CPUs this process may run on, at most one per capacity."""
  return max(1, min(len(os.sched_getaffinity(0)), num_points))


def sweep_in_processes(
  trace: trace_lib.Trace,
  model: str,
  capacities: Sequence[float],
  policy: str,
  unit: int,
  block_size: int,
  processes: int,
  progress: Callable[[int], None] | None = None,
) -> list:
  """`sweep_checkpoint` with the capacities dealt round-robin to `processes` spawned workers
  (each repeats the shared trie walk for its share). Same results, in the order of
  `capacities`: a point depends only on its own caches (`sweep_checkpoint`).

  `progress`: called in this process with the number of requests replayed since its last
  call, summed over the workers (each replays the whole trace: len(trace) * workers in all).
  """
  if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
    raise ValueError(f"processes must be an integer >= 1, got {processes!r}")
  caps = list(capacities)
  parts = [caps[i::processes] for i in range(min(processes, len(caps)))]
  ctx = multiprocessing.get_context("spawn")  # never fork a process that may hold JAX
  with ctx.Manager() as manager, ctx.Pool(len(parts)) as pool:
    queue = manager.Queue() if progress is not None else None
    args = [(trace, model, p, policy, unit, block_size, queue) for p in parts]
    pending = pool.map_async(_sweep_part, args)
    while queue is not None and not pending.ready():
      with contextlib.suppress(queue_lib.Empty):
        progress(queue.get(timeout=0.2))
    done = pending.get()
    while queue is not None and not queue.empty():
      progress(queue.get())
  out = [None] * len(caps)
  for i, res in enumerate(done):
    out[i :: len(parts)] = res
  return out


def capacity_grid(cap_min: float, cap_max: float, num_points: int) -> list[float]:
  """`num_points` log-spaced capacities from cap_min to cap_max (ValueError on bad input)."""
  if isinstance(num_points, bool) or not isinstance(num_points, int) or num_points < 1:
    raise ValueError(f"num_points must be an integer >= 1, got {num_points!r}")
  if not (0 < cap_min <= cap_max and np.isfinite(cap_max)):
    raise ValueError(
      f"cap_min and cap_max must satisfy 0 < cap_min <= cap_max < inf, got {cap_min!r}, {cap_max!r}"
    )
  return [float(c) for c in np.geomspace(cap_min, cap_max, num_points)]


def load_trace(
  trace: str, fmt: str, seed: int = 0, limit: int | None = None, params: Mapping | None = None
) -> trace_lib.Trace:
  """A trace file of `fmt` (mooncake, marconi) or synthetic generator `trace` at `seed`."""
  if fmt == "synthetic":
    t = synthetic.generate(trace, seed=seed, **dict(params or {}))
  else:
    if not os.path.isfile(trace):
      raise ValueError(f"trace file {trace!r} does not exist")
    t = trace_lib.load(trace, fmt, limit=limit)
  return t if limit is None else t.head(limit)


def run(
  workdir: str,
  seed: int = 0,
  trace: str = "experiments/traces/mooncake_conversation_trace.jsonl",
  fmt: str = "mooncake",
  model: str = "marconi_7b",
  policy: str = "adaptive",
  cap_min: float = 5e10,
  cap_max: float = 8e11,
  num_points: int = 16,
  capacities: Sequence[float] | None = None,
  block_size: int = 512,
  checkpoint_unit: int = 64,
  limit: int | None = None,
  params: Mapping | None = None,
  progress: bool = True,
  processes: int | None = 1,
) -> dict[str, Any]:
  """`experiments.run` entry: the sweep's per-capacity summaries and the plot.

  `processes` > 1 deals the capacities to that many spawned worker processes
  (`sweep_in_processes`); None = one per CPU, at most one per capacity (`default_processes`).
  Every point is the same whatever the number. Default 1: the compiled replay already runs
  the caches on one thread per CPU, and each worker process repeats the trie walk (full
  Mooncake conversation trace, 2 CPUs, whole `experiments.run`: 10.2-11.0 s in one process,
  11.4-11.9 s in two; BENCHMARKS.md, "Compiled sequential replay")."""
  caps = list(capacities) if capacities is not None else capacity_grid(cap_min, cap_max, num_points)
  if processes is None:
    processes = default_processes(len(caps))
  m = get_model(model)
  t0 = time.perf_counter()
  tr = load_trace(trace, fmt, seed, limit, params)
  parse_s = time.perf_counter() - t0
  check_capacity(tr, m, min(caps))
  bar = None
  workers = min(processes, len(caps))
  if progress:
    from tqdm import tqdm

    desc = f"{policy} x {len(caps)} capacities" + (f" ({workers} processes)" if workers > 1 else "")
    bar = tqdm(total=len(tr) * workers, desc=desc, unit="req")
  done = [0]

  def tick(n: int) -> None:
    if bar is not None and (n - done[0] >= 64 or n == len(tr)):
      bar.update(n - done[0])
      done[0] = n

  try:
    if processes == 1:
      results = sweep_checkpoint(
        tr, m, caps, policy, checkpoint_unit, block_size, progress=tick if bar else None
      )
    else:
      results = sweep_in_processes(
        tr, model, caps, policy, checkpoint_unit, block_size, processes, bar.update if bar else None
      )
  finally:
    if bar is not None:
      bar.close()
  points = []
  for cap, (triples, extra) in zip(caps, results):
    s = summarize(triples, m)
    rec = {"capacity_bytes": cap}
    rec |= {k: s[k] for k in ("token_hit_rate", "request_hit_rate", "flops_saved")}
    rec |= {"tokens_reused": s["tokens_reused"]} | {k: extra[k] for k in POINT_FIELDS}
    rec["alpha_requests"] = extra["alpha_requests"]
    points.append(rec)
  wall = max((x["wall_s"] for _, x in results), default=0.0)
  plot = None
  if workdir:
    name = os.path.basename(trace) if fmt != "synthetic" else f"{trace} (seed {seed})"
    plot = plotting.line_chart(
      os.path.join(workdir, "sweep.png"),
      f"{name}, {model}, {policy}, B={block_size}, U={checkpoint_unit}",
      caps,
      {policy: {k: [p[k] for p in points] for k in ("token_hit_rate", "flops_saved")}},
      ["token_hit_rate", "flops_saved"],
      "capacity (bytes)",
      xscale="log",
    )
  return {
    "policy": policy,
    "model": model,
    "trace": trace,
    "requests": len(tr),
    "input_tokens": tr.input_tokens,
    "block_size": block_size,
    "checkpoint_unit": checkpoint_unit,
    "capacities": caps,
    "points": points,
    "trie_units": results[0][1]["trie_units"] if results else 0,
    "parse_s": parse_s,
    "replay_wall_s": wall,
    "processes": processes,
    "plot": plot,
  }
