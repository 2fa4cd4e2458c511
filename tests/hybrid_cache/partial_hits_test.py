"""vLLM §2.5 partial (fine-grained) hits in the reference core, values derived by hand.

Every expected number is derived step by step in the comments from vLLM 0.33's source
(`FullAttentionManager`/`MambaManager.find_longest_cache_hit`, `_cache_partial_tail_block`,
`get_num_blocks_to_allocate`, `allocate_new_blocks`, `_apply_cow`, `move_block_hashes`,
`Scheduler._mamba_block_aligned_split`), never read off the code under test; the scenarios
without EAGLE were also replayed on vLLM's real manager (`shared/vllm_oracle/`), which agrees.

Common setup: FA block 8, Mamba (align) block 8, hash block 4 (forced), so sbs = 8, partial hits
on (Mamba 8 > HBS 4), every hit aligned to 4, and FA is fine-grained (8 > 4).
P = tokens 0..21 (22 tokens); Q = P[:20] + [900, 901] (22 tokens, shares 20 with P).
"""

import pytest

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.factory import make_manager
from hybrid_cache.replay import replay as replay_lib
from hybrid_cache.twin import rules


def _scenario(num_blocks, actions, **extra):
  config = {
    "block_size": 8,
    "num_blocks": num_blocks,
    "hash_block_size": 4,
    "groups": [{"type": "full"}, {"type": "mamba"}],
    **extra,
  }
  prompts = {"P": {"range": [0, 22]}, "Q": {"concat": [{"range": [0, 20]}, [900, 901]]}}
  return {"name": "partial", "config": config, "prompts": prompts, "actions": actions}


def _run(sc):
  return replay_lib.replay(sc, "reference")["results"]


# ---------------------------------------------------------------------------------------------
# The producer: chunk stops, partial entries, the producer's copy-on-write
# ---------------------------------------------------------------------------------------------


def test_producer_chunks_partial_entries_and_cow():
  # Split (§4.3): lcp = floor(21, 8) = 16; partial stop floor(22, 4) = 20 (16 < 20 < 22).
  #  0 -> 16 (lcp), 16 -> 20 (partial stop), 20 -> 22 (next block edge 24 > lcp: no stop).
  # step 1 (16): FA 2 blocks [1, 2]; Mamba req 2 -> [0, 3]. Cache n = 16 (not floored):
  #   FA keys 1 (@8), 2 (@16); Mamba key 3 (@16). FA tail t = 20 > 16: none.
  # step 2 (20): FA +1 -> [1, 2, 4]; Mamba req 3 -> [0, 3, 5] (last_state 1). Cache n = 20:
  #   FA tail t = 20 inside block 2 -> partial key on 4; Mamba n == t -> partial key on 5,
  #   CoW pending (idx 2, src 5).
  # step 3 (22): remove_skipped(20): Mamba frees idx 1 (block 3, keyed -> queue tail).
  #   Mamba takes one block for the CoW: queue head 6; the row keeps 5, its key moves to 6;
  #   at the step end the retention frees [5, 6]: 5 back to ref 1, 6 to the tail (keyed).
  r = _run(_scenario(64, [{"op": "prefill", "req": "P"}]))[0]
  assert r["chunks"] == [16, 4, 2]
  assert r["block_ids"] == [[1, 2, 4], [0, 0, 5]]
  # held: 1, 2, 4, 5 -> 63 - 4 = 59 free, of which 3 and 6 keep keys (Mamba @16, @20).
  assert (r["num_free_blocks"], r["num_used_blocks"], r["num_free_cached_blocks"]) == (59, 4, 2)
  # FA: 1, 2 (full) and 4 (partial @20); Mamba: 3 (@16) and 6 (moved partial @20).
  assert r["cached_blocks_per_group"] == [3, 2]


