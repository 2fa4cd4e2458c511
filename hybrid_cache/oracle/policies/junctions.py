"""Oracle twin of `hybrid_cache.core.policies.junctions`: states at the replay boundaries only."""

from __future__ import annotations

from hybrid_cache.config import CacheConfig


def keep(config: CacheConfig, i: int, block_size: int, alignment: int, boundaries, default) -> bool:
  """Whether state block i is kept: it ends at a boundary b > 0 floored to `alignment`."""
  return any(b > 0 and i == (b // alignment) * alignment // block_size - 1 for b in boundaries)
