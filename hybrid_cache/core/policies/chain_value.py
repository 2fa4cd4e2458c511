"""Eviction `chain_value`: the free block whose chain is worth least goes first (Marconi-style).

A block's value is a FLOP-free proxy of the work a hit on it saves, times its use:
`min((token_end - chain_start) * (1 + hits), 2^30)` (`FreeBlocks`). `token_end - chain_start`
is the KV span the key stands for: one block for attention, and for a recurrent state the
tokens back to the previous state its request kept, which a miss on the state recomputes
(Marconi M§1.4 values a radix node by its edge's tokens and its hits). Lower value is evicted
first; ties least recently freed first (the frame's rule, `hybrid_cache.core.eviction`). Reads
no cost fields. Twin: `hybrid_cache/twin/policies/chain_value.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.core.eviction import FreeBlocks
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.state import CacheState

VALUE_LIMIT = 1 << 30  # priorities live in [0, 2^30]


def priority(lay: Layout, state: CacheState, blocks: FreeBlocks) -> jax.Array:
  """i32[NB]: min(span * (1 + hits), 2^30), span = token_end - chain_start clipped to
  [0, 2^30] (lower is evicted first); the product saturates without int32 overflow."""
  span = jnp.clip(blocks.token_end - blocks.chain_start, 0, VALUE_LIMIT)
  uses = jnp.clip(blocks.hits, 0, VALUE_LIMIT - 1) + 1
  # span * uses > LIMIT  <=>  uses > LIMIT // span (span >= 1)
  over = uses > VALUE_LIMIT // jnp.maximum(span, 1)
  return jnp.where(over, VALUE_LIMIT, span * uses)
