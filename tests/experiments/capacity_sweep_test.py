"""experiments.capacity_sweep: log-spaced grid, points equal to single-capacity replays."""

import pytest

from experiments import capacity_sweep
from hybrid_cache.sim.cost_model import get_model
from hybrid_cache.sim.simulate import simulate

PARAMS = {"num_sessions": 3, "sys_prompt_len": 300, "obs_mean": 60.0, "max_turns": 6}


def test_grid_is_log_spaced_and_validated():
  grid = capacity_sweep.capacity_grid(1e9, 1e11, 3)
  assert grid == pytest.approx([1e9, 1e10, 1e11])
  with pytest.raises(ValueError, match="num_points must be an integer >= 1"):
    capacity_sweep.capacity_grid(1e9, 1e11, 0)
  with pytest.raises(ValueError, match="0 < cap_min <= cap_max"):
    capacity_sweep.capacity_grid(2e9, 1e9, 3)


def test_points_match_single_capacity_replays(tmp_path):
  res = capacity_sweep.run(
    str(tmp_path),
    trace="agentic",
    fmt="synthetic",
    params=PARAMS,
    cap_min=1.5e9,
    cap_max=3e9,
    num_points=2,
    block_size=64,
    progress=False,
    processes=1,
  )
  assert (tmp_path / "sweep.png").exists()
  trace = capacity_sweep.load_trace("agentic", "synthetic", params=PARAMS)
  for p in res["points"]:
    triples, extra = simulate(
      trace, get_model("marconi_7b"), p["capacity_bytes"], "ckpt_adaptive", 64
    )
    assert p["tokens_reused"] == sum(t[2] for t in triples)
    assert p["states_evicted"] == extra["states_evicted"]


def test_default_processes_one_per_cpu_at_most_one_per_point():
  assert capacity_sweep.default_processes(1) == 1
  assert 1 <= capacity_sweep.default_processes(16) <= 16


def test_sweep_in_processes_equals_one_process():
  trace = capacity_sweep.load_trace("agentic", "synthetic", params=PARAMS)
  caps = [1.5e9, 2e9, 3e9]
  ticks = []
  pooled = capacity_sweep.sweep_in_processes(
    trace, "marconi_7b", caps, "adaptive", 64, 64, 2, progress=ticks.append
  )
  one = capacity_sweep.sweep_checkpoint(trace, get_model("marconi_7b"), caps, "adaptive", 64, 64)
  assert [p[0] for p in pooled] == [p[0] for p in one]
  assert sum(ticks) == 2 * len(trace)  # each of the 2 workers replays every request
  with pytest.raises(ValueError, match="processes must be an integer >= 1"):
    capacity_sweep.sweep_in_processes(trace, "marconi_7b", caps, "adaptive", 64, 64, 0)
