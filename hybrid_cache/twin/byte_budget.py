"""One byte budget shared by the page and state-slot pools (`CacheConfig.byte_budget`; beyond
vLLM), in the plain-Python twin.

Jitted twin: `core/byte_budget.py` (see there for the rule). A block occupies `page_bytes` or
`slot_bytes` while it is held or carries a key; admission (`fits`) needs the held blocks plus
the new ones within the budget, and after an allocation `enforce` drops the keys of cached free
blocks, in free-queue order, until the occupied bytes fit again.
"""

from __future__ import annotations

from hybrid_cache.twin import block_pool
from hybrid_cache.twin.state import TwinState


def cost(s: TwinState, b: int) -> int:
  """What block b occupies of the shared byte budget when held or cached."""
  return s.config.slot_bytes if block_pool.pool_of(s, b) else s.config.page_bytes


def occupied_bytes(s: TwinState) -> int:
  """Bytes of the held and the cached blocks (shared byte budget)."""
  return sum(
    cost(s, b) for b in range(1, s.config.pool_size) if s.ref[b] > 0 or s.key[b] is not None
  )


def enforce(s: TwinState) -> None:
  """`byte_budget.enforce`: while the held and cached blocks exceed the byte budget, the
  first cached free block in free-queue order (the normal queue, then the pinned tier,
  oldest first) loses its keys and keeps its place."""
  over = occupied_bytes(s) - s.config.byte_budget
  for b in s.free + s.pinned_free:
    if over <= 0:
      return
    if s.key[b] is not None:
      block_pool.evict_key(s, b)
      over -= cost(s, b)


def fits(s: TwinState, need: list[int], watermark: int) -> bool:
  """The byte part of admission (`admission.fits`): the held blocks plus `need` (pages, state
  slots) and the watermark pages fit the byte budget."""
  cfg = s.config
  held = sum(cost(s, b) for b in range(1, cfg.pool_size) if s.ref[b] > 0)
  want = (need[0] + watermark) * cfg.page_bytes + need[1] * cfg.slot_bytes
  return held + want <= cfg.byte_budget
