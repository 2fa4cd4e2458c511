"""Coordinator and per-group finders against the vLLM catalogue (reference §3.3, §7)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_cache import hashing
from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.core import block_index
from hybrid_cache.core import coordinator
from hybrid_cache.core.fresh_state import init_state
from hybrid_cache.core.groups import full_attention
from hybrid_cache.core.groups import recurrent
from hybrid_cache.core.groups import sliding_window
from hybrid_cache.core.layout import layout


def _mask(pattern: str) -> jnp.ndarray:
  return jnp.asarray([c == "T" for c in pattern])


@pytest.mark.parametrize(
  "pattern,blocks",
  [
    ("F" * 10, 0),
    ("T", 1),
    ("TF", 1),
    ("TT", 2),
    ("TTF", 2),
    ("TTT", 3),
    ("TTTF", 3),
    ("TTFTFFTTFTTT", 12),
    ("TTFTFFTTFFF", 8),
    ("TTFTFFTTFFFT", 8),
  ],
)
def test_swa_lookup_table_s06(pattern, blocks):
  cached = _mask(pattern)
  length, _ = sliding_window.find(cached, len(pattern) * 2, jnp.bool_(False), 2, 2, need=2)
  assert int(length) == blocks * 2


def test_swa_run_must_start_aligned_s08():
  # SWA bs 16, alignment 32, need 2: blocks 0..4 cached; block 4's edge 80 is unaligned.
  cached = _mask("TTTTTFF")
  length, lo = sliding_window.find(cached, 112, jnp.bool_(False), 16, 32, need=2)
  assert (int(length), int(lo)) == (64, 2)


def test_full_attention_eagle_drop_s04():
  cached = _mask("TTTFFF")
  length, _ = full_attention.find(cached, 47, jnp.bool_(True), 16, 16)
  assert int(length) == 16


def test_recurrent_rightmost_aligned_state():
  cached = _mask("FTFFTFFF")
  assert int(recurrent.find(cached, 112, 16, 16)[0]) == 80
  assert int(recurrent.find(cached, 64, 16, 16)[0]) == 32
  assert int(recurrent.find(cached, 112, 16, 32)[0]) == 32


def _state_with(config: CacheConfig, tokens, cached: dict[int, set[int]]):
  """A fresh state whose index holds group g's blocks at positions `cached[g]`."""
  lay = layout(config)
  state = init_state(config)
  fine = hashing.block_hashes(tokens, lay.hash_block_size)
  row = np.zeros((lay.max_hashes, 2), np.uint32)
  row[: len(fine)] = fine
  hashes = jnp.asarray(row)
  next_id = 1
  for g, positions in cached.items():
    keys, _ = coordinator.group_hashes(lay, hashes, len(tokens), g)
    ids = np.zeros(lay.max_blocks, np.int32)
    for p in sorted(positions):
      ids[p] = next_id
      next_id += 1
    state = block_index.insert(
      state, jnp.asarray(ids), keys, jnp.full((lay.max_blocks,), g, jnp.int32)
    )
  return lay, state, hashes


def test_three_group_fixed_point_worked_example():
  cfg = CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("swa", window=32), GroupSpec("mamba")),
    block_size=16,
    num_blocks=64,
    max_model_len=256,
  )
  tokens = list(range(129))
  lay, state, hashes = _state_with(
    cfg, tokens, {0: set(range(7)), 1: {0, 1, 2, 3, 5, 6}, 2: {1, 4}}
  )
  out = coordinator.lookup(lay, state, hashes, jnp.int32(129))
  assert int(out["hit"]) == 32
  assert int(out["spb"]) == 112
  assert np.asarray(out["hit_mask"]).sum(axis=1).tolist() == [2, 2, 1]
  assert np.asarray(out["alone"]).tolist() == [112, 112, 80]


