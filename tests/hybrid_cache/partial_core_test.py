"""Jitted core pieces of vLLM §2.5 partial (fine-grained) hits, with hand-derived values.

Config P: full attention bs 4 + Mamba align bs 8 (HBS = gcd = 4 < 8: partial hits on, hits align
to 4). Config F: full attention bs 8 + Mamba bs 16 with hash_block_size 4 (full attention is
coarser than the hash block: phase-2 probes).
"""

import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.core import partial
from hybrid_cache.core import split
from hybrid_cache.core.layout import layout
from hybrid_cache.factory import make_manager
from hybrid_cache.manager import JaxCacheManager
from hybrid_cache.types import ScheduleEntry
from hybrid_cache.types import StateCopy

P = CacheConfig(
  groups=(GroupSpec("full"), GroupSpec("mamba", block_size=8)), block_size=4, num_blocks=64
)
F = CacheConfig(
  groups=(GroupSpec("full", block_size=8), GroupSpec("mamba", block_size=16)),
  block_size=8,
  hash_block_size=4,
  num_blocks=64,
)
# 21 tokens: the prompt-tail boundary floor((21-1)/4)*4 = 20 lies inside Mamba block 2 (16..24);
# its first two steps ([16, 4]) leave the partial entry at 20 pending, the third (1 token) moves
# it to a copy. AX shares 20 tokens with A.
A = list(range(21))
AX = A[:20] + [900, 901, 902]


def test_layout_partial_fields():
  lay = layout(P)
  assert (lay.partial, lay.hit_align, lay.fine_groups) == (True, 4, (1,))
  assert layout(F).fine_groups == (0, 1)
  off = layout(P.replace(enable_prefix_caching=False))
  assert (off.partial, off.hit_align, off.fine_groups) == (False, 8, ())


def test_phase2_probe_of_hash_boundaries_inside_the_next_block():
  # F: FA bs 8, HBS 4. Two full blocks cached (16 tokens); a partial key at hash index 4
  # (tokens 20) inside block 2.
  lay = layout(F)
  cached = jnp.zeros((lay.max_blocks,), bool).at[:2].set(True)
  fine = jnp.zeros((lay.max_hashes,), bool).at[4].set(True)

  def find(cap, drop=False):
    length, run, f = partial._full_find_fine(lay, cached, fine, jnp.int32(cap), drop, 8)
    return int(length), int(run), int(f)

  # cap 30: run 2 (16), probes hash index 4 (first 4, top min(4 + 1, 30 // 4)) -> 20
  assert find(30) == (20, 2, 4)
  # EAGLE drops one hash block (4), not a whole block
  assert find(30, drop=True) == (16, 2, 4)
  # cap 19: top = min(5, 19 // 4 = 4) = 4 -> no probe, the full run (16)
  assert find(19) == (16, 2, -1)
  # cap 15: one block fits (15 // 8), probe range [2, 3): hash index 2 is not cached -> 8
  assert find(15) == (8, 1, -1)


def _prefill(m, name, tokens, steps=2):
  """Adds the request and runs `steps` steps (2: A up to its tail boundary 20)."""
  m.add_request(name, tokens)
  return [m.schedule([ScheduleEntry(name)]) for _ in range(steps)]


def test_prefill_registers_the_mamba_partial_entry_at_the_prompt_tail():
  # A (21 tokens): split stops at lcp = floor(20, 8) = 16, then at the tail 20. Step 1: FA
  # blocks 1-4, Mamba state block 5 at position 1 (ends at 16). Step 2: FA block 6, Mamba
  # running block 7 at position 2; caching is not floored to sbs 8: FA keys block 4 (tokens
  # 20), and the tail 20 ends the chunk inside Mamba block 2 -> partial key on block 7.
  m = make_manager(P, "jax")
  steps = _prefill(m, "A", A)
  assert [s.entries[0].scheduled_tokens for s in steps] == [16, 4]
  assert m.request_view("A").block_ids == ((1, 2, 3, 4, 6), (0, 5, 7))
  assert m.pool_stats().cached_blocks_per_group == (5, 2)
  assert int(m.state.req_partial[m._reqs["A"].slot, 1]) == 3  # position 2, pending CoW