def test_prompt_tail_on_a_block_edge_makes_no_partial_entry():
  # A 20-token prompt: the tail boundary is floor((20-1)/4)*4 = 16 (a re-sent prompt hits at
  # most 19 tokens), a block edge: no partial entry in either group. Chunks 16 (lcp), 4.
  # FA keys 1 (@8), 2 (@16); Mamba keys 3 (@16); the running blocks 4 (FA) and 5 (Mamba)
  # stay unkeyed (19 tokens is not a hash boundary). Freed: 3 keyed blocks at the tail.
  sc = _scenario(64, [{"op": "prefill", "req": "A"}, {"op": "free", "req": "A"}])
  sc["prompts"]["A"] = {"range": [0, 20]}
  r = _run(sc)
  assert r[0]["chunks"] == [16, 4]
  assert r[0]["block_ids"] == [[1, 2, 4], [0, 3, 5]]
  assert r[0]["cached_blocks_per_group"] == [2, 1]
  assert r[1]["num_free_blocks"] == 63 and r[1]["num_free_cached_blocks"] == 3
  assert r[1]["cached_blocks_per_group"] == [2, 1]


# ---------------------------------------------------------------------------------------------
# A new request hitting the partial entries: FA phase 2, Mamba HBS scan, CoW in both groups
# ---------------------------------------------------------------------------------------------


def test_fa_phase2_and_mamba_partial_hit_with_cow():
  # Lookup Q (max_len 21): FA phase 1 blocks 0, 1 (16); phase 2 probes fine index
  # min(4 + 1, 21 // 4, 5) - 1 = 4 down to 4: the prefix of 20 is keyed on 4 -> FA 20.
  # Mamba scans fine indices 4..0: index 4 (prefix 20) keyed on 6 -> 20, [0, 0, 6].
  # Admit Q: hit 20, n = 2 (split: start 20 mid-block, next edge 24 > lcp 16; partial stop
  # 20 not inside (20, 22)). Admission: FA new = 3 - 3 = 0, evictable 0, +1 CoW (20 % 8 != 0)
  # = 1; Mamba n = 3 - 3 = 0 -> 0 + 1 -> first allocation 1 + S(0) + 1 = 2, evictable 6 = 1
  # -> 3; total 4. Free queue [7..63, 3] after touching 6: FA CoW takes 7 (row [1, 2, 7]),
  # Mamba CoW takes 8 (row [0, 0, 8]). Cache n = 22: FA tail t = 20 -> partial key on 7.
  # Step end frees [4, 7, 6, 8]: 4 -> ref 1 (P), 7 -> 1, 6 -> 0 (keyed: tail), 8 -> 1.
  r = _run(
    _scenario(
      64,
      [{"op": "prefill", "req": "P"}, {"op": "lookup", "req": "Q"}, {"op": "prefill", "req": "Q"}],
    )
  )
  lk = r[1]
  assert (lk["hit_tokens"], lk["per_group_hit_tokens"]) == (20, [20, 20])
  assert lk["hit_blocks_per_group"] == [3, 1] and lk["shared_prefix_boundary"] == 0
  q = r[2]
  assert q["ok"] is True and q["chunks"] == [2] and q["num_computed_tokens"] == 22
  assert q["block_ids"] == [[1, 2, 7], [0, 0, 8]]
  # held: P 1, 2, 4, 5; Q adds 7, 8 -> 6 used, 57 free; keyed free blocks 3 and 6.
  assert (q["num_free_blocks"], q["num_used_blocks"], q["num_free_cached_blocks"]) == (57, 6, 2)
  # FA: 1, 2, 4, 7 (7 has Q's partial key @20); Mamba: 3, 6.
  assert q["cached_blocks_per_group"] == [4, 2]


def test_cow_block_counts_in_admission():
  # Same flow in a pool of 7 blocks (6 usable). After P: held 1, 2, 4, 5; 2 free. Q's
  # admission needs 3: FA 3 - 3 = 0 new + 1 CoW; Mamba 3 - 3 = 0 new -> 0 + 1 CoW, capped at
  # 1 + 1 (vLLM's physical block cap) = 1, + 1 evictable hit (6, ref 0) -> refused. With 8
  # blocks (3 free) Q is admitted: the CoW copies take 7 (FA) and 3 (Mamba, the next head).
  actions = [{"op": "prefill", "req": "P"}, {"op": "prefill", "req": "Q"}]
  r = _run(_scenario(7, actions))
  assert r[0]["num_free_blocks"] == 2
  assert r[1]["ok"] is False and r[1]["failure"] == "allocate_slots_failed"
  r = _run(_scenario(8, actions))
  assert r[0]["num_free_blocks"] == 3
  assert r[1]["ok"] is True and r[1]["chunks"] == [2] and r[1]["num_free_blocks"] == 1
  assert r[1]["block_ids"] == [[1, 2, 7], [0, 0, 3]]


