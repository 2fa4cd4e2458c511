"""Twin of `hybrid_cache.core.access_history` (eviction `lru2`): the ghosts of dropped keys, the
same integers. A request's inherited access is `Request.inherit` (set by `allocate.add_hits`,
cleared by `release.release`); the ghosts are `TwinState.ghosts`: (group, entry) -> (last,
tag), an entry holding the larger (last, tag) of the ghosts written to it."""

from __future__ import annotations

from hybrid_cache.twin.state import TwinState

TABLE_BITS = 14
TABLE = 1 << TABLE_BITS


def _entry(key: tuple[int, int]) -> tuple[tuple[int, int], int]:
  """((group, entry), tag) of a key (64-bit hash, group): its low 32 bits index and tag."""
  lo = key[0] & 0xFFFFFFFF
  return (key[1], lo & (TABLE - 1)), lo >> TABLE_BITS


def record(s: TwinState, b: int) -> None:
  """Keeps the ghost of block b's primary key (its last access), before the key is dropped."""
  if s.key[b] is None:
    return
  at, tag = _entry(s.key[b])
  s.ghosts[at] = max(s.ghosts.get(at, (0, 0)), (s.last[b], tag))


def recall(s: TwinState, key: tuple[int, int]) -> int:
  """The ghost's last access of `key` if its entry's tag matches, else 0."""
  at, tag = _entry(key)
  last, t = s.ghosts.get(at, (0, 0))
  return last if t == tag else 0
