"""Twin of `hybrid_cache.core.policies.junctions`: states at the replay boundaries only."""

from __future__ import annotations

from hybrid_cache.config import CacheConfig
from hybrid_cache.twin import rules


def keep(config: CacheConfig, i: int, block_size: int, alignment: int, boundaries, default) -> bool:
  """Whether state block i is kept: it ends at a boundary b > 0 floored to `alignment`
  (`rules.mamba_cacheable` at retention 0)."""
  return rules.mamba_cacheable(
    i,
    block_size=block_size,
    alignment_tokens=alignment,
    retention_interval=0,
    boundaries=boundaries,
  )