def test_cow_copies_are_named_in_the_step_plan():
  # Q's admission step queues FA (4 -> 7) then Mamba (6 -> 8); P's last step queued 5 -> 6.
  from hybrid_cache.types import ScheduleEntry

  cfg = CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("mamba")), block_size=8, num_blocks=64, hash_block_size=4
  )
  m = make_manager(cfg, "reference")
  m.add_request("P", list(range(22)))
  steps = [m.schedule([ScheduleEntry("P")]) for _ in range(3)]
  assert [e.entries[0].scheduled_tokens for e in steps] == [16, 4, 2]
  assert [(c.group, c.src_block, c.dst_block) for c in steps[2].state_copies] == [(1, 5, 6)]
  m.add_request("Q", list(range(20)) + [900, 901])
  st = m.schedule([ScheduleEntry("Q")])
  assert [(c.req, c.group, c.src_block, c.dst_block) for c in st.state_copies] == [
    ("Q", 0, 4, 7),
    ("Q", 1, 6, 8),
  ]
  assert st.entries[0].new_block_ids == ((7,), (8,))


# ---------------------------------------------------------------------------------------------
# EAGLE: the FA drop is one hash block
# ---------------------------------------------------------------------------------------------


def test_eagle_drops_one_hash_block():
  # use_eagle, 1 speculative token (S = 1). P's split (vLLM `get_mamba_prefill_checkpoint_
  # position` with the EAGLE drop): lcp = floor(22/8)*8 - 8 = 8, tail = floor(22/4)*4 - 4 = 16
  # -> chunks 8, 8, 6. Keys: FA 1 (@8), 2 (@16) and, at step 3, the FA tail t = floor(22/4)*4
  # = 20 (EAGLE reads the whole prompt) on FA block 5; Mamba @8 and @16 (the recurrent tail 16
  # is a block edge, already keyed by the full-block caching: no partial entry).
  # Lookup Q: FA alone: phase 1 16, phase 2 20, EAGLE drop 4 -> 16. Mamba alone (max 21):
  # the last key at or below 20 is @16 -> 16. Reconciled: 16, no junction.
  sc = _scenario(
    64,
    [{"op": "prefill", "req": "P"}, {"op": "lookup", "req": "Q"}],
    use_eagle=True,
    num_speculative_tokens=1,
  )
  r = _run(sc)
  assert r[0]["chunks"] == [8, 8, 6]
  assert r[0]["cached_blocks_per_group"] == [3, 2]
  lk = r[1]
  assert (lk["hit_tokens"], lk["per_group_hit_tokens"]) == (16, [16, 16])
  assert lk["hit_blocks_per_group"] == [2, 1] and lk["shared_prefix_boundary"] == 0


# ---------------------------------------------------------------------------------------------
# Pure rules
# ---------------------------------------------------------------------------------------------


def _cached(keys):
  return lambda i: (100 + i,) if i in keys else None


@pytest.mark.parametrize(
  "full, fine, max_length, drop, expected",
  [
    # bs 8, HBS 4 (k = 2). Blocks 0, 1 cached, partial @20 (fine 4): phase 2 -> 20.
    ({0, 1}, {4}, 21, False, ([(100,), (101,), (104,)], 20)),
    # the same with the EAGLE drop: 20 - 4 = 16, two blocks.
    ({0, 1}, {4}, 21, True, ([(100,), (101,)], 16)),
    # no partial key: phase 2 finds nothing; the drop makes 16 -> 12, cdiv(12, 8) = 2 blocks.
    ({0, 1}, set(), 21, True, ([(100,), (101,)], 12)),
    # max_length 19: phase 2 top = min(4 + 1, 19 // 4 = 4) = 4 -> no probe -> 16.
    ({0, 1}, {4}, 19, False, ([(100,), (101,)], 16)),
    # max_length 16: phase 1 stops at 16 // 8 = 2 blocks; top = min(5, 4) -> nothing.
    ({0, 1, 2}, {4}, 16, False, ([(100,), (101,)], 16)),
  ],
)
def test_find_full_fine(full, fine, max_length, drop, expected):
  got = rules.find_full_fine(_cached(full), _cached(fine), 8, 4, max_length, 6, drop)
  assert got == expected


