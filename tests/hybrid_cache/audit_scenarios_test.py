"""Audit scenarios: replay outputs checked against values derived by hand from the brief.

Every expected number below was derived step by step from `shared/reference/vllm_hybrid_cache.md`
(the section is named next to each derivation), not read off the code under test. The scenarios
exercise parts of the scenario format that the four real vLLM examples do not: retention 0 and
k*B, SWA windows with a coarser full-attention block, chunked prefill under a window, `all` mode,
preemption and re-admission, `reset_prefix_cache`, several entries sharing one token budget.

The PARTIAL scenario checks fine-grained (partial) hits, which vLLM enables when a Mamba
`align` group's block is larger than the hash block (§2.5).
"""

import json

import pytest

from hybrid_cache.replay import replay as replay_lib
from hybrid_cache.replay import scenario as scenario_lib

BACKENDS = ["reference", pytest.param("jax", marks=pytest.mark.slow)]


def _results(sc, backend="reference"):
  return replay_lib.replay(sc, backend)["results"]


def _sc(config, prompts, actions):
  return {"name": "audit", "config": config, "prompts": prompts, "actions": actions}


# ---------------------------------------------------------------------------------------------
# SWA, retention 0 (§2.3.4, §6.2, S24), chunked prefill under the window (§2.1, §2.3.3, §1.6)
# ---------------------------------------------------------------------------------------------