def test_mamba_lookup_scans_hash_block_positions():
  m = make_manager(P, "jax")
  _prefill(m, "A", A)
  m.free("A")
  # AX (max_len 22): FA 5 blocks (20); Mamba scans hash indices 4..0: index 4 (20) holds the
  # partial key -> 20, one block (7) at position 2.
  hit = m.lookup(AX)
  assert (hit.hit_tokens, hit.per_group_hit_tokens, hit.hit_blocks_per_group) == (
    20,
    (20, 20),
    (5, 1),
  )
  # 18 tokens of A (max_len 17): FA 4 blocks (16); Mamba index 4 is past 17 // 4; index 3
  # (16) is the full state block 5 -> 16 (a multiple of HBS 4, not of sbs 8 needed here)
  hit = m.lookup(A[:18])
  assert (hit.hit_tokens, hit.per_group_hit_tokens, hit.shared_prefix_boundary) == (16, (16, 16), 0)
  # 13 tokens (max_len 12): FA 3 blocks = 12 (not floored to 8); no Mamba key at or below 12
  hit = m.lookup(A[:13])
  assert (hit.hit_tokens, hit.per_group_hit_tokens, hit.shared_prefix_boundary) == (0, (12, 0), 12)


def test_new_request_hitting_a_partial_entry_gets_a_private_copy():
  # After A is freed the queue is 8..63, then A's keyed blocks tail first: 6 4 3 2 1, 7 5.
  # AX (23 tokens) hits 20: FA blocks 1 2 3 4 6 + one fresh (8); Mamba: the hit block 7 sits at
  # position 2 and the hit ends inside it -> the first Mamba pop (9) is a private copy that
  # replaces it (admission counted one more block); copy 7 -> 9. At the step end 7's hit
  # reference is released (free cached again, at the tail) and 9 stays with Ax.
  m = make_manager(P, "jax")
  _prefill(m, "A", A)
  m.free("A")
  m.add_request("Ax", AX)
  res = m.schedule([ScheduleEntry("Ax")])
  e = res.entries[0]
  assert (e.scheduled_tokens, e.hit.hit_tokens) == (3, 20)
  assert e.new_block_ids == ((8,), (9,))
  assert res.state_copies == (StateCopy("Ax", 1, 7, 9),)
  assert m.request_view("Ax").block_ids == ((1, 2, 3, 4, 6, 8), (0, 0, 9))
  st = m.pool_stats()
  assert (st.num_free_blocks, st.num_used_blocks, st.num_free_cached_blocks) == (56, 7, 2)
  assert int(m.state.ref_cnt[7]) == 0 and int(m.state.ref_cnt[9]) == 1


def test_producer_moves_its_partial_entry_to_a_copy_on_its_next_step():
  # A's third step (its last prompt token, 20 -> 21). Step 3: remove_skipped(20) frees the
  # Mamba state block 5 (position 1, keyed -> tail). FA needs a 6th block (8, the queue head);
  # Mamba needs no new block but its pending partial entry takes one more: 9. The key moves
  # 7 -> 9, copy 7 -> 9; the table keeps 7. At the step end 9 (no table holds it, keyed) joins
  # the free tail: free cached 5 and 9.
  m = make_manager(P, "jax")
  _prefill(m, "A", A)
  res = m.schedule([ScheduleEntry("A")])
  e = res.entries[0]
  assert e.scheduled_tokens == 1
  assert e.new_block_ids == ((8,), ())
  assert res.state_copies == (StateCopy("A", 1, 7, 9),)
  assert m.request_view("A").block_ids == ((1, 2, 3, 4, 6, 8), (0, 0, 7))
  st = m.pool_stats()
  assert (st.num_free_blocks, st.num_free_cached_blocks, st.cached_blocks_per_group) == (
    56,
    2,
    (5, 2),
  )
  s = m.state
  assert int(s.block_group[9]) == 1 and int(s.block_group[7]) == -1
  assert int(s.req_partial[m._reqs["A"].slot, 1]) == 0
  # the moved key serves the next request: Ax hits 20 through block 9
  hit = m.lookup(AX)
  assert (hit.hit_tokens, hit.hit_blocks_per_group) == (20, (5, 1))


def test_moved_key_is_not_hittable_in_the_same_step():
  # Same step: A's CoW moves the key (registration step = now); Ax, later in the step, would
  # hit it in Mamba -> same-step rule (§2.4.6): not admitted this step.
  m = make_manager(P, "jax")
  _prefill(m, "A", A)
  m.add_request("Ax", AX)
  res = m.schedule([ScheduleEntry("A"), ScheduleEntry("Ax")])
  assert res.entries[0].scheduled_tokens == 1
  assert res.entries[1].scheduled_tokens == 0
  assert res.entries[1].reason == "allocate_slots_failed"


