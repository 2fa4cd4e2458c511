"""Block index: (lanes, group) keys, duplicates with first-inserted wins, eviction."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.core import block_index
from hybrid_cache.core.fresh_state import init_state
from hybrid_cache.core.state import Counters
from hybrid_cache.core.state import IndexEntry

CFG = CacheConfig(
  groups=(GroupSpec("full"), GroupSpec("full")), block_size=4, num_blocks=32, max_model_len=64
)
KEYS = jnp.asarray([[11, 1], [22, 2], [11, 1]], jnp.uint32)


def _probe(state, key, group):
  return int(block_index.probe(state, jnp.asarray(key, jnp.uint32)[None], jnp.asarray([group]))[0])


def test_hit_needs_equal_lanes_and_group():
  state = init_state(CFG)
  state = block_index.insert(state, jnp.asarray([5, 6, 0]), KEYS, jnp.asarray([0, 0, 0]))
  assert _probe(state, [11, 1], 0) == 5
  assert _probe(state, [22, 2], 0) == 6
  assert _probe(state, [11, 1], 1) == -1
  assert _probe(state, [11, 2], 0) == -1


def test_duplicates_first_inserted_wins_and_survive_eviction():
  state = init_state(CFG)
  state = block_index.insert(state, jnp.asarray([5, 0, 9]), KEYS, jnp.asarray([0, 0, 0]))
  assert _probe(state, [11, 1], 0) == 5
  state = block_index.evict(state, jnp.zeros((32,), bool).at[5].set(True))
  assert _probe(state, [11, 1], 0) == 9
  assert int(state.block_group[5]) == -1
  # a later re-insert of the same key does not displace the older duplicate
  state = block_index.insert(state, jnp.asarray([3]), KEYS[:1], jnp.asarray([0]))
  assert _probe(state, [11, 1], 0) == 9


def test_many_keys_in_one_bucket_take_distinct_ways():
  state = init_state(CFG)
  n = 12
  keys = jnp.asarray([[i * 7919, i] for i in range(n)], jnp.uint32)
  state = block_index.insert(
    state, jnp.arange(1, n + 1, dtype=jnp.int32), keys, jnp.zeros((n,), jnp.int32)
  )
  found = np.asarray(block_index.probe(state, keys, jnp.zeros((n,), jnp.int32)))
  assert found.tolist() == list(range(1, n + 1))
  assert int((np.asarray(state.index_block) >= 0).sum()) == n


def _insert_model(entry, hsh, counters, ids, keys, group, block_group):
  """Plain-Python insert: keys in list order take their bucket's first empty way."""
  entry, hsh = entry.copy(), hsh.copy()
  buckets = entry.shape[0]
  seq, ovf = int(Counters(counters).next_seq), int(Counters(counters).index_overflows)
  bks = np.asarray(block_index.bucket_of(jnp.asarray(keys), jnp.asarray(group), buckets))
  for i in np.nonzero(ids > 0)[0]:
    b = bks[i]
    free = np.nonzero(IndexEntry(entry)[b].block < 0)[0]
    if len(free):
      entry = IndexEntry(entry)[b, free[0]].set(block=ids[i], seq=seq)
      hsh[b, free[0]] = keys[i]
    else:
      ovf += 1
    seq += 1
    block_group[ids[i]] = group[i]
  return entry, hsh, seq, ovf, block_group


