"""`sweep_checkpoint`: every capacity of one shared replay equals its own `run_checkpoint`."""

import pytest

from hybrid_cache.sim import checkpoint_policies as cp
from hybrid_cache.sim.synthetic import agentic
from hybrid_cache.sim.testing import TINY


def _without_wall(extra: dict) -> dict:
  return {k: v for k, v in extra.items() if k != "wall_s"}


@pytest.mark.parametrize("policy", ["adaptive", "ckpt_branch", "ckpt_sparse:3"])
def test_sweep_points_equal_independent_runs(policy, monkeypatch):
  monkeypatch.setattr(cp, "RETUNE_EVERY", 8)  # adaptive re-tunes often within the trace
  trace = agentic(seed=4, num_sessions=8, sys_prompt_len=256, min_turns=3, max_turns=8)
  longest = max(r.num_tokens for r in trace.requests)
  floor = TINY.state_bytes + 4 * longest
  # unsorted, from tight (many evictions, recompute fallbacks) to roomy
  caps = [floor + 4 * 900, floor + 64, floor + 4 * 200, floor + 4 * 5000]
  swept = cp.sweep_checkpoint(trace, TINY, caps, policy, unit=16, block_size=48)
  assert len(swept) == len(caps)
  evicted = []
  for cap, (triples, extra) in zip(caps, swept):
    alone_triples, alone_extra = cp.run_checkpoint(trace, TINY, cap, policy, 16, 48)
    assert triples == alone_triples
    assert _without_wall(extra) == _without_wall(alone_extra)
    evicted.append(extra["states_evicted"])
  assert evicted[1] > 0  # the tight point did evict
  assert len({tuple(t[2] for t in s[0]) for s in swept}) > 1  # the capacities differ


def test_sweep_rejects_no_capacity():
  trace = agentic(seed=0, num_sessions=2)
  with pytest.raises(ValueError, match="capacities must hold at least one"):
    cp.sweep_checkpoint(trace, TINY, [], "adaptive")
  with pytest.raises(ValueError, match="capacity_bytes must be finite"):
    cp.sweep_checkpoint(trace, TINY, [1e4, -1.0], "adaptive")
