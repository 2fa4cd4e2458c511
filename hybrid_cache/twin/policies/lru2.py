"""Twin of `hybrid_cache.core.policies.lru2`: LRU-2, same integers.

Priority = the candidate's penultimate access step (`FreeBlocks.penult`: 0 = none), clipped to
[0, 2^30]; the twin keeps the history in `TwinState.last` / `penult`: a registered key inherits
the request's `Request.inherit` (the previous access of the block serving its hit,
`twin.allocate.add_hits`) or its ghost (`twin.access_history`, `TwinState.ghosts`), the later,
and a retirement hands the retired states' on (`twin.release.retire`), exactly as the core;
a full-attention block ranks by its owner state (`twin.kv_owner`).
"""

from __future__ import annotations

from hybrid_cache.config import CacheConfig
from hybrid_cache.twin import kv_owner


def priority(config: CacheConfig, blocks, order) -> list[int]:
  """Per candidate (in `blocks.candidates` order): its penultimate access step, full-attention
  blocks ranked by their owner state (`twin.kv_owner.owned_priority`)."""
  del order
  return kv_owner.owned_priority(config, blocks, lambda b: min(max(blocks.penult[b], 0), 1 << 30))