def test_find_mamba_fine():
  # bs 8, HBS 4: keys at fine 1 (@8) and 4 (@20). max 21 -> 20 in block 4 // 2 = 2.
  assert rules.find_mamba_fine(_cached({1, 4}), 8, 4, 21, 6) == ([None, None, (104,)], 20)
  # max 19 -> scan from index 3: index 1 -> 8 in block 0.
  assert rules.find_mamba_fine(_cached({1, 4}), 8, 4, 19, 6) == ([(101,)], 8)
  assert rules.find_mamba_fine(_cached(set()), 8, 4, 19, 6) == ([], 0)


@pytest.mark.parametrize(
  "start, n, num_tokens, prompt, eagle, expected",
  [
    # bs 8, HBS 4: lcp = floor((22-1)/8)*8 = 16 is the first stop.
    (0, 22, 22, 22, False, 16),
    # from 16: the tail stop floor((22-1)/4)*4 = 20 (16 < 20 < 22).
    (16, 6, 22, 22, False, 4),
    # from 20 (mid-block): next edge 24 is past the end; no stop inside.
    (20, 2, 22, 22, False, 2),
    # prompt 20: tail floor(19/4)*4 = 16 = lcp -> no extra stop.
    (16, 4, 20, 20, False, 4),
    # prompt 30: lcp 24, tail 28 -> from 24 a 4-token chunk.
    (24, 6, 30, 30, False, 4),
    # a partial hit at 20 of a 40-token prompt: the next edge 24 stops first.
    (20, 20, 40, 40, False, 4),
    # EAGLE: lcp = floor(22/8)*8 - 8 = 8, tail = floor(22/4)*4 - 4 = 16: from 8 a chunk of 8.
    (8, 14, 22, 22, True, 8),
    # tail <= lcp is ignored: prompt 34, lcp 32, tail 32 -> from 24 to 32.
    (24, 10, 34, 34, False, 8),
  ],
)
def test_split_partial_stop(start, n, num_tokens, prompt, eagle, expected):
  got = rules.block_aligned_split(
    start,
    n,
    num_tokens=num_tokens,
    num_prompt_tokens=prompt,
    block_size=8,
    use_eagle=eagle,
    shared_prefix_boundary=0,
    partial_hash_block=4,
  )
  assert got == expected


def test_admission_counts_with_cow():
  ref0 = lambda b: 0  # noqa: E731
  # Mamba first allocation, hit row [0, 0, 6] (ref 0), T = 22, bs 8: req 3, n = 0 -> CoW:
  # 0 + 1 = 1, capped at 1 + S + 1 = 2 -> 1, + 1 evictable = 2 (S = 0); S = 1: req 4,
  # n = 1 -> 2, capped at 3 -> 2, + 1 = 3 (vLLM: min(num_new, physical block cap)).
  kw = dict(num_tokens_main=22, block_size=8, row_len=0, already_allocated=False)
  hits = [0, 0, 6]
  assert (
    rules.mamba_align_blocks_needed(
      num_spec_blocks=0, hits=hits, hit_ref_cnt=ref0, partial_cow=True, **kw
    )
    == 2
  )
  assert (
    rules.mamba_align_blocks_needed(
      num_spec_blocks=1, hits=hits, hit_ref_cnt=ref0, partial_cow=True, **kw
    )
    == 3
  )
  # running producer with a pending CoW, row full (req 3 = len 3): 0 -> 1, capped at 2 -> 1.
  assert (
    rules.mamba_align_blocks_needed(
      num_tokens_main=22,
      block_size=8,
      num_spec_blocks=0,
      row_len=3,
      already_allocated=True,
      hits=[],
      hit_ref_cnt=ref0,
      partial_cow=True,
    )
    == 1
  )
  # FA new request, hits [1, 2, 4] held (ref 1), 22 tokens: 3 - 3 = 0 new + 1 CoW.
  assert (
    rules.generic_blocks_needed(
      num_tokens=22,
      block_size=8,
      row_len=0,
      running=False,
      hits=[1, 2, 4],
      hit_ref_cnt=lambda b: 1,
      skipped_tokens=0,
      partial_cow=True,
    )
    == 1
  )


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