@pytest.mark.parametrize("k", [3, 64, 65, 150, 498])
def test_insert_matches_sequential_model_with_full_buckets(k):
  # 8 buckets x 16 ways with random holes: many keys per bucket, some buckets overflow
  rng = np.random.default_rng(k)
  state = init_state(CFG)
  buckets, ways = state.index_entry.shape[:2]
  insert = jax.jit(block_index.insert)
  for trial in range(3):
    entry = np.full((buckets, ways, IndexEntry.width()), -1, np.int32)
    taken = rng.random((buckets, ways)) < 0.6
    entry = IndexEntry(entry)[taken].set(
      block=rng.integers(1, 32, int(taken.sum())), seq=rng.integers(0, 1000, int(taken.sum()))
    )
    hsh = rng.integers(0, 2**32, (buckets, ways, 2), dtype=np.uint64).astype(np.uint32)
    counters = Counters(np.zeros(Counters.width(), np.int32))
    counters = counters.set(next_seq=1000 + trial, index_overflows=trial)
    st = state.replace(
      index_entry=jnp.asarray(entry), index_hash=jnp.asarray(hsh), counters=jnp.asarray(counters)
    )
    ids = np.where(rng.random(k) < 0.7, rng.integers(1, 32, k), 0).astype(np.int32)
    keys = rng.integers(0, 2**32, (k, 2), dtype=np.uint64).astype(np.uint32)
    group = rng.integers(0, 2, k).astype(np.int32)
    got = insert(st, jnp.asarray(ids), jnp.asarray(keys), jnp.asarray(group))
    e, h, seq, ovf, bg = _insert_model(
      entry, hsh, counters, ids, keys, group, np.full(32, -1, np.int32)
    )
    np.testing.assert_array_equal(np.asarray(got.index_entry), e)
    np.testing.assert_array_equal(np.asarray(got.index_hash), h)
    assert int(got.next_seq) == seq and int(got.index_overflows) == ovf
    v = ids[ids > 0]
    if len(np.unique(v)) == len(v):  # duplicate ids: which write lands is unspecified
      np.testing.assert_array_equal(np.asarray(got.block_group), bg)
    assert ovf > trial or k < 150  # the large cases really overflow buckets


def test_contains_agrees_with_probe():
  rng = np.random.default_rng(1)
  state = init_state(CFG)
  keys = rng.integers(0, 50, (40, 2)).astype(np.uint32)  # repeated keys: duplicates
  ids = np.arange(1, 41, dtype=np.int32) % 32
  group = rng.integers(0, 2, 40).astype(np.int32)
  state = block_index.insert(state, jnp.asarray(ids), jnp.asarray(keys), jnp.asarray(group))
  state = block_index.evict(state, jnp.asarray(np.arange(32) % 5 == 0))
  queries = np.concatenate([keys, rng.integers(0, 50, (20, 2)).astype(np.uint32)])
  for g in (0, 1):
    found = block_index.probe(state, jnp.asarray(queries), jnp.full((len(queries),), g))
    got = block_index.contains(state, jnp.asarray(queries), g)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(found) >= 0)
    assert 0 < int(np.sum(np.asarray(got))) < len(queries)


@pytest.mark.parametrize("n_queries", [4, 60])  # fewer and more queries than buckets (8)
def test_probe_and_insert_with_precomputed_buckets_match(n_queries):
  """The scheduler passes buckets computed once per step; results must not change."""
  rng = np.random.default_rng(2)
  state = init_state(CFG)
  buckets = state.index_entry.shape[0]
  assert 4 < buckets < 60
  keys = rng.integers(0, 30, (40, 2)).astype(np.uint32)
  ids = np.arange(1, 41, dtype=np.int32) % 32
  group = rng.integers(0, 2, 40).astype(np.int32)
  k, g = jnp.asarray(keys), jnp.asarray(group)
  b = block_index.bucket_of(k, g, buckets)
  plain = block_index.insert(state, jnp.asarray(ids), k, g)
  given = block_index.insert(state, jnp.asarray(ids), k, g, b)
  for a, c in zip(jax.tree.leaves(plain), jax.tree.leaves(given)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
  half = n_queries // 2  # half inserted (key, group) pairs, half random
  q = jnp.asarray(
    np.concatenate([keys[:half], rng.integers(0, 30, (n_queries - half, 2))]), jnp.uint32
  )
  qg = jnp.asarray(np.concatenate([group[:half], rng.integers(0, 2, n_queries - half)]), jnp.int32)
  found = block_index.probe(plain, q, qg)
  np.testing.assert_array_equal(
    np.asarray(found),
    np.asarray(block_index.probe(plain, q, qg, block_index.bucket_of(q, qg, buckets))),
  )
  assert int(np.sum(np.asarray(found) >= 0)) > 0


@pytest.mark.parametrize("k", [129, 2048])
def test_rank_in_bucket_counts_earlier_keys_of_the_same_bucket(k):
  rng = np.random.default_rng(k)
  buckets = 16384
  bks = rng.integers(0, buckets + 1, k).astype(np.int32)
  bks[: k // 3] = rng.integers(0, 4, k // 3)  # crowded buckets
  rng.shuffle(bks)
  want = [int(np.sum(bks[:i] == b)) for i, b in enumerate(bks)]
  got = jax.jit(block_index._rank_in_bucket, static_argnums=1)(jnp.asarray(bks), buckets)
  assert np.asarray(got).tolist() == want