SWA_R0 = _sc(
  {
    "block_size": 8,
    "num_blocks": 64,
    "groups": [{"type": "full", "block_size": 32}, {"type": "swa", "window": 8}],
    "retention_interval": 0,
  },
  {"A": {"range": [0, 128]}, "A96": {"range": [0, 96]}},
  [
    {"op": "prefill", "req": "A", "chunk": 32},
    {"op": "free", "req": "A"},
    {"op": "lookup", "req": "A"},
    {"op": "lookup", "req": "A96"},
    {"op": "prefill", "req": "A", "chunk": 32},
    {"op": "free", "req": "A"},
  ],
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_swa_retention0_chunked_prefill_and_replay(backend):
  # sbs = lcm(32, 8) = 32, HBS = 8, SWA need = cdiv(7, 8) = 1. Chunks of 32 (no align group).
  # Step k starts with remove_skipped(c): skipped = c - 7 -> blocks (c-7)//8 freed deepest
  # first; unhashed (R=0 keeps only the replay-boundary tail) -> free-queue head.
  #  step1 c=0:  FA [1], SWA [2,3,4,5]; FA key on 1.
  #  step2 c=32: free SWA idx 2,1,0 = 4,3,2 -> queue [4,3,2,6,..]; FA pops 4; SWA pops 3,2,6,7.
  #  step3 c=64: free idx 6..3 = 6,2,3,5 -> [6,2,3,5,8,..]; FA 6; SWA 2,3,5,8. n=96: the R=0
  #              replay boundary b=127 -> a=floor(127,32)=96, end=12 -> SWA idx 11 (block 8).
  #  step4 c=96: free idx 10..7 = 5,3,2,7 -> FA 5; SWA 3,2,7,9.
  r = _results(SWA_R0, backend)
  p = r[0]
  assert p["chunks"] == [32, 32, 32, 32]
  assert p["block_ids"] == [[1, 4, 6, 5], [0] * 11 + [8, 3, 2, 7, 9]]
  assert p["num_real_blocks"] == [4, 5]
  assert p["num_free_blocks"] == 54 and p["num_used_blocks"] == 9
  assert p["cached_blocks_per_group"] == [4, 1]
  # free: 4 FA keys + SWA block 8 stay as evictable cached blocks.
  assert r[1]["num_free_blocks"] == 63 and r[1]["num_free_cached_blocks"] == 5
  # replay lookup, max_len 127: FA 3 blocks (96); SWA scan from idx 14: idx 11 cached, right
  # edge 96 is 32-aligned, run 1 >= need -> 96 (S24).
  lk = r[2]
  assert (lk["hit_tokens"], lk["per_group_hit_tokens"]) == (96, [96, 96])
  assert lk["hit_blocks_per_group"] == [3, 1] and lk["shared_prefix_boundary"] == 0
  # 96-token prefix, max_len 95: FA 64; SWA has no tail at 64 -> 0; junction = 64 (§4.4).
  lk = r[3]
  assert (lk["hit_tokens"], lk["per_group_hit_tokens"]) == (0, [64, 0])
  assert lk["shared_prefix_boundary"] == 64
  # Replay prefill: hit 96, one 32-token chunk. Free queue after the first free:
  # [9,7,2,3,10..63, 5,6,4,1, 8] (SWA scratch at the head, keyed blocks at the tail).
  # FA pops 9 for block 3 (its key duplicates block 5's, which stays cached: no de-dup, §1.5).
  p = r[4]
  assert p["hit_tokens"] == 96 and p["chunks"] == [32]
  assert p["block_ids"] == [[1, 4, 6, 9], [0] * 11 + [8, 7, 2, 3, 10]]
  assert p["cached_blocks_per_group"] == [5, 1]
  assert r[5]["num_free_cached_blocks"] == 6


@pytest.mark.parametrize("backend", BACKENDS)
def test_swa_retention_interval_keeps_segment_tails_and_replay_boundary(backend):
  # S23 as a scenario: R=64, per = 64/8 = 8, need 1 -> segment tails idx 7, 15; replay
  # boundary 127 -> idx 11. FA caches its 4 blocks. The replay hits 96 on SWA idx 11.
  sc = json.loads(json.dumps(SWA_R0))
  sc["config"]["retention_interval"] = 64
  sc["actions"] = [
    {"op": "prefill", "req": "A"},
    {"op": "free", "req": "A"},
    {"op": "lookup", "req": "A"},
  ]
  r = _results(sc, backend)
  assert r[0]["chunks"] == [128]
  assert r[0]["cached_blocks_per_group"] == [4, 3]
  assert r[0]["num_used_blocks"] == 4 + 16  # one chunk: nothing skipped before it
  assert r[1]["num_free_cached_blocks"] == 7
  assert (r[2]["hit_tokens"], r[2]["hit_blocks_per_group"]) == (96, [3, 1])


# ---------------------------------------------------------------------------------------------
# Mamba align, retention 0 (§2.4.3-2.4.7, §4.3, §4.4)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_mamba_align_retention0_and_junction(backend):
  sc = _sc(
    {
      "block_size": 4,
      "num_blocks": 64,
      "groups": [{"type": "full"}, {"type": "mamba"}],
      "retention_interval": 0,
    },
    {"A": {"range": [0, 24]}, "A17": {"range": [0, 17]}},
    [
      {"op": "prefill", "req": "A", "chunk": 8},
      {"op": "free", "req": "A"},
      {"op": "lookup", "req": "A"},
      {"op": "lookup", "req": "A17"},
      {"op": "prefill", "req": "A17"},
      {"op": "free", "req": "A17"},
      {"op": "lookup", "req": "A17"},
    ],
  )
  r = _results(sc, backend)
  # Split (§4.3, lcp = floor(23, 4) = 20): 0->8, 8->16 (aligned), 16->20 (cut at lcp), 20->24.
  # Mamba rows: [0,3] -> [0,3,0,6] (last_state 1) -> c=16 frees 3, [0,0,0,6,7] -> c=20 frees
  # idx 3 (6), [0,0,0,0,7,8]. R=0 mask: only idx floor(23,4)/4-1 = 4 (block 7, state at 20).
  p = r[0]
  assert p["chunks"] == [8, 8, 4, 4]
  assert p["block_ids"][1] == [0, 0, 0, 0, 7, 8]
  assert p["cached_blocks_per_group"] == [6, 1]
  assert p["num_used_blocks"] == 8
  lk = r[2]  # max_len 23: FA 20 (5 blocks), Mamba idx 4 -> 20
  assert (lk["hit_tokens"], lk["per_group_hit_tokens"], lk["hit_blocks_per_group"]) == (
    20,
    [20, 20],
    [5, 1],
  )
  lk = r[3]  # max_len 16: FA 16; no Mamba state at 16/12/8/4 -> 0; junction 16
  assert (lk["hit_tokens"], lk["per_group_hit_tokens"], lk["shared_prefix_boundary"]) == (
    0,
    [16, 0],
    16,
  )
  # A17: junction 16 = lcp floor(16,4) -> chunks 16, 1. Its R=0 boundaries {16, 16} keep
  # Mamba idx 3 (state at 16). FA re-registers blocks 0-3 as duplicates: 6 + 4 = 10 keys.
  p = r[4]
  assert p["chunks"] == [16, 1] and p["shared_prefix_boundary"] == 16
  assert p["cached_blocks_per_group"] == [10, 2]
  lk = r[6]
  assert (lk["hit_tokens"], lk["per_group_hit_tokens"], lk["shared_prefix_boundary"]) == (
    16,
    [16, 16],
    0,
  )


# ---------------------------------------------------------------------------------------------
# decode, preempt, re-admission, reset (§2.4.4, §4.1, §4.6, §1.6, S37)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_preempt_readmit_and_reset(backend):
  sc = _sc(
    {"block_size": 4, "num_blocks": 64, "groups": [{"type": "full"}, {"type": "mamba"}]},
    {"A": {"range": [0, 10]}},
    [
      {"op": "prefill", "req": "A"},
      {"op": "decode", "req": "A", "tokens": [50, 51, 52]},
      {"op": "preempt", "req": "A"},
      {"op": "state"},
      {"op": "prefill", "req": "A"},
      {"op": "reset_prefix_cache"},
      {"op": "free", "req": "A"},
      {"op": "reset_prefix_cache"},
      {"op": "lookup", "req": "A"},
    ],
  )
  r = _results(sc, backend)
  # Prefill 10: lcp = 8 -> chunks 8, 2; Mamba [0,3] then [0,3,5] (state 8 cached at idx 1).
  assert r[0]["chunks"] == [8, 2]
  assert r[0]["block_ids"] == [[1, 2, 4], [0, 3, 5]]
  assert r[0]["cached_blocks_per_group"] == [2, 1]
  # Decode 50 (c=10): frees idx 1 (block 3, keyed -> tail); decode 51 reaches 12: FA block 2
  # and Mamba idx 2 (block 5, state at 12) keyed; decode 52 (T=13) adds FA 6 / Mamba 7.
  d = r[1]
  assert d["ok"] and d["num_tokens"] == 13 and d["num_computed_tokens"] == 13
  assert d["block_ids"] == [[1, 2, 4, 6], [0, 0, 5, 7]]
  assert d["cached_blocks_per_group"] == [3, 2] and d["num_free_cached_blocks"] == 1
  # Preempt frees everything; computed back to 0; tokens kept (13).
  assert r[2]["num_free_blocks"] == 63 and r[2]["num_free_cached_blocks"] == 5
  st = r[3]["active"]["A"]
  assert (st["num_computed_tokens"], st["num_tokens"]) == (0, 13)
  # Re-admission looks up all 13 tokens (max_len 12): FA 12, Mamba state at 12 -> hit 12;
  # start 12 >= max(num_prompt 10, N-1 12): split unchanged -> 1 token.
  p = r[4]
  assert (p["hit_tokens"], p["per_group_hit_tokens"], p["chunks"]) == (12, [12, 12], [1])
  assert p["num_computed_tokens"] == 13
  assert r[5]["ok"] is False  # a request still holds blocks
  assert r[7]["ok"] is True and r[7]["cached_blocks_per_group"] == [0, 0]
  assert r[8]["hit_tokens"] == 0 and r[8]["per_group_hit_tokens"] == [0, 0]


# ---------------------------------------------------------------------------------------------
# one step, several entries, shared token budget (§4.2, §4.3, §1.7)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_schedule_shares_budget_and_align_split_can_yield_zero(backend):
  sc = _sc(
    {
      "block_size": 4,
      "num_blocks": 64,
      "groups": [{"type": "full"}, {"type": "mamba"}],
      "max_num_batched_tokens": 10,
    },
    {"A": {"range": [0, 12]}, "B": {"range": [100, 112]}},
    [
      {"op": "schedule", "entries": [{"req": "A"}, {"req": "B"}]},
      {"op": "schedule", "entries": [{"req": "A"}, {"req": "B"}]},
      {"op": "schedule", "entries": [{"req": "B"}]},
      {"op": "schedule", "entries": [{"req": "B"}]},
    ],
  )
  r = _results(sc, backend)
  # Step 1: A n=min(12,10)=10 -> end 10 >= lcp 8 -> cut at 8. B gets 2 tokens of budget:
  # end 2 < lcp 8 -> floor(2,4) = 0 -> not scheduled.
  a, b = r[0]["entries"]
  assert (a["scheduled_tokens"], a["num_computed_tokens"]) == (8, 8)
  assert b["scheduled_tokens"] == 0 and b["num_computed_tokens"] == 0
  # Step 2: A 4 (reaches 12), budget 6 left: B end 6 < 8 -> 4.
  a, b = r[1]["entries"]
  assert (a["scheduled_tokens"], b["scheduled_tokens"]) == (4, 4)
  # FA keys: A 3 + B 1; Mamba keys: A states 8, 12 + B state 4.
  assert r[1]["cached_blocks_per_group"] == [4, 3]
  assert r[2]["entries"][0]["scheduled_tokens"] == 4  # 4 -> 8 (cut at lcp 8)
  assert r[3]["entries"][0]["scheduled_tokens"] == 4  # 8 -> 12
  # B's state at 4 (block 7) was freed at c=8 and keeps its key (§2.4.4).
  assert r[3]["cached_blocks_per_group"] == [6, 5] and r[3]["num_free_cached_blocks"] == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_full_attention_hits_blocks_cached_earlier_in_the_same_step(backend):
  # §1.7: attention tolerates a same-step hit (only Mamba defers, §2.4.6).
  sc = _sc(
    {"block_size": 4, "num_blocks": 64, "groups": [{"type": "full"}]},
    {"A": {"range": [0, 12]}, "B": {"concat": [{"range": [0, 8]}, [500, 501, 502]]}},
    [{"op": "schedule", "entries": [{"req": "A"}, {"req": "B"}]}],
  )
  a, b = _results(sc, backend)[0]["entries"]
  assert a["new_block_ids"] == [[1, 2, 3]]
  assert (b["hit_tokens"], b["hit_blocks_per_group"], b["scheduled_tokens"]) == (8, [2], 3)
  assert b["new_block_ids"] == [[4]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_mamba_all_mode_keeps_a_state_at_every_block(backend):
  # `all` mode (§2.4.1, §2.1): no split, every block real and keyed when full; blocks before
  # (c-1)//B are freed at the next allocation (keyed -> evictable).
  sc = _sc(
    {
      "block_size": 4,
      "num_blocks": 64,
      "groups": [{"type": "full"}, {"type": "mamba", "mode": "all"}],
    },
    {"A": {"range": [0, 18]}, "A13": {"concat": [{"range": [0, 12]}, [900]]}},
    [
      {"op": "prefill", "req": "A", "chunk": 8},
      {"op": "free", "req": "A"},
      {"op": "lookup", "req": "A"},
      {"op": "lookup", "req": "A13"},
    ],
  )
  r = _results(sc, backend)
  # c=0: [3,4] keyed; c=8: free idx 0, [0,4,7,8] keyed to 16; c=16: free idx 2,1 -> [0,0,0,8,10].
  assert r[0]["chunks"] == [8, 8, 2]
  assert r[0]["block_ids"][1] == [0, 0, 0, 8, 10]
  assert r[0]["cached_blocks_per_group"] == [4, 4]
  assert r[0]["num_free_cached_blocks"] == 3
  assert (r[2]["hit_tokens"], r[2]["hit_blocks_per_group"]) == (16, [4, 1])
  assert (r[3]["hit_tokens"], r[3]["hit_blocks_per_group"]) == (12, [3, 1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_chat_follow_up_under_retention0(backend):
  sc = _sc(
    {
      "block_size": 4,
      "num_blocks": 64,
      "groups": [{"type": "full"}, {"type": "mamba"}],
      "retention_interval": 0,
    },
    {
      "T1": {"range": [100, 118]},
      "OUT1": {"range": [900, 907]},
      "T2": {"concat": ["T1", "OUT1", {"range": [200, 205]}]},
    },
    [
      {"op": "prefill", "req": "T1"},
      {"op": "decode", "req": "T1", "tokens": "OUT1"},
      {"op": "free", "req": "T1"},
      {"op": "lookup", "req": "T2"},
      {"op": "prefill", "req": "T2"},
      {"op": "free", "req": "T2"},
      {"op": "lookup", "req": "T2"},
    ],
  )
  r = _results(sc, backend)
  # T1 (18): lcp 16 -> chunks 16, 2; R=0 keeps only Mamba idx floor(17,4)/4-1 = 3 (state 16).
  # Decoding to 25 tokens crosses 20 and 24 but R=0 masks those states (§2.4.7); FA keys
  # every full block: floor(25, 4)/4 = 6.
  assert r[0]["chunks"] == [16, 2] and r[0]["cached_blocks_per_group"] == [4, 1]
  assert r[1]["cached_blocks_per_group"] == [6, 1]
  # T2 (30, max_len 29): FA 24 (T1+OUT1 prefix), Mamba 16 -> hit 16, junction 24.
  lk = r[3]
  assert (lk["hit_tokens"], lk["per_group_hit_tokens"], lk["shared_prefix_boundary"]) == (
    16,
    [24, 16],
    24,
  )
  # Split from 16 (lcp floor(29,4) = 28, junction 24): 16->24, 24->28, 28->30. R=0 keeps the
  # states at the junction (idx 5) and the replay boundary 28 (idx 6); FA adds dups of
  # blocks 4, 5 and block 6: 6 + 3 = 9.
  p = r[4]
  assert p["chunks"] == [8, 4, 2]
  assert p["block_ids"][1] == [0, 0, 0, 0, 0, 0, 12, 14]
  assert p["cached_blocks_per_group"] == [9, 3]
  assert (r[6]["hit_tokens"], r[6]["per_group_hit_tokens"]) == (28, [28, 28])


@pytest.mark.parametrize("backend", BACKENDS)
def test_three_groups_retention0_junction(backend):
  # FA + SWA(W=8, need 2) + Mamba, block 4, R=0 (§3.2, §2.3.4, §2.4.7, §4.4).
  sc = _sc(
    {
      "block_size": 4,
      "num_blocks": 96,
      "groups": [{"type": "full"}, {"type": "swa", "window": 8}, {"type": "mamba"}],
      "retention_interval": 0,
    },
    {
      "P": {"range": [0, 16]},
      "A": {"concat": ["P", [100, 101, 102, 103, 104, 105]]},
      "B": {"concat": ["P", [200, 201, 202, 203, 204, 205, 206]]},
      "C": {"concat": ["P", [300, 301, 302, 303, 304]]},
    },
    [
      {"op": "prefill", "req": "A"},
      {"op": "free", "req": "A"},
      {"op": "lookup", "req": "B"},
      {"op": "prefill", "req": "B"},
      {"op": "free", "req": "B"},
      {"op": "lookup", "req": "C"},
    ],
  )
  r = _results(sc, backend)
  # A (22): chunks 20 (lcp floor(21,4)), 2. R=0, boundary 21 -> a = 20: SWA keeps the need=2
  # blocks ending at 20 (idx 3, 4), Mamba idx 4. FA floor(22,4)/4 = 5.
  assert r[0]["chunks"] == [20, 2] and r[0]["cached_blocks_per_group"] == [5, 2, 1]
  # B (23, max_len 22): FA 16; SWA at 16 needs idx 2,3 but idx 2 was not kept -> 0
  # (a run from block 0 would need idx 0,1,2 ... none kept); Mamba 0. Junction 16.
  lk = r[2]
  assert (lk["hit_tokens"], lk["per_group_hit_tokens"], lk["shared_prefix_boundary"]) == (
    0,
    [16, 0, 0],
    16,
  )
  # B: chunks cut at the junction 16, then lcp 20, then the tail. Boundaries {22 -> 20, 16}:
  # SWA keeps idx {3, 4} and {2, 3}; Mamba idx 4 and 3.
  assert r[3]["chunks"] == [16, 4, 3]
  assert r[3]["cached_blocks_per_group"] == [10, 5, 3]
  # C (21, max_len 20): FA 16; SWA idx 2, 3 (B's) -> 16; Mamba idx 3 (B's) -> 16.
  lk = r[5]
  assert (lk["hit_tokens"], lk["per_group_hit_tokens"], lk["hit_blocks_per_group"]) == (
    16,
    [16, 16, 16],
    [4, 2, 1],
  )


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_block_sizes_swa_tail_mask_through_decode(backend):
  # FA block 8, SWA block 4 window 4: sbs 8, HBS 4, need cdiv(3,4) = 1, per = 8/4 = 2 ->
  # dense mask keeps odd SWA blocks only (§2.3.4); caching floored to 8 (§1.7).
  sc = _sc(
    {
      "block_size": 4,
      "num_blocks": 64,
      "groups": [{"type": "full", "block_size": 8}, {"type": "swa", "window": 4}],
    },
    {"A": {"range": [0, 20]}, "Ax": {"concat": ["A", [50, 51, 52, 53, 54, 99]]}},
    [
      {"op": "prefill", "req": "A"},
      {"op": "decode", "req": "A", "tokens": [50, 51, 52, 53, 54]},
      {"op": "free", "req": "A"},
      {"op": "lookup", "req": "Ax"},
    ],
  )
  r = _results(sc, backend)
  # Prefill 20: n = 16 -> FA blocks 0,1; SWA idx 1, 3.
  assert r[0]["block_ids"] == [[1, 2, 3], [4, 5, 6, 7, 8]]
  assert r[0]["cached_blocks_per_group"] == [2, 2]
  # Decode 50 (c=20): skipped 17 -> SWA idx 3..0 freed (6, 4 unkeyed -> head); new SWA
  # block pops 6. Decode 53 (c=23): skipped 20 -> idx 4 (8, unkeyed) freed; n = 24 keys FA
  # block 2 and SWA idx 5. Decode 54 (T=25): FA pops 8, SWA pops 4.
  d = r[1]
  assert d["block_ids"] == [[1, 2, 3, 8], [0, 0, 0, 0, 0, 6, 4]]
  assert d["cached_blocks_per_group"] == [3, 3]
  # Ax (26, max_len 25): FA 3 blocks (24); SWA idx 5 cached, right edge 24 aligned -> 24.
  assert (r[3]["hit_tokens"], r[3]["hit_blocks_per_group"]) == (24, [3, 1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_full_sequence_must_fit_false_admits_then_runs_out(backend):
  # 7 usable blocks, a 40-token prompt (10 blocks) in chunks of 8 (§4.2 step 3).
  prompts = {"A": {"range": [0, 40]}}
  actions = [{"op": "prefill", "req": "A", "chunk": 8}]
  cfg = {"block_size": 4, "num_blocks": 8, "groups": [{"type": "full"}]}
  fit = _results(_sc(cfg, prompts, actions), backend)[0]
  assert (fit["ok"], fit["chunks"], fit["failure"]) == (False, [0], "allocate_slots_failed")
  lax = _results(_sc({**cfg, "full_sequence_must_fit": False}, prompts, actions), backend)[0]
  # 2 blocks per step: 7 -> 5 -> 3 -> 1 free; the 4th chunk needs 2.
  assert (lax["ok"], lax["chunks"], lax["num_computed_tokens"]) == (False, [8, 8, 8, 0], 24)
  assert lax["num_free_blocks"] == 1


# ---------------------------------------------------------------------------------------------
# differences from vLLM 0.33 found by the audit (now implemented)
# ---------------------------------------------------------------------------------------------


def test_watermark_is_a_fraction_of_the_pool():
  # int(0.1 * 32) = 3 watermark blocks, applied to a waiting request while another runs.
  # A holds 10 blocks -> 21 free; B needs 20 + 3 > 21 -> refused; C needs 18 + 3 = 21 -> ok.
  sc = _sc(
    {"block_size": 4, "num_blocks": 32, "groups": [{"type": "full"}], "watermark": 0.1},
    {"A": {"range": [0, 40]}, "B": {"range": [100, 180]}, "C": {"range": [200, 272]}},
    [{"op": "prefill", "req": "A"}, {"op": "prefill", "req": "B"}, {"op": "prefill", "req": "C"}],
  )
  r = _results(sc)
  assert r[1]["ok"] is False and r[1]["failure"] == "allocate_slots_failed"
  assert r[2]["ok"] is True


PARTIAL = _sc(
  {
    "block_size": 4,
    "num_blocks": 64,
    "groups": [{"type": "full"}, {"type": "mamba", "block_size": 8}],
  },
  {
    "A": {"range": [0, 20]},
    "Ax": {"concat": ["A", [900, 901, 902]]},
    "B": {"range": [0, 13]},
  },
  [
    {"op": "prefill", "req": "A"},
    {"op": "free", "req": "A"},
    {"op": "lookup", "req": "B"},
    {"op": "lookup", "req": "Ax"},
  ],
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_partial_hits_lookup_alignment_is_the_hash_block(backend):
  # Alignment = HBS = 4 (§2.5, §3.1). B (13 tokens, max_len 12): FA has blocks 0-2 -> 12
  # (not floored to sbs 8); Mamba has states only at 16 (+20) -> 0; junction 12.
  lk = _results(PARTIAL, backend)[2]
  assert lk["per_group_hit_tokens"] == [12, 0]
  assert lk["shared_prefix_boundary"] == 12


@pytest.mark.parametrize("backend", BACKENDS)
def test_partial_hits_cache_the_prompt_tail(backend):
  # A (20 tokens): chunks 16, 4. Caching is not floored: FA keys blocks 0-4 (5, not 4).
  # Mamba keys the state at 16; the prompt's checkpoint position floor((20-1)/4)*4 = 16 is a
  # block edge, so no partial entry at 20 (vLLM 0.33's real manager agrees).
  # Ax (max_len 22): FA 20, Mamba 16 -> hit 16, junction 20.
  r = _results(PARTIAL, backend)
  assert r[0]["chunks"] == [16, 4]
  assert r[0]["cached_blocks_per_group"] == [5, 1]
  assert (r[3]["hit_tokens"], r[3]["per_group_hit_tokens"]) == (16, [20, 16])
  assert r[3]["shared_prefix_boundary"] == 20


# ---------------------------------------------------------------------------------------------
# bad scenario input: a ValueError naming the field
# ---------------------------------------------------------------------------------------------

_BASE_CFG = {"block_size": 4, "num_blocks": 64, "groups": [{"type": "full"}]}


@pytest.mark.parametrize(
  "config, prompts, actions, match",
  [
    (_BASE_CFG, {"A": [-1, 2]}, [{"op": "prefill", "req": "A"}], "integers >= 0"),
    (_BASE_CFG, {"A": [1.5, 2]}, [{"op": "prefill", "req": "A"}], "integers >= 0"),
    (_BASE_CFG, {"A": []}, [{"op": "prefill", "req": "A"}], "non-empty"),
    (_BASE_CFG, {"A": [1, 2]}, [{"op": "prefill", "req": "Q"}], "prompt name"),
    (_BASE_CFG, {"A": [1, 2]}, [{"op": "lookup"}], r"actions\[0\]\.req"),
    (_BASE_CFG, {"A": [1, 2]}, [{"op": "free", "req": "Z"}], "active request"),
    (_BASE_CFG, {"A": [1, 2]}, [{"op": "prefill", "req": "A", "chunk": 0}], ">= 1"),
    (
      _BASE_CFG,
      {"A": [1, 2]},
      [{"op": "schedule", "entries": [{"req": "A"}, {"req": "A"}]}],
      "twice",
    ),
    (
      {**_BASE_CFG, "max_model_len": 8},
      {"A": list(range(10))},
      [{"op": "prefill", "req": "A"}],
      "max_model_len",
    ),
    (
      {**_BASE_CFG, "groups": [{"type": "swa"}]},
      {"A": [1, 2]},
      [{"op": "state"}],
      "window",
    ),
    (
      {**_BASE_CFG, "groups": [{"type": "mamba", "mode": "ALL"}]},
      {"A": [1, 2]},
      [{"op": "state"}],
      "mode",
    ),
    (
      {**_BASE_CFG, "groups": [{"type": "full"}, {"type": "mamba"}], "retention_interval": 6},
      {"A": [1, 2]},
      [{"op": "state"}],
      "retention_interval",
    ),
    ({**_BASE_CFG, "num_blocks": "64"}, {"A": [1, 2]}, [{"op": "state"}], "num_blocks"),
    ({**_BASE_CFG, "hash_block_size": 3}, {"A": [1, 2]}, [{"op": "state"}], "hash_block_size"),
  ],
)
def test_bad_scenario_input_raises_value_error(config, prompts, actions, match):
  with pytest.raises(ValueError, match=match):
    _results(_sc(config, prompts, actions))


@pytest.mark.parametrize("entry", [{"chunk": 4}, "A", {"req": 3}])
def test_schedule_entry_without_req_is_a_value_error(entry):
  with pytest.raises(ValueError, match=r"entries\[0\].*'req'"):
    _results(_sc(_BASE_CFG, {"A": [1, 2]}, [{"op": "schedule", "entries": [entry]}]))


@pytest.mark.parametrize("watermark", [-0.1, 1.5, "0.1", True, None])
def test_watermark_outside_zero_one_is_a_value_error(watermark):
  with pytest.raises(ValueError, match=r"config\.watermark .*\[0, 1\]"):
    scenario_lib.config_of({"config": {**_BASE_CFG, "watermark": watermark}})


def test_watermark_fraction_becomes_blocks():
  cfg = scenario_lib.config_of({"config": {**_BASE_CFG, "num_blocks": 64, "watermark": 0.05}})
  assert cfg.watermark_blocks == 3  # int(0.05 * 64)


@pytest.mark.parametrize(
  "key, value, kind", [("config", [1], "an object"), ("actions", {"op": "state"}, "a list")]
)
def test_scenario_parts_of_the_wrong_type_are_a_value_error(tmp_path, key, value, kind):
  sc = {"config": _BASE_CFG, "prompts": {"A": [1, 2]}, "actions": [{"op": "state"}], key: value}
  path = tmp_path / "bad.json"
  path.write_text(json.dumps(sc))
  with pytest.raises(ValueError, match=f"{key} must be {kind}"):
    scenario_lib.load(str(path))


def test_config_not_an_object_is_a_value_error():
  with pytest.raises(ValueError, match="config"):
    scenario_lib.config_of({"config": [1]})


@pytest.mark.parametrize(
  "config",
  [
    {**_BASE_CFG, "full_sequence_must_fit": "no"},
    {**_BASE_CFG, "groups": [{"type": "full", "eagle": "yes"}]},
  ],
)
def test_non_bool_flags_are_a_value_error(config):
  with pytest.raises(ValueError):
    scenario_lib.config_of({"config": config})


# ---------------------------------------------------------------------------------------------
# CLI: an ERROR line for bad files, the others are replayed (partial-hit configs included)
# ---------------------------------------------------------------------------------------------


def test_cli_names_bad_files_and_goes_on(tmp_path, capsys):
  good = _sc(_BASE_CFG, {"A": [1, 2, 3]}, [{"op": "lookup", "req": "A"}])
  bad = _sc({**_BASE_CFG, "watermark": 2}, {"A": [1]}, [{"op": "state"}])
  partial = {**PARTIAL, "name": "partial"}
  for name, sc in (("a_bad.json", bad), ("b_good.json", good), ("c_partial.json", partial)):
    (tmp_path / name).write_text(json.dumps(sc))
  rc = replay_lib.main([str(tmp_path), "--backend", "reference", "--out-dir", str(tmp_path / "o")])
  err = capsys.readouterr().err
  assert rc == 2  # bad input (a --check mismatch alone is 1)
  assert "ERROR" in err and "a_bad.json" in err and "config.watermark" in err
  assert "WARNING" not in err and "c_partial.json" not in err  # partial hits are implemented
  assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["b_good.json", "c_partial.json"]
