"""Recurrent groups (Mamba2/GDN, vLLM §2.4): one state block exactly at the hit boundary."""

from __future__ import annotations

import jax.numpy as jnp

from hybrid_cache.core.state import floor_to


def find(cached, cap, bs: int, alignment: int):
  """Rightmost cached block i < cap//bs whose right edge is a multiple of `alignment`.

  Returns (L, lo) = ((i+1)*bs, i), or (0, 0) when none. No EAGLE drop for recurrent groups.
  """
  pos = jnp.arange(cached.shape[0])
  ok = cached & (pos < cap // bs) & (((pos + 1) * bs) % alignment == 0)
  i = jnp.max(jnp.where(ok, pos, -1))
  return ((i + 1) * bs).astype(jnp.int32), jnp.maximum(i, 0).astype(jnp.int32)


def num_skipped_tokens(c):
  """c - 1: only the latest state is needed."""
  return jnp.maximum(c - 1, 0)


def retention_mask(pos, bs, align, retention, boundaries):
  """bool[MB]: recurrent states worth caching (vLLM §2.4.7).

  `retention` (traced i32 from `CacheState.params`, or a Python int / None): < 0 or None =
  dense (every state), 0 = replay boundaries only, k * sbs = one state per `retention` tokens
  plus the boundaries. `align`: the hit alignment the boundaries are floored to (the hash block
  with partial hits, else the scheduler block; vLLM `reachable_block_mask`).
  """
  retention = -1 if retention is None else retention  # RETENTION_NONE
  per = retention // bs
  dense = (retention < 0) | ((retention > 0) & (per <= 1))
  mask = dense | ((retention > 0) & ((pos + 1) % jnp.maximum(per, 1) == 0))
  for b in boundaries:
    mask |= (b > 0) & (pos == floor_to(b, align) // bs - 1)
  return mask
