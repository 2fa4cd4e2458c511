"""`sweep_checkpoint`: every capacity of one shared replay equals its own `run_checkpoint`."""

import pytest

from hybrid_cache.sim import adaptive_stats
from hybrid_cache.sim import checkpoint_placement as placement
from hybrid_cache.sim import checkpoint_policies as cp
from hybrid_cache.sim import eviction_weightings as weightings
from hybrid_cache.sim.checkpoint_cache import UnitCache
from hybrid_cache.sim.checkpoint_costs import CacheSizes
from hybrid_cache.sim.seen_trie import SeenTrie
from hybrid_cache.sim.synthetic import agentic
from hybrid_cache.sim.testing import TINY


def _without_wall(extra: dict) -> dict:
  return {k: v for k, v in extra.items() if k != "wall_s"}


@pytest.mark.parametrize("policy", ["adaptive", "ckpt_branch", "ckpt_sparse:3"])
def test_sweep_points_equal_independent_runs(policy, monkeypatch):
  monkeypatch.setattr(weightings, "RETUNE_EVERY", 8)  # adaptive re-tunes often within the trace
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


@pytest.mark.parametrize(("prior", "frequency"), [("none", False), ("hits", True), ("reach", True)])
def test_fixed_alpha_zero_skips_flops_term_exactly(prior, frequency):
  # the same cache with the FLOPs term computed (slow) and taken as 1 (fast): same heaps
  trace = agentic(seed=2, num_sessions=6, sys_prompt_len=200, min_turns=3, max_turns=6)
  longest = max(r.num_tokens for r in trace.requests)
  sizes = CacheSizes.of(TINY, TINY.state_bytes + 4 * longest + 4 * 300, 16, 48)
  trie = SeenTrie(16)
  fast = UnitCache(trie, sizes, TINY, 0.0, prior, frequency)
  slow = UnitCache(trie, sizes, TINY, 0.0, prior, frequency)
  assert fast._flat_weight
  slow._flat_weight = False
  stats = adaptive_stats.DivergenceStats()
  for r, req in enumerate(trace.requests):
    path, seen = trie.walk(req)
    n_in = req.num_input_tokens
    n_comp = n_in + max(req.num_output_tokens - 1, 0)
    cands = placement.candidates("adaptive", stats, len(path), n_in // 16, seen)
    for q, kind in cands:
      trie.register(path[q - 1], kind)
    place = placement._placer("adaptive", 1, len(path), cands)
    cap = (n_in - 1) // 16
    assert fast.serve(r, path, cap, n_comp, place) == slow.serve(r, path, cap, n_comp, place)
    assert sorted(fast.heap) == sorted(slow.heap)
    if 0 < seen < cap:
      stats.observe(seen, trie.out[path[seen - 1]])
  assert slow.eff_n > 0 and fast.evicted_ckpts > 0
