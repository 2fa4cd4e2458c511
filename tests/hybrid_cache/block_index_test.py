"""Block index: (lanes, group) keys, duplicates with first-inserted wins, eviction."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from hybrid_cache import block_index
from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.state import init_state

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
  assert int((np.asarray(state.index_entry)[..., 0] >= 0).sum()) == n
