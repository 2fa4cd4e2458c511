"""Eviction `deepest_first`: the free block whose key ends deepest in its prefix goes first.

The worked example of the README's "Writing a policy". In a prefix tree the deepest blocks are
its leaves, the least shared ones; evicting them first keeps shared trunks (system prompts,
common history) longer, like SGLang's leaf-first radix-tree eviction. Among blocks whose keys
end at the same depth, the least recently freed goes first (the frame's tie rule,
`hybrid_cache.core.eviction`). Twin: `hybrid_cache/twin/policies/deepest_first.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.core.eviction import FreeBlocks
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.state import CacheState

DEPTH_LIMIT = 1 << 30  # priorities live in [0, 2^30]


def priority(lay: Layout, state: CacheState, blocks: FreeBlocks) -> jax.Array:
  """i32[NB]: 2^30 - the key's token end (lower is evicted first: the deepest goes first)."""
  return DEPTH_LIMIT - jnp.clip(blocks.token_end, 0, DEPTH_LIMIT)
