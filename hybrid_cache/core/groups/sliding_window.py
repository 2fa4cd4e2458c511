"""Sliding window (vLLM §2.3): right-to-left contiguous run of ceil((W-1)/B) blocks."""

from __future__ import annotations

import jax.numpy as jnp

from hybrid_cache.core.state import floor_to


def find(cached, cap, drop, bs: int, alignment: int, need: int):
  """Hit for an SWA group: the rightmost aligned run of `need` (+1 with `drop`) cached blocks.

  A run may only start at a block whose right edge (the left edge with `drop`) is a multiple of
  `alignment`; a run touching block 0 counts even if shorter. With `drop` one block is popped
  and the length aligned down. Example (S06, bs=2, W=4 so need=2): cached `TTFTFFTTFTTT` gives
  12; `TTFTFFTTFFF` gives 8. Returns (L, lo) with lo the first non-null hit position.
  """
  mb = cached.shape[0]
  pos = jnp.arange(mb)
  n = cap // bs
  need_eff = jnp.maximum(need + drop.astype(jnp.int32), 1)
  c = cached & (pos < n)
  end = jnp.where(drop, pos, pos + 1)
  eligible = c & (((end * bs) % alignment == 0) if bs != alignment else True)
  cs = jnp.cumsum(c.astype(jnp.int32))
  before = jnp.where(pos - need_eff >= 0, cs[jnp.maximum(pos - need_eff, 0)], 0)
  full_window = ((cs - before) == need_eff) & (pos - need_eff + 1 >= 0)
  ok = eligible & full_window
  found = jnp.any(ok)
  s_found = jnp.max(jnp.where(ok, pos, -1))
  # the run touching block 0: leading cached prefix, started at an eligible block
  r = jnp.sum(jnp.cumprod(c.astype(jnp.int32)))
  s0 = jnp.max(jnp.where(eligible & (pos < r), pos, -1))
  len_found = (s_found + 1) * bs
  len_zero = floor_to((s0 + 1) * bs, alignment)
  length = jnp.where(found, len_found, len_zero)
  length = jnp.where(drop & (length > 0), floor_to(length - bs, alignment), length)
  lo = jnp.where(found, jnp.maximum(s_found - need_eff + 1, 0), 0)
  return length.astype(jnp.int32), lo.astype(jnp.int32)


def num_skipped_tokens(c, window: int):
  """max(0, c - W + 1): tokens out of the window once `c` tokens are computed."""
  return jnp.maximum(c - window + 1, 0)


def retention_mask(pos, bs, need, align, retention, eagle, boundaries):
  """bool[MB]: SWA blocks worth caching (vLLM §2.3.4) for reachable `boundaries` (i32[k]).

  `retention` (traced i32 from `CacheState.params`, or a Python int / None): < 0 or None =
  the last `need` blocks of every `align` tokens, no boundaries; 0 = boundaries only;
  k * sbs = the last `need` blocks of every `retention` tokens plus the boundaries. `align`:
  the hit alignment (the hash block with partial hits, else the scheduler block; vLLM
  `reachable_block_mask`), also what the boundaries are floored to.
  """
  retention = -1 if retention is None else retention  # RETENTION_NONE
  shift = 1 if eagle else 0
  segment = jnp.where(retention < 0, align, retention)
  per = jnp.maximum(segment // bs, 1)  # segment is a multiple of bs when > 0
  periodic = (need >= per) | ((pos >= shift) & ((pos - shift) % per >= per - need))
  mask = (segment > 0) & periodic
  for b in boundaries:
    e = floor_to(b, align) // bs + shift
    mask |= (retention >= 0) & (b > 0) & (pos >= e - need) & (pos < e)
  return mask
