"""Full attention (vLLM §2.2): longest cached prefix, left to right; never frees early."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.core.state import floor_to


def find(cached: jax.Array, cap: jax.Array, drop: jax.Array, bs: int, alignment: int):
  """Longest hit over the first `cap // bs` blocks of `cached` (bool[MB]).

  Returns (L, lo): hit length in tokens (EAGLE drops one block, then aligned down) and the first
  non-null hit position (always 0).
  """
  pos = jnp.arange(cached.shape[0])
  ok = cached & (pos < cap // bs)
  hits = jnp.sum(jnp.cumprod(ok.astype(jnp.int32)))
  length = hits * bs
  length = jnp.where(drop & (length > 0), length - bs, length)
  return floor_to(length, alignment).astype(jnp.int32), jnp.int32(0)


def num_skipped_tokens(c):
  """Tokens whose KV is no longer needed once `c` tokens are computed: none."""
  return jnp.zeros_like(c)
