"""Twin of `hybrid_cache.core.policies.second_sighting`: a state is registered the second
time its prefix is computed (one mark per low `TABLE_BITS` bits of the key, per group)."""

from __future__ import annotations

from hybrid_cache.config import CacheConfig

TABLE_BITS = 12


class Admission:
  """The marks: per recurrent group id, the set of key slots some request has offered."""

  def __init__(self, config: CacheConfig):
    self.marks: dict[int, set[int]] = {}

  def admit(self, gid: int, key: int) -> bool:
    """Whether the state with (64-bit) `key` in group `gid` is admitted; marks its slot."""
    slot = key & ((1 << TABLE_BITS) - 1)
    seen = self.marks.setdefault(gid, set())
    admitted = slot in seen
    seen.add(slot)
    return admitted
