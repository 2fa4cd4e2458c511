"""JaxCacheManager through the host protocol: vLLM scenarios, validation, pinning, copies."""

from __future__ import annotations

import glob
import json
import os

import pytest

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.core import scheduler
from hybrid_cache.core.invariants import assert_invariants
from hybrid_cache.core.state import ReqInfo
from hybrid_cache.factory import make_manager
from hybrid_cache.types import ScheduleEntry as E

HERE = os.path.dirname(__file__)
SCENARIOS = sorted(
  p for p in glob.glob(os.path.join(HERE, "scenarios", "*.json")) if ".expected." not in p
)


@pytest.mark.parametrize("path", SCENARIOS, ids=os.path.basename)
def test_example_scenarios_match_vllm(path):
  from hybrid_cache.replay import replay

  with open(path.replace(".json", ".expected.json")) as f:
    expected = json.load(f)
  actual = replay.replay_file(path, backend="jax")
  assert replay.first_difference(expected, actual) is None


def _prefill(m, req, chunk=None):
  while True:
    v = m.request_view(req)
    if v.num_computed_tokens >= v.num_tokens:
      return
    res = m.schedule([E(req, chunk)]).entries[0]
    assert res.scheduled_tokens > 0, res
    assert_invariants(m.config, m.state)


def test_free_order_and_eviction_order_s01():
  cfg = CacheConfig(groups=(GroupSpec("full"),), block_size=16, num_blocks=11, max_model_len=160)
  m = make_manager(cfg, "jax")
  common = [0] * 16 + [1] * 16 + [2] * 16
  m.add_request("R0", common + [3] * 7)
  r0 = m.schedule([E("R0")]).entries[0]
  assert r0.hit.hit_tokens == 0 and r0.new_block_ids == ((1, 2, 3, 4),)
  m.add_request("R1", common + [3] * 5)
  r1 = m.schedule([E("R1")]).entries[0]
  assert r1.hit.hit_tokens == 48 and r1.new_block_ids == ((5,),)
  assert m.request_view("R1").block_ids == ((1, 2, 3, 5),)
  assert m.pool_stats().num_free_blocks == 5
  m.free("R0")
  m.free("R1")
  m.add_request("R2", common + [3] * 6)
  r2 = m.schedule([E("R2")]).entries[0]
  assert r2.hit.hit_tokens == 48 and r2.new_block_ids == ((5,),)
  assert m.pool_stats().num_free_blocks == 6
  m.free("R2")
  m.add_request("R3", [99] * 160)
  r3 = m.schedule([E("R3")]).entries[0]
  assert r3.new_block_ids == ((5, 4, 6, 7, 8, 9, 10, 3, 2, 1),)
  assert m.pool_stats().num_free_blocks == 0
  assert m.pool_stats().cached_blocks_per_group == (10,)
  assert_invariants(cfg, m.state)


SMALL = CacheConfig(
  groups=(GroupSpec("full"), GroupSpec("mamba")), block_size=4, num_blocks=32, max_model_len=64,
  max_requests=4,
)  # fmt: skip


def test_bad_input_raises_value_error_naming_the_field():
  m = make_manager(SMALL, "jax")
  with pytest.raises(ValueError, match="req"):
    m.add_request("", [1])
  with pytest.raises(ValueError, match="tokens"):
    m.add_request("A", [])
  with pytest.raises(ValueError, match="tokens"):
    m.add_request("A", [1, -2])
  with pytest.raises(ValueError, match="max_model_len"):
    m.add_request("A", list(range(65)))
  m.add_request("A", [1, 2, 3])
  with pytest.raises(ValueError, match="already active"):
    m.add_request("A", [1])
  with pytest.raises(ValueError, match="max_tokens"):
    m.schedule([E("A", 0)])
  with pytest.raises(ValueError, match="not an active request"):
    m.schedule([E("B")])
  with pytest.raises(ValueError, match="max_requests"):
    for name in "BCDE":
      m.add_request(name, [1])


def test_state_copy_plan_for_align_hits():
  m = make_manager(SMALL, "jax")
  m.add_request("A", list(range(20)))
  _prefill(m, "A", 8)
  m.free("A")
  m.add_request("B", list(range(16)) + [90, 91, 92])
  res = m.schedule([E("B")])
  (entry,) = res.entries
  assert entry.hit.hit_tokens == 16 and entry.scheduled_tokens == 3
  row = m.request_view("B").block_ids[1]
  # prefix-hit column (16-1)//4 = 3 is copied to the running column cdiv(19,4)-1 = 4
  assert [(c.group, c.src_block, c.dst_block) for c in res.state_copies] == [(1, row[3], row[4])]


def test_queued_request_rows_reach_the_core_in_one_batched_write():
  # appends are queued and written together before the next device call; the rows equal
  # one `register_request` per request, in any order
  m = make_manager(SMALL, "jax")
  for i, name in enumerate("ABC"):
    m.add_request(name, list(range(10 * i, 10 * i + 9)))
  assert len(m._pending) == 3
  m.schedule([E("A"), E("B"), E("C")])
  assert not m._pending
  for name in "ABC":
    m.append_tokens(name, [7, 8])
  state = m._state  # before the flush
  want = state
  for name in "CAB":
    r = m._reqs[name]
    want = scheduler.register_request(
      want, r.slot, m._hash_row(r.hashes), len(r.tokens), r.num_prompt
    )
  got = m.state  # flushes
  assert (got.req_info == want.req_info).all()
  assert (got.req_hashes == want.req_hashes).all()
  assert [int(ReqInfo(got.req_info)[m._reqs[n].slot].tokens) for n in "ABC"] == [11, 11, 11]


