"""Capacity sweep vs one capacity (issue 15): wall time of a 16-point sweep in one replay
against one point, measured side by side in one process.

  python -m experiments.bench_sweep [--trace FILE] [--policy adaptive] [--points 16]
      [--cap-min 5e10] [--cap-max 8e11] [--block-size 512] [--unit 64] [--rounds 1]
      [--processes N] [--cli]

--policy names a placement of the unit cache (`checkpoint_placement.PLACEMENTS`; `adaptive` is
`--policy ckpt_adaptive` on the simulator's command line). One point = what one `python -m
hybrid_cache.sim` run does for one capacity: parse the trace and `run_checkpoint` (the capacity
is the grid's point nearest 2e11). The sweep = parse the trace and `sweep_checkpoint` over all
points. Prints each timing (wall and process CPU seconds: the
machine is shared, see the load), the ratio sweep / point (issue 15 asks <= 3, must be < 8),
and whether the sweep's point equals the single run (triples and summary, wall_s aside).
--processes N > 1 also times the sweep dealt to N spawned processes (reported separately: the
ratio above is one process). --cli also times whole processes: one `python -m hybrid_cache.sim`
point (--no-oracle) against `python -m experiments.run` of capacity_sweep.gin on the same grid.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

from experiments.capacity_sweep import sweep_in_processes
from hybrid_cache.sim import trace as trace_lib
from hybrid_cache.sim.checkpoint_policies import run_checkpoint
from hybrid_cache.sim.checkpoint_policies import sweep_checkpoint
from hybrid_cache.sim.cost_model import get_model
from hybrid_cache.sim.policies import UNIT_ADAPTIVE


def _timed(fn):
  w0, c0 = time.perf_counter(), time.process_time()
  out = fn()
  return out, time.perf_counter() - w0, time.process_time() - c0


def _time_processes(a, one: float) -> None:
  """Wall time of whole processes (interpreter, imports, parse, replay, outputs)."""
  if a.limit is not None:
    print("--cli: skipped with --limit (the gin config replays the whole trace)")
    return
  point = [sys.executable, "-m", "hybrid_cache.sim", "--trace", a.trace, "--format", "mooncake"]
  # the command line names the unit cache's `adaptive` `ckpt_adaptive` (`sim/policies.py`)
  cli_policy = UNIT_ADAPTIVE if a.policy == "adaptive" else a.policy
  point += ["--model", a.model, "--capacity-bytes", repr(one), "--policy", cli_policy]
  point += ["--block-size", str(a.block_size), "--checkpoint-unit", str(a.unit), "--no-oracle"]
  with tempfile.TemporaryDirectory() as wd:
    sweep = [sys.executable, "-m", "experiments.run", f"--workdir={wd}"]
    sweep += ["--gin_file=configs/experiments/capacity_sweep.gin"]
    for b in (
      f"trace={a.trace!r}",
      f"model={a.model!r}",
      f"policy={a.policy!r}",
      f"cap_min={a.cap_min!r}",
      f"cap_max={a.cap_max!r}",
      f"num_points={a.points}",
      f"block_size={a.block_size}",
      f"checkpoint_unit={a.unit}",
      "progress=False",
    ):
      sweep.append(f"--gin_bindings=capacity_sweep.run.{b}")
    walls = []
    for cmd in (point, sweep):
      t0 = time.perf_counter()
      subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
      walls.append(time.perf_counter() - t0)
  print(
    f"processes: one hybrid_cache.sim point {walls[0]:7.2f} s, experiments.run sweep "
    f"{walls[1]:7.2f} s, ratio {walls[1] / walls[0]:.2f}; load {os.getloadavg()}",
    flush=True,
  )


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--trace", default="experiments/traces/mooncake_conversation_trace.jsonl")
  p.add_argument("--model", default="marconi_7b")
  p.add_argument("--policy", default="adaptive")
  p.add_argument("--points", type=int, default=16)
  p.add_argument("--cap-min", type=float, default=5e10)
  p.add_argument("--cap-max", type=float, default=8e11)
  p.add_argument("--block-size", type=int, default=512)
  p.add_argument("--unit", type=int, default=64)
  p.add_argument("--limit", type=int, default=None, help="first N requests only")
  p.add_argument("--rounds", type=int, default=1, help="point then sweep, this many times")
  p.add_argument(
    "--processes", type=int, default=1, help="> 1: also time the sweep over this many processes"
  )
  p.add_argument(
    "--cli",
    action="store_true",
    help="also time whole processes: one `python -m hybrid_cache.sim` point (--no-oracle) vs "
    "`python -m experiments.run` of capacity_sweep.gin with the same grid",
  )
  a = p.parse_args(argv)
  if a.points < 1 or a.rounds < 1:
    print("error: --points and --rounds must be >= 1", file=sys.stderr)
    return 2
  model = get_model(a.model)
  caps = [float(c) for c in np.geomspace(a.cap_min, a.cap_max, a.points)]
  one = min(caps, key=lambda c: abs(np.log(c / 2e11)))
  print(
    f"{platform.processor() or 'cpu'}, {os.cpu_count()} cpus, load {os.getloadavg()}; "
    f"{a.policy}, {a.model}, B={a.block_size}, U={a.unit}, {a.points} capacities "
    f"{a.cap_min:g}..{a.cap_max:g}, point {one:.4g}",
    flush=True,
  )
  cmd = "python -m experiments.bench_sweep " + " ".join(argv if argv is not None else sys.argv[1:])
  # load the compiled replay's code once (every process pays it once, ~1 s; --cli times it)
  warm = trace_lib.load_mooncake(a.trace, limit=64)
  sweep_checkpoint(warm, model, caps[:1], a.policy, a.unit, a.block_size)
  ratios = []
  for rnd in range(a.rounds):

    def point():
      tr = trace_lib.load_mooncake(a.trace, limit=a.limit)
      return run_checkpoint(tr, model, one, a.policy, a.unit, a.block_size)

    def sweep():
      tr = trace_lib.load_mooncake(a.trace, limit=a.limit)
      return sweep_checkpoint(tr, model, caps, a.policy, a.unit, a.block_size)

    (t1, x1), w1, c1 = _timed(point)
    print(f"round {rnd}: one point   wall {w1:7.2f} s  cpu {c1:7.2f} s", flush=True)
    swept, w16, c16 = _timed(sweep)
    print(f"round {rnd}: {a.points}-point sweep wall {w16:7.2f} s  cpu {c16:7.2f} s", flush=True)
    t16, x16 = swept[caps.index(one)]
    same = t16 == t1 and {k: v for k, v in x16.items() if k != "wall_s"} == {
      k: v for k, v in x1.items() if k != "wall_s"
    }
    ratios.append(w16 / w1)
    print(
      f"round {rnd}: ratio sweep/point wall {w16 / w1:.2f}  cpu {c16 / c1:.2f}  "
      f"(point equal to the sweep's: {same}); load {os.getloadavg()}",
      flush=True,
    )
    if not same:
      return 1
    if a.processes > 1:

      def pooled():
        tr = trace_lib.load_mooncake(a.trace, limit=a.limit)
        return sweep_in_processes(tr, a.model, caps, a.policy, a.unit, a.block_size, a.processes)

      pool_out, wp, cp = _timed(pooled)
      equal = [x[0] for x in pool_out] == [x[0] for x in swept]
      print(
        f"round {rnd}: {a.points}-point sweep in {a.processes} processes wall {wp:7.2f} s "
        f"(parent cpu {cp:.2f} s), ratio to the point {wp / w1:.2f} (same triples: {equal}); "
        f"load {os.getloadavg()}",
        flush=True,
      )
  if a.cli:
    _time_processes(a, one)
  print(f"median ratio {float(np.median(ratios)):.2f} over {a.rounds} round(s); {cmd}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
