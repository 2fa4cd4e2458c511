"""What each XLA:CPU trick of the core buys (`hybrid_cache/core/xla_cpu.py`), side by side.

Every variant runs in its own process (the tricks are chosen at import, from
`HYBRID_CACHE_PLAIN_XLA`): `tricks` (all on), one row per trick replaced by its plain `jnp`
twin, and `plain` (all off). Each process measures
  - batch 64: `bench_scheduler.time_batches`, jitted core, 64 admissions per `schedule` call,
    µs per request (wall and process CPU time of one call);
  - scan: `bench_scheduler.bench_scan`, admissions in one `lax.scan`, µs per admission;
  - sim: the simulator's core replay (`--policy vllm_default` and `--policy flop_aware`, alpha 1;
    marconi_7b, B = 512) of the first `--sim_requests` requests of the Mooncake conversation
    trace, `replay_s`.
Each metric is the minimum over `--repeats` timings in one process (two for the simulator),
compile excluded: on a shared machine the least disturbed timing is the steadiest. Variants
alternate within each of `--runs` rounds; the table gives medians over the rounds and each
variant's median over the all-on median (> 1: the trick saves that much). The
simulator's per-request hits must be identical in every variant (checked; exit 1 otherwise).

  PYTHONPATH=. python -m experiments.bench_xla_tricks [--runs 7] [--variants prefix_count,...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys

from hybrid_cache.core.xla_cpu import TRICKS

DEFAULT_TRACE = os.path.join(
  os.path.dirname(__file__), "..", "..", "shared", "traces", "mooncake_conversation_trace.jsonl"
)
METRICS = ("batch64_us", "batch64_cpu_us", "scan_us", "sim_vllm_default_s", "sim_flop_aware_s")


def _worker(args) -> dict:
  """One measurement in this process (tricks as set in the environment): each metric is the
  minimum over `--repeats` timings after a warm-up that compiles (the least disturbed run)."""
  from experiments import bench_scheduler
  from hybrid_cache.factory import make_manager
  from hybrid_cache.sim import trace as trace_lib
  from hybrid_cache.sim.cost_model import get_model
  from hybrid_cache.sim.simulate import simulate

  cfg = bench_scheduler.make_config(max_requests=64)
  prompts = bench_scheduler.make_prompts(512, seed=0)
  manager = make_manager(cfg, "jax")
  timings = [bench_scheduler.time_batches(manager, prompts, 64, 1) for _ in range(args.repeats)]
  out = {"batch64_us": min(t[0] for t in timings), "batch64_cpu_us": min(t[1] for t in timings)}
  out["scan_us"] = min(bench_scheduler.bench_scan(args.scan_steps)[0] for _ in range(args.repeats))
  if args.sim_requests > 0:
    tr = trace_lib.load(args.trace, "mooncake", limit=args.sim_requests)
    digest = []
    for policy in ("vllm_default", "flop_aware"):
      runs = [simulate(tr, get_model("marconi_7b"), args.capacity, policy, 512) for _ in range(3)]
      out[f"sim_{policy}_s"] = min(extra["replay_s"] for _, extra in runs[1:])  # 0 compiles
      digest.append(repr(runs[0][0]))
    out["sim_digest"] = hashlib.sha256("".join(digest).encode()).hexdigest()[:16]
  return out


def _run_variant(name: str, args) -> dict:
  env = dict(os.environ)
  plain = {"tricks": "", "plain": ",".join(TRICKS)}.get(name, name.replace("+", ","))
  env["HYBRID_CACHE_PLAIN_XLA"] = plain
  cmd = [sys.executable, "-m", "experiments.bench_xla_tricks", "--worker"]
  cmd += ["--repeats", str(args.repeats), "--scan_steps", str(args.scan_steps)]
  cmd += ["--sim_requests", str(args.sim_requests), "--trace", args.trace]
  cmd += ["--capacity", str(args.capacity)]
  res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
  if res.returncode != 0:
    raise RuntimeError(f"variant {name} failed:\n{res.stderr[-2000:]}")
  return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--runs", type=int, default=7, help="interleaved rounds (>= 1)")
  p.add_argument(
    "--variants", default="", help="comma-separated; a trick or tricks joined by '+' (default each)"
  )
  p.add_argument("--repeats", type=int, default=5, help="timings per metric (min taken)")
  p.add_argument("--scan_steps", type=int, default=2000)
  p.add_argument("--sim_requests", type=int, default=1500, help="0 = skip the simulator")
  p.add_argument("--trace", default=DEFAULT_TRACE)
  p.add_argument("--capacity", type=float, default=10e9)
  p.add_argument("--out", default="", help="write the medians as JSON here")
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.worker:
    print(json.dumps(_worker(args)), flush=True)
    return 0
  chosen = [v for v in args.variants.split(",") if v] or list(TRICKS)
  bad = [v for v in chosen if not set(v.split("+")) <= set(TRICKS)]
  if bad or args.runs < 1:
    print(f"--variants must name tricks among {', '.join(TRICKS)} and --runs >= 1", file=sys.stderr)
    return 2
  names = ["tricks", *chosen, "plain"]
  print("command: PYTHONPATH=. python -m experiments.bench_xla_tricks " + " ".join(sys.argv[1:]))
  print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
  samples: dict[str, list[dict]] = {n: [] for n in names}
  for run in range(args.runs):
    for name in names:
      samples[name].append(_run_variant(name, args))
      print(f"run {run + 1}/{args.runs} {name}: {samples[name][-1]}", flush=True)
  digests = {s.get("sim_digest") for v in samples.values() for s in v}
  if len(digests) > 1:
    print(f"ERROR: the simulator's per-request hits differ across variants: {digests}")
    return 1
  print("per-request hits identical across variants: " + ("yes" if digests != {None} else "-"))
  metrics = [m for m in METRICS if m in samples["tricks"][0]]
  med = {n: {m: statistics.median(s[m] for s in samples[n]) for m in metrics} for n in names}
  print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
  print("\n| variant (plain twin of) | " + " | ".join(f"{m} median (x all-on)" for m in metrics))
  print("|---" * (len(metrics) + 1) + "|")
  for n in names:
    cells = [f"{med[n][m]:.2f} ({med[n][m] / med['tricks'][m]:.2f}x)" for m in metrics]
    print(f"| {n} | " + " | ".join(cells) + " |")
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"medians": med, "samples": samples}, f, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