def test_simple_hybrid_single_pass_s13():
  cfg = CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("mamba")), block_size=16, num_blocks=64, max_model_len=256
  )
  lay, state, hashes = _state_with(cfg, list(range(113)), {0: set(range(6)), 1: {2, 4}})
  out = coordinator.lookup(lay, state, hashes, jnp.int32(113))
  assert int(out["hit"]) == 80
  assert int(out["spb"]) == 96
  assert np.asarray(out["hit_mask"]).sum(axis=1).tolist() == [5, 1]


def test_mixed_block_sizes_s08():
  cfg = CacheConfig(
    groups=(GroupSpec("full", block_size=32), GroupSpec("swa", block_size=16, window=32)),
    block_size=16,
    num_blocks=100,
    max_model_len=256,
  )
  tokens = list(range(113))
  lay, state, hashes = _state_with(cfg, tokens, {0: {0, 1, 2}, 1: set(range(6))})
  assert int(coordinator.lookup(lay, state, hashes, jnp.int32(113))["hit"]) == 96
  assert int(coordinator.lookup(lay, state, hashes, jnp.int32(97))["hit"]) == 96
  lay, state, hashes = _state_with(cfg, tokens, {0: {0, 1, 2}, 1: set(range(5))})
  assert int(coordinator.lookup(lay, state, hashes, jnp.int32(113))["hit"]) == 64


def test_merged_equal_spec_groups_need_key_in_both_s03():
  cfg = CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("swa", window=32), GroupSpec("swa", window=32)),
    block_size=16,
    num_blocks=64,
    max_model_len=128,
  )
  assert [s.members for s in layout(cfg).spec_groups] == [(0,), (1, 2)]
  tokens = list(range(53))
  lay, state, hashes = _state_with(cfg, tokens, {0: {0, 1, 2}, 1: {0, 1, 2}, 2: {0, 1, 2}})
  assert int(coordinator.lookup(lay, state, hashes, jnp.int32(53))["hit"]) == 48
  # h0 missing in SWA#2 only: the run 1..2 still satisfies need 2 -> 3 blocks (S03)
  lay, state, hashes = _state_with(cfg, tokens, {0: {0, 1, 2}, 1: {0, 1, 2}, 2: {1, 2}})
  assert int(coordinator.lookup(lay, state, hashes, jnp.int32(53))["hit"]) == 48
  # h2 missing in SWA#1 -> 2 blocks
  lay, state, hashes = _state_with(cfg, tokens, {0: {0, 1, 2}, 1: {0, 1}, 2: {0, 1, 2}})
  assert int(coordinator.lookup(lay, state, hashes, jnp.int32(53))["hit"]) == 32


def test_hit_capped_below_num_tokens():
  cfg = CacheConfig(groups=(GroupSpec("full"),), block_size=4, num_blocks=16, max_model_len=64)
  lay, state, hashes = _state_with(cfg, list(range(16)), {0: set(range(4))})
  assert int(coordinator.lookup(lay, state, hashes, jnp.int32(16))["hit"]) == 12


def test_query_keys_are_the_group_hashes_group_major():
  """`query_keys` (batched, used by the scheduler step) = `group_hashes` of each group."""
  cfg = CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("swa", window=8), GroupSpec("mamba")),
    block_size=4,
    num_blocks=64,
    max_model_len=64,
  )
  lay = layout(cfg)
  rng = np.random.default_rng(0)
  hashes = jnp.asarray(rng.integers(0, 2**32, (3, lay.max_hashes, 2), dtype=np.uint64), jnp.uint32)
  keys, grp = coordinator.query_keys(lay, hashes)
  for i in range(3):
    want = jnp.concatenate(
      [coordinator.group_hashes(lay, hashes[i], 64, g)[0] for g in range(lay.num_groups)]
    )
    np.testing.assert_array_equal(np.asarray(keys[i]), np.asarray(want))
  np.testing.assert_array_equal(np.asarray(grp), np.repeat(np.arange(3), lay.max_blocks))
