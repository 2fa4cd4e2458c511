"""Scheduler pieces: the block-aligned split (§4.3) and retention masks (S21, S22)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.core import split
from hybrid_cache.core.groups import recurrent
from hybrid_cache.core.groups import sliding_window
from hybrid_cache.core.layout import layout


def _split(cfg, start, n, num_tokens, spb, num_prompt=None, max_chunk=None):
  lay = layout(cfg)
  out = split.split(
    lay, jnp.int32(start), jnp.int32(n), jnp.int32(num_tokens),
    jnp.int32(num_prompt or num_tokens), jnp.int32(spb),
    jnp.int32(cfg.max_num_batched_tokens if max_chunk is None else max_chunk),
  )  # fmt: skip
  return int(out)


FA_MAMBA16 = CacheConfig(
  groups=(GroupSpec("full"), GroupSpec("mamba")), block_size=16, num_blocks=64, max_model_len=512
)
FA_MAMBA4 = FA_MAMBA16.replace(block_size=4)


@pytest.mark.parametrize(
  "cfg,start,n,num_tokens,spb,expected",
  [
    (FA_MAMBA16, 80, 33, 113, 96, 16),  # S13: Marconi stop at 96
    (FA_MAMBA16, 0, 48, 48, 32, 32),  # S15: junction at 32
    (FA_MAMBA4, 0, 22, 22, 0, 20),  # lcp = floor(21/4)*4 = 20
    (FA_MAMBA4, 20, 2, 22, 0, 2),  # tail after lcp
    (FA_MAMBA4, 0, 16, 16, 0, 12),  # block-aligned prompt: last cacheable boundary 12
    (FA_MAMBA4, 0, 7, 27, 0, 4),  # budget not block aligned: floor to 4
    (FA_MAMBA4, 0, 3, 27, 0, 0),  # budget cannot reach a boundary
    (FA_MAMBA4, 16, 10, 26, 0, 8),  # stops at lcp 24
    (FA_MAMBA4, 18, 100, 26, 0, 2),  # mid-block start re-aligns to the next boundary
  ],
)
def test_block_aligned_split(cfg, start, n, num_tokens, spb, expected):
  assert _split(cfg, start, n, num_tokens, spb) == expected


def test_split_leaves_decode_alone():
  assert _split(FA_MAMBA4, 30, 1, 31, 0, num_prompt=27) == 1


def test_split_eagle_backs_off_one_block():
  cfg = FA_MAMBA4.replace(use_eagle=True, num_speculative_tokens=1)
  assert _split(cfg, 0, 22, 22, 0) == 16


def test_split_advances_sub_block_when_the_block_is_wider_than_the_chunk_limit():
  # vLLM `_mamba_block_aligned_split`: with a chunk limit of 3 < block 4 a chunk from a block
  # edge cannot be floored (it would be empty): it runs 3 tokens, then re-aligns at 4.
  assert _split(FA_MAMBA4, 0, 3, 27, 0, max_chunk=3) == 3
  assert _split(FA_MAMBA4, 3, 3, 27, 0, max_chunk=3) == 1
  # a limit of at least one block floors as usual (0 -> 4 of a 7-token chunk)
  assert _split(FA_MAMBA4, 0, 7, 27, 0, max_chunk=7) == 4


def test_no_split_without_align_group():
  cfg = CacheConfig(groups=(GroupSpec("full"),), block_size=4, num_blocks=8, max_model_len=64)
  assert _split(cfg, 0, 7, 27, 0) == 7


def _set(mask) -> set[int]:
  return set(np.nonzero(np.asarray(mask))[0].tolist())


ALL16 = set(range(16))


@pytest.mark.parametrize(
  "retention,extra,expected",
  [
    (None, 0, ALL16),
    (16, 0, ALL16),
    (64, 0, {3, 7, 11, 14, 15}),
    (0, 0, {14}),
    (0, 96, {5, 14}),
    (0, 100, {5, 14}),
    (64, 96, {3, 5, 7, 11, 14, 15}),
    (None, 96, ALL16),
    (0, 512, {14}),
  ],
)
def test_recurrent_retention_masks_s21(retention, extra, expected):
  pos = jnp.arange(16)
  mask = recurrent.retention_mask(pos, 16, 16, retention, (jnp.int32(255), jnp.int32(extra)))
  assert _set(mask) == expected


@pytest.mark.parametrize(
  "window,retention,extra,expected",
  [
    (16, 0, 96, {5, 14}),
    (48, 0, 96, {3, 4, 5, 12, 13, 14}),
    (16, 64, 96, {3, 5, 7, 11, 14, 15}),
    (16, None, 96, ALL16),
    (16, 0, 0, {14}),
  ],
)
def test_swa_retention_masks_s22(window, retention, extra, expected):
  pos = jnp.arange(16)
  need = -(-(window - 1) // 16)
  mask = sliding_window.retention_mask(
    pos, 16, need, 16, retention, False, (jnp.int32(255), jnp.int32(extra))
  )
  assert _set(mask) == expected


def test_swa_dense_caches_only_segment_tails_s09():
  # FA bs 32, SWA bs 8 W 8 (need 1): per segment of 4 blocks only the last one (S09)
  pos = jnp.arange(8)
  mask = sliding_window.retention_mask(pos, 8, 1, 32, None, False, (jnp.int32(63), jnp.int32(0)))
  assert _set(mask) == {3, 7}


def test_admission_counts_evictable_hits_s32():
  from hybrid_cache.core import admission
  from hybrid_cache.core.fresh_state import init_state

  cfg = CacheConfig(groups=(GroupSpec("swa", window=4),), block_size=2, num_blocks=16)
  cfg = cfg.replace(max_model_len=64)
  lay = layout(cfg)
  state = init_state(cfg)  # every block free (ref 0)
  hit_ids = jnp.zeros((1, lay.max_blocks), jnp.int32).at[0, 0].set(5)
  count, impossible = admission.blocks_needed(
    lay, state, jnp.int32(0), jnp.bool_(True), jnp.int32(2), hit_ids, jnp.int32(4),
    jnp.int32(4),
  )  # fmt: skip
  # one fresh block + the ref-0 hit block leaving the free queue
  assert (int(count), bool(impossible)) == (2, False)
  held = state.replace(ref_cnt=state.ref_cnt.at[5].set(1))
  count, _ = admission.blocks_needed(
    lay, held, jnp.int32(0), jnp.bool_(True), jnp.int32(2), hit_ids, jnp.int32(4),
    jnp.int32(4),
  )  # fmt: skip
  assert int(count) == 1