def test_split_stops_at_the_prompt_hash_tail():
  # 23-token prompt, bs 8: lcp = floor(22, 8) = 16 < tail floor(22, 4) = 20 < 23 -> 16, 4, 3
  lay = layout(P)
  budget = jnp.int32(P.max_num_batched_tokens)
  n = split.split(lay, jnp.int32(16), jnp.int32(7), jnp.int32(23), jnp.int32(23), 0, budget)
  assert int(n) == 4
  n = split.split(lay, jnp.int32(0), jnp.int32(23), jnp.int32(23), jnp.int32(23), 0, budget)
  assert int(n) == 16
  # without partial hits (prefix caching off) no tail stop
  off = P.replace(enable_prefix_caching=False)
  n = split.split(layout(off), jnp.int32(16), jnp.int32(7), 23, 23, 0, budget)
  assert int(n) == 7


def test_fa_phase2_hit_takes_a_private_copy_of_the_partial_block():
  # F (FA 8, Mamba 16, HBS 4). A (21 tokens): split lcp = floor(20, 16) = 16, tail stop 20:
  # chunks 16, 4 (then 1). FA blocks 1 2 (step 1) + 4 (step 2); Mamba 3 (pos 0, step 1), 5 (pos 1).
  # Step 2 caches FA up to 20 unfloored: full blocks 0-1 already keyed, and the FA partial tail
  # 20 on block 4 (position 2); Mamba partial 20 on its running block 5.
  m = make_manager(F, "jax")
  steps = _prefill(m, "A", A)
  assert [s.entries[0].scheduled_tokens for s in steps] == [16, 4]
  assert m.request_view("A").block_ids == ((1, 2, 4), (3, 5))
  assert m.pool_stats().cached_blocks_per_group == (3, 2)
  m.free("A")
  # Ax (23): FA phase 1 = 16, phase 2 probes hash index 4 (20) in block 2 -> 20; Mamba 20.
  hit = m.lookup(AX)
  assert (hit.hit_tokens, hit.per_group_hit_tokens, hit.hit_blocks_per_group) == (
    20,
    (20, 20),
    (3, 1),
  )
  m.add_request("Ax", AX)
  res = m.schedule([ScheduleEntry("Ax")])
  e = res.entries[0]
  # queue after the free: 6..63, then FA 4 2 1, Mamba 5 3. FA copy of 4 -> 6 (replaces it at
  # position 2, cdiv(23, 8) = 3 blocks: nothing else); Mamba copy of 5 -> 7 at position 1.
  assert e.new_block_ids == ((6,), (7,))
  assert res.state_copies == (StateCopy("Ax", 0, 4, 6), StateCopy("Ax", 1, 5, 7))
  assert m.request_view("Ax").block_ids == ((1, 2, 6), (0, 7))
  assert np.asarray(m.state.ref_cnt)[[4, 5, 6, 7]].tolist() == [0, 0, 1, 1]
  # no stale table entry past a row's length (the FA row has 3 blocks, no fresh one): freeing
  # Ax returns every block exactly once
  table = np.asarray(m.state.tables[m._reqs["Ax"].slot])
  assert table[0, 3:].tolist() == [0] * (table.shape[1] - 3)
  m.free("Ax")
  assert m.pool_stats().num_used_blocks == 0 and int(np.min(m.state.ref_cnt)) == 0


# ---------------------------------------------------------------------------------------------
# PREF's hand-derived replay scenarios (tests/hybrid_cache/partial_hits_test.py, written for the
# reference backend) replayed on the jax backend
# ---------------------------------------------------------------------------------------------

_SCENARIO_TESTS = (
  "test_producer_chunks_partial_entries_and_cow",
  "test_prompt_tail_on_a_block_edge_makes_no_partial_entry",
  "test_fa_phase2_and_mamba_partial_hit_with_cow",
  "test_cow_block_counts_in_admission",
  "test_cow_copies_are_named_in_the_step_plan",
  "test_eagle_drops_one_hash_block",
  "test_fa_prompt_tail_entry_without_partial_hits_under_eagle",
)


@pytest.mark.parametrize("name", _SCENARIO_TESTS)
def test_hand_derived_scenarios_on_jax(name, monkeypatch):
  from hybrid_cache.replay import replay as replay_lib
  from hybrid_cache.twin import python_manager
  from tests.hybrid_cache import partial_hits_test as ph

  monkeypatch.setattr(ph, "_run", lambda sc: replay_lib.replay(sc, "jax")["results"])
  monkeypatch.setattr(python_manager, "PythonCacheManager", JaxCacheManager)
  getattr(ph, name)()
