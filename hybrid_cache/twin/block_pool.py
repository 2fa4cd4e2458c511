"""The shared block pool of the plain-Python twin: ref counts, the free queue, the pinned tier.

Jitted twin: `core/block_pool.py` (and `core/block_index.py` for the key <-> block maps).

Free queue (reference §1.6): an ordered list, head first, starting ordered by id. Allocation
(`get_new_blocks`) pops from the head of the group's pool and evicts the popped block's keys;
when the pool's normal queue runs short the oldest pinned blocks are demoted to its tail first.
Freeing (`free_blocks`) puts unhashed blocks at the head (in order; `free_order="all_tail"`: at
the tail) and hashed ones at the tail, pinned ones (SPEC B1) at the pinned tier's tail; a
request frees tail first, one batch per group in group order (`release`). Touching a free
cached block unlinks it (`touch`). Two pools (`CacheConfig.state_slots`): one list, each pool's
queue is that list restricted to its ids (`pool_of`).
"""

from __future__ import annotations

from collections.abc import Sequence

from hybrid_cache.twin import access_history
from hybrid_cache.twin.state import NULL
from hybrid_cache.twin.state import TwinState


def pool_of(s: TwinState, b: int) -> int:
  """0 = page, 1 = state slot (`CacheConfig.state_slots`)."""
  return int(b >= s.config.num_blocks)


def num_free(s: TwinState, pool: int | None = None) -> int:
  """Free blocks (normal queue + pinned tier), of one pool or of both."""
  if pool is None:
    return len(s.free) + len(s.pinned_free)
  return sum(1 for b in s.free + s.pinned_free if pool_of(s, b) == pool)


def unindex(s: TwinState, key: tuple[int, int], b: int) -> None:
  """Removes b from the index entry of `key`."""
  ids = s.index.get(key)
  if ids and b in ids:
    ids.remove(b)
    if not ids:
      del s.index[key]


def evict_key(s: TwinState, b: int, ghost: bool = True) -> list[tuple[int, int]]:
  """Drops every key of block b (primary first, then extras); returns them in that order.
  With the access history the primary key's ghost is kept (`access_history.record`) unless
  `ghost` is False (a copy-on-write moves the key to the copy: nothing is dropped)."""
  key = s.key[b]
  if ghost and s.history:
    access_history.record(s, b)
  removed = [] if key is None else [key]
  removed += s.extra.pop(b, [])
  for k in removed:
    unindex(s, k, b)
  s.key[b] = None
  s.key_end[b] = -1
  s.hits[b] = 0
  s.chain[b] = -1
  # an eviction clock rises to the block's ranked priority (0: not ranked, no effect)
  s.evict_clock = max(s.evict_clock, s.ranked[b])
  s.stamp[b] = 0
  s.ranked[b] = 0
  s.last[b] = 0
  s.penult[b] = 0
  s.owner[b] = -1
  return removed


def insert_key(
  s: TwinState, b: int, key: tuple[int, int], end: int, chain: int, penult: int = 0
) -> None:
  """vLLM `_insert_block_hash`: a key becomes b's primary key (token end `end`, chain start
  `chain`, no hits yet, stamped with the eviction clock, accessed now and before at `penult`),
  or an extra one if b has one."""
  if s.key[b] == key or b in s.index.get(key, ()):
    return
  if s.key[b] is None:
    s.key[b] = key
    s.key_end[b] = end
    s.hits[b] = 0
    s.chain[b] = chain
    s.stamp[b] = s.evict_clock
    s.ranked[b] = 0
    s.last[b] = s.step  # an access now, the one before inherited (`access_history`)
    s.penult[b] = penult
    s.owner[b] = -1
  else:
    s.extra.setdefault(b, []).append(key)
  s.index.setdefault(key, []).append(b)


def demote(s: TwinState, n: int, pool: int | None = None) -> None:
  """Moves the n oldest pinned free blocks (of `pool`, None = any) to the normal free-queue
  tail (hash kept)."""
  for b in [b for b in s.pinned_free if pool is None or pool_of(s, b) == pool][:n]:
    s.pinned_free.remove(b)
    s.pinned[b] = False
    s.free.append(b)


def get_new_blocks(s: TwinState, n: int, gid: int) -> list[int]:
  """Pops n blocks for group `gid` from the head of its pool's free queue."""
  if n <= 0:
    return []
  pool = s.group_pool[gid] if s.config.state_slots else None
  mine = s.free if pool is None else [b for b in s.free if pool_of(s, b) == pool]
  if len(mine) < n:
    demote(s, n - len(mine), pool)
    mine = s.free if pool is None else [b for b in s.free if pool_of(s, b) == pool]
  assert len(mine) >= n, "admission accounting let an allocation overflow the pool"
  out = mine[:n]
  if pool is None:
    del s.free[:n]
  else:
    taken = set(out)  # in place: the free list may be the eviction order's `StampedFree`
    s.free[:] = [b for b in s.free if b not in taken]
  for b in out:
    evict_key(s, b)
    s.pinned[b] = False
    s.ref[b] = 1
  return out


def touch(s: TwinState, blocks: Sequence[int]) -> None:
  """Takes a reference on each block; a free one leaves its queue (or the pinned tier)."""
  for b in blocks:
    if b == NULL:
      continue
    if s.ref[b] == 0:
      if b in s.pinned_free:
        s.pinned_free.remove(b)
      else:
        s.free.remove(b)
    s.ref[b] += 1


def free_blocks(s: TwinState, ordered: Sequence[int]) -> None:
  """Drops a reference on each block, in order; blocks reaching 0 join the free queue."""
  head = []
  for b in ordered:
    if b == NULL:
      continue
    s.ref[b] -= 1
    assert s.ref[b] >= 0
    if s.ref[b] == 0:
      if s.pinned[b] and s.config.pinning:
        s.pinned_free.append(b)
      elif s.key[b] is None and s.config.free_order == "scratch_first":
        head.append(b)
      else:
        s.free.append(b)
  s.free[0:0] = head
