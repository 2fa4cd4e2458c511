"""Victim selection: one routine for every eviction policy, driven by a per-block int32 key.

`lru` reproduces vLLM's free queue exactly: the key is the block's position in the doubly linked
free list (head insertions below every key, tail insertions above), the victim is the smallest
key. `flop_aware` (Marconi's utility, SPEC B2) will supply a different key per block; the
selection (argmin, no sort) stays the same.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.config import CacheConfig
from hybrid_cache.state import BIG


def check_policy(config: CacheConfig) -> None:
  """Raises NotImplementedError for policies the jitted core does not implement yet."""
  if config.eviction != "lru":
    raise NotImplementedError(
      f"eviction={config.eviction!r} is not implemented in the jitted core yet (only 'lru')"
    )


def prepare(lay, config: CacheConfig, state):
  """Hook run at the start of every scheduler step, before any allocation.

  `lru` leaves the free queue as it is. A policy that orders victims by something other than
  the free-queue position (e.g. `flop_aware`) re-keys the evictable blocks here, so that the
  pop (smallest key first) follows it.
  """
  del lay, config
  return state


def select_victim(queue_key: jax.Array) -> jax.Array:
  """Next block to reuse: smallest normal-queue key; else the oldest pinned block (demotion)."""
  has_normal = jnp.any(queue_key[0] < BIG)
  return jnp.where(has_normal, jnp.argmin(queue_key[0]), jnp.argmin(queue_key[1])).astype(jnp.int32)