def test_sliding_window_beside_partial_hits():
  # vLLM `partial_hash_hits_enabled`: a window group whose block equals the hash block keeps
  # partial hits on (FA 8 / SWA 4 / Mamba 8, HBS 4: hits align to 4) ...
  cfg = CacheConfig(
    groups=(
      GroupSpec("full", block_size=8),
      GroupSpec("swa", block_size=4, window=8),
      GroupSpec("mamba", block_size=8),
    ),
    block_size=4,
    num_blocks=64,
  )
  assert cfg.partial_hits and cfg.hit_alignment == 4
  # ... one whose block differs turns them off for the whole model, without an error
  # (FA 4 / SWA 8 / Mamba 8, HBS 4: hits align to the scheduler block 8).
  cfg = CacheConfig(
    groups=(
      GroupSpec("full", block_size=4),
      GroupSpec("swa", block_size=8, window=8),
      GroupSpec("mamba", block_size=8),
    ),
    block_size=4,
    num_blocks=64,
  )
  assert not cfg.partial_hits and cfg.hit_alignment == 8
  # Mamba 4 = HBS: no partial hits, the window group is fine.
  cfg = CacheConfig(
    groups=(
      GroupSpec("full", block_size=8),
      GroupSpec("swa", block_size=4, window=8),
      GroupSpec("mamba", block_size=4),
    ),
    block_size=4,
    num_blocks=64,
  )
  assert not cfg.partial_hits and cfg.hit_alignment == 8
  # prefix caching off: no partial hits either.
  cfg = CacheConfig(
    groups=(GroupSpec("swa", window=8), GroupSpec("mamba", block_size=8)),
    block_size=4,
    num_blocks=64,
    enable_prefix_caching=False,
  )
  assert not cfg.partial_hits


def test_fa_prompt_tail_entry_without_partial_hits_under_eagle():
  # FA 8 + Mamba 4 (= HBS 4): no partial hits (sbs 8), but vLLM's FA manager still keys the
  # prompt tail t = floor(22/4)*4 = 20 (FA bs 8 != HBS; EAGLE reads the whole prompt). S = 1.
  # Split on the scheduler block 8: lcp = floor(22/8)*8 - 8 = 8 -> chunks 8, 14.
  # step 1: FA need 9 -> [1, 2]; Mamba req 2 + 1 -> [0, 3, 4]. Cache 8: FA 1 (@8); Mamba 3 (@8).
  # step 2: FA needs 23 -> [1, 2, 5]; Mamba req 6 + 1: the speculative block 4 moves to index
  # 5, one new block 6. Cache: floor(22, 8) = 16, FA (EAGLE) caches min(22, 16 + 8) = 22:
  # 2 (@16), and t = 20 <= 22 keys FA block 5 (primary). Mamba: no state at 16 (null).
  sc = _scenario(
    64,
    [{"op": "prefill", "req": "P"}, {"op": "free", "req": "P"}],
    use_eagle=True,
    num_speculative_tokens=1,
  )
  sc["config"]["groups"] = [{"type": "full"}, {"type": "mamba", "block_size": 4}]
  sc["config"].pop("hash_block_size")
  r = _run(sc)
  assert r[0]["chunks"] == [8, 14]
  assert r[0]["block_ids"] == [[1, 2, 5], [0, 3, 0, 0, 0, 4, 6]]
  assert r[0]["cached_blocks_per_group"] == [3, 1]
  # free: FA 5, 2, 1 keyed -> tail; Mamba 6, 4 unkeyed -> head, 3 keyed -> tail.
  assert r[1]["num_free_cached_blocks"] == 4 and r[1]["cached_blocks_per_group"] == [3, 1]
