"""Twin of `hybrid_cache.core.policies.deepest_first`: the deepest key end goes first."""

from __future__ import annotations

from hybrid_cache.config import CacheConfig

DEPTH_LIMIT = 1 << 30


def priority(config: CacheConfig, blocks, order) -> list[int]:
  """Per candidate (in `blocks.candidates` order): 2^30 - the key's token end."""
  return [DEPTH_LIMIT - min(max(blocks.token_end[b], 0), DEPTH_LIMIT) for b in blocks.candidates]
