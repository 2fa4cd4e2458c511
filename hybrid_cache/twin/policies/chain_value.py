"""Twin of `hybrid_cache.core.policies.chain_value`: lowest chain value goes first.

Value = min((token_end - chain_start) * (1 + hits), 2^30), the span clipped to [0, 2^30] and
the hits to [0, 2^30 - 1] like the core (exact integers, so the twins agree).
"""

from __future__ import annotations

from hybrid_cache.config import CacheConfig

VALUE_LIMIT = 1 << 30


def _value(end: int, chain: int, hits: int) -> int:
  span = min(max(end - chain, 0), VALUE_LIMIT)
  uses = min(max(hits, 0), VALUE_LIMIT - 1) + 1
  return min(span * uses, VALUE_LIMIT)


def priority(config: CacheConfig, blocks, order) -> list[int]:
  """Per candidate (in `blocks.candidates` order): its chain value (module docstring)."""
  return [
    _value(blocks.token_end[b], blocks.chain_start[b], blocks.hits[b]) for b in blocks.candidates
  ]
