"""Block pool: vLLM free-queue order (S01), head/tail freeing, touch, pinned tier."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.core import block_pool
from hybrid_cache.core.fresh_state import init_state
from hybrid_cache.core.state import BIG

CFG = CacheConfig(groups=(GroupSpec("full"),), block_size=4, num_blocks=11, max_model_len=64)


def _queue(state) -> list[int]:
  """Normal free queue, head first."""
  k = np.asarray(state.free_key)
  ids = np.nonzero(k < BIG)[0]
  return ids[np.argsort(k[ids])].tolist()


def _pop(state, n):
  state, ids = block_pool.pop_many(state, jnp.int32(n), 16)
  return state, np.asarray(ids[:n]).tolist()


def _pop_loop(state, n):
  row = jnp.zeros((16,), jnp.int32)
  state, row = block_pool.pop_into(state, row, jnp.int32(0), jnp.int32(n))
  return state, np.asarray(row[:n]).tolist()


def test_initial_order_and_pop_from_head():
  state = init_state(CFG)
  assert _queue(state) == list(range(1, 11))
  state, got = _pop(state, 3)
  assert got == [1, 2, 3]
  assert int(block_pool.num_free(state)) == 7
  assert np.asarray(state.ref_cnt)[[1, 2, 3]].tolist() == [1, 1, 1]


def test_unhashed_to_head_in_batch_order_hashed_to_tail():
  state = init_state(CFG)
  state, _ = _pop(state, 4)  # 1..4 held
  # 2 and 4 carry keys: they go to the tail; 3 and 1 (no key) to the head, order kept
  state = state.replace(block_group=state.block_group.at[jnp.asarray([2, 4])].set(0))
  ids = jnp.asarray([4, 3, 2, 1])  # a request frees tail first
  state = block_pool.free_ordered(state, ids, jnp.zeros((4,), jnp.int32))
  assert _queue(state) == [3, 1, 5, 6, 7, 8, 9, 10, 4, 2]


def test_later_batch_lands_in_front():
  state = init_state(CFG)
  state, _ = _pop(state, 4)
  state = block_pool.free_ordered(state, jnp.asarray([2, 1, 4, 3]), jnp.asarray([0, 0, 1, 1]))
  assert _queue(state)[:4] == [4, 3, 2, 1]


def test_touch_unlinks_and_shared_block_freed_once():
  state = init_state(CFG)
  state, _ = _pop(state, 2)
  state = block_pool.touch(state, jnp.asarray([1, 0]))
  assert int(state.ref_cnt[1]) == 2
  state = block_pool.free_ordered(state, jnp.asarray([1]), jnp.zeros((1,), jnp.int32))
  assert int(state.ref_cnt[1]) == 1 and 1 not in _queue(state)
  # touching a free block takes it out of the queue
  state = block_pool.touch(state, jnp.asarray([5]))
  assert 5 not in _queue(state) and int(block_pool.num_free(state)) == 7


def test_pinned_blocks_are_free_capacity_and_taken_last_oldest_first():
  state = init_state(CFG)
  state, _ = _pop(state, 10)
  state = block_pool.pin(state, jnp.asarray([3, 7]))
  state = block_pool.free_ordered(state, jnp.asarray([7, 3, 1]), jnp.zeros((3,), jnp.int32))
  assert int(block_pool.num_free(state)) == 3
  assert _queue(state) == [1]
  state, got = _pop(state, 3)
  assert got == [1, 7, 3]  # normal queue first, then pinned oldest first (demotion)
  assert int(block_pool.num_free(state)) == 0


def test_vectorised_pop_equals_the_per_block_loop():
  state = init_state(CFG)
  state, _ = _pop(state, 10)
  state = block_pool.pin(state, jnp.asarray([2, 9]))
  state = state.replace(block_group=state.block_group.at[jnp.asarray([4, 6])].set(0))
  order = jnp.asarray([9, 8, 7, 6, 5, 4, 3, 2, 1, 10])
  state = block_pool.free_ordered(state, order, jnp.asarray([0, 0, 0, 1, 1, 1, 1, 1, 2, 2]))
  for n in (0, 1, 4, 8, 10):
    a_state, a = _pop(state, n)
    b_state, b = _pop_loop(state, n)
    assert a == b
    assert np.array_equal(np.asarray(a_state.queue_key), np.asarray(b_state.queue_key))
    assert np.array_equal(np.asarray(a_state.ref_cnt), np.asarray(b_state.ref_cnt))


def test_renormalising_keys_keeps_the_queue_order():
  from hybrid_cache.core.state import Counters

  state = init_state(CFG)
  state, _ = _pop(state, 6)
  state = block_pool.pin(state, jnp.asarray([2]))
  state = state.replace(block_group=state.block_group.at[jnp.asarray([4, 6])].set(0))
  state = block_pool.free_ordered(state, jnp.asarray([6, 5, 4, 3, 2]), jnp.zeros((5,), jnp.int32))
  before = _queue(state)
  far = state.replace(counters=Counters(state.counters).set(tail_key=block_pool.RENORM_LIMIT + 5))
  after = block_pool.maybe_renormalise(far)
  assert _queue(after) == before
  assert int(after.head_key) == 1 and int(after.tail_key) == len(before) + 1
  state2, got = _pop(after, 3)
  assert got == before[:3]
  # untouched when the counters are far from the limit
  same = block_pool.maybe_renormalise(state)
  assert np.array_equal(np.asarray(same.queue_key), np.asarray(state.queue_key))


def test_renormalising_keeps_a_re_keying_policys_recency_order_below_the_new_tail():
  """With a re-keying eviction policy the recency row (written with the queue keys at every
  free) is re-packed with them: the same LRU order, as ranks 1..n below the new tail key."""
  from hybrid_cache.core.state import Counters

  state = init_state(CFG.replace(eviction="deepest_first"))
  state, _ = _pop(state, 6)
  state = block_pool.free_ordered(state, jnp.asarray([6, 5, 4, 3, 2]), jnp.zeros((5,), jnp.int32))
  queued = np.asarray(state.free_key) < BIG
  rec_before = np.asarray(state.free_recency)
  far = state.replace(counters=Counters(state.counters).set(tail_key=block_pool.RENORM_LIMIT + 5))
  after = block_pool.maybe_renormalise(far)
  rec = np.asarray(after.free_recency)
  ids = np.nonzero(queued)[0]
  assert list(ids[np.argsort(rec[ids])]) == list(ids[np.argsort(rec_before[ids])])
  assert sorted(rec[ids].tolist()) == list(range(1, len(ids) + 1))
  assert int(after.tail_key) == len(ids) + 1 and (rec[~queued] == BIG).all()