def test_preempt_readmits_with_a_hit_and_reset_needs_an_empty_pool():
  m = make_manager(SMALL, "jax")
  m.add_request("A", list(range(18)))
  _prefill(m, "A")
  assert not m.reset_prefix_cache()
  m.preempt("A")
  v = m.request_view("A")
  assert v.status == "preempted" and v.num_computed_tokens == 0 and v.num_real_blocks == (0, 0)
  entry = m.schedule([E("A")]).entries[0]
  assert entry.admission and entry.hit.hit_tokens == 16
  m.free("A")
  assert m.reset_prefix_cache()
  assert m.lookup(list(range(18))).hit_tokens == 0
  assert m.pool_stats().cached_blocks_per_group == (0, 0)
  assert_invariants(SMALL, m.state)


@pytest.mark.parametrize("eviction", ["greedy_dual", "lru2", "tuned"])
def test_reset_clears_every_key_column_of_the_layout(eviction):
  """`reset_prefix_cache` with the eviction clock, the access history or both (`tuned`): every
  block's `block_aux` row is the unkeyed row of its width, and nothing hits afterwards."""
  import dataclasses

  import numpy as np

  from hybrid_cache.core.state import BlockAux

  cfg = dataclasses.replace(SMALL, eviction=eviction)
  m = make_manager(cfg, "jax")
  m.add_request("A", list(range(18)))
  _prefill(m, "A")
  m.free("A")
  assert m.pool_stats().cached_blocks_per_group != (0, 0)
  assert m.reset_prefix_cache()
  aux = np.asarray(m.state.block_aux)
  assert (aux == BlockAux.NO_KEY[: aux.shape[-1]]).all()
  assert m.lookup(list(range(18))).hit_tokens == 0
  assert_invariants(cfg, m.state)


def test_batch_sizes_compile_once_per_power_of_two():
  m = make_manager(SMALL, "jax")
  for name in "ABC":
    m.add_request(name, list(range(10)))
  before = scheduler.schedule_step.cache_size(SMALL)
  m.schedule([E("A", 4)])
  m.schedule([E("A", 4), E("B", 4)])
  m.schedule([E("A", 1), E("B", 4), E("C", 4)])
  m.schedule([E("C", 1), E("B", 1), E("A", 1)])
  assert scheduler.schedule_step.cache_size(SMALL) - before <= 3  # sizes 1, 2, 4


PIN = CacheConfig(
  groups=(GroupSpec("full"), GroupSpec("swa", window=8)), block_size=4, num_blocks=40,
  max_model_len=128, max_requests=8,
)  # fmt: skip
PREFIX = list(range(100, 124))


def _pinned_history(cfg):
  """A (24 tokens, chunks of 8) drops SWA blocks 0-1 while running; then D is freed."""
  m = make_manager(cfg, "jax")
  m.add_request("A", PREFIX)
  _prefill(m, "A", 8)
  m.free("A")
  m.add_request("D", list(range(300, 320)))
  _prefill(m, "D")
  m.free("D")
  return m


@pytest.mark.parametrize("pinning,expected_hit", [(False, 0), (True, 8)])
def test_pinning_keeps_a_dropped_swa_prefix_hittable(pinning, expected_hit):
  m = _pinned_history(PIN.replace(pinning=pinning))
  # A's dropped SWA 0-1, then finish pins: A full 0-5 + SWA 4-5, D full 0-4 + SWA 3-4
  assert m.pool_stats().num_pinned_blocks == (2 + 8 + 7 if pinning else 0)
  m.add_request("E", list(range(500, 540)))  # 20 blocks: evicts past the unused ones
  _prefill(m, "E")
  # vllm profile: A's dropped SWA blocks sat first in the cached tail and were evicted;
  # pinned: they wait behind every normal free block.
  assert m.lookup(PREFIX[:8] + [1, 2, 3]).hit_tokens == expected_hit
  assert_invariants(m.config, m.state)


def test_pinned_blocks_are_demoted_oldest_first_when_capacity_needs_them():
  m = _pinned_history(PIN.replace(pinning=True))
  stats = m.pool_stats()
  assert stats.num_free_blocks == 39 and stats.num_pinned_blocks == 17
  m.add_request("F", list(range(600, 676)))  # 19 + 19 = 38 blocks > 22 unpinned free
  entry = m.schedule([E("F")]).entries[0]
  assert entry.scheduled_tokens == 76 and entry.reason is None
  stats = m.pool_stats()
  assert stats.num_pinned_blocks == 1 and stats.num_free_blocks == 1
  # the 16 oldest pins are demoted and evicted, leaving only D's SWA block 3
  assert m.lookup(PREFIX[:4] + [1, 2]).per_group_hit_tokens == (0, 0)
  assert m.lookup(list(range(300, 316)) + [1]).per_group_hit_tokens[0] == 0
  assert_invariants(m.config, m.state)
