"""Which blocks a lookup hits, per group kind: vLLM 0.33's `find_longest_cache_hit` (§2.2-§2.5).

Pure rules over plain ints and lists (`rules.py`: the conventions; reference §7, S06 scan
table). A "hit entry list" is position-indexed; entry i is `None` (null block) or the tuple of
block ids of the member groups of one spec group for group-block i. `cached(i)` returns such a
tuple or None when block i misses in any member group.
"""

from __future__ import annotations

from collections.abc import Callable

from hybrid_cache.twin.block_arith import cdiv
from hybrid_cache.twin.block_arith import floor_to

Entry = tuple[int, ...] | None
CachedFn = Callable[[int], Entry]


def _leading_hits(cached: CachedFn, num_blocks: int) -> list[Entry]:
  """The entries of blocks 0, 1, ... up to the first miss (at most `num_blocks`)."""
  entries: list[Entry] = []
  for i in range(num_blocks):
    e = cached(i)
    if e is None:
      break
    entries.append(e)
  return entries


def find_full(
  cached: CachedFn, block_size: int, max_length: int, drop_eagle: bool, alignment: int
) -> tuple[list[Entry], int]:
  """Full attention: longest run of hits from block 0; EAGLE drops one block; aligned down."""
  entries = _leading_hits(cached, max_length // block_size)
  length = len(entries) * block_size
  if drop_eagle and length > 0:
    length -= block_size
  length = floor_to(length, alignment)
  return entries[: cdiv(length, block_size)], length


def find_full_fine(
  cached: CachedFn,
  cached_fine: CachedFn,
  block_size: int,
  hash_block_size: int,
  max_length: int,
  num_fine: int,
  drop_eagle: bool,
) -> tuple[list[Entry], int]:
  """Full attention with partial hits (§2.5, vLLM `FullAttentionManager.find_longest_cache_hit`).

  Only for block_size > hash_block_size (alignment = hash block). Phase 1: the run of cached
  full blocks from block 0. Phase 2: inside the next block, the hash boundaries
  `[first, min(first + k - 1, max_length // HBS, num_fine))` (k = block/hash block, first = run*k)
  are probed from high to low; the first cached fine key (a partial entry, `cached_fine(i)` for
  the prefix of (i+1)*HBS tokens) adds its block and ends the hit at (i+1)*HBS. EAGLE drops one
  hash block; the entry list keeps cdiv(hit, block_size) blocks.
  """
  entries = _leading_hits(cached, max_length // block_size)
  length = len(entries) * block_size
  k = block_size // hash_block_size
  first = len(entries) * k
  top = min(first + k - 1, max_length // hash_block_size, num_fine)
  for i in range(top - 1, first - 1, -1):
    e = cached_fine(i)
    if e is not None:
      entries.append(e)
      length = (i + 1) * hash_block_size
      break
  if drop_eagle and length > 0:
    length -= hash_block_size
  length = floor_to(length, hash_block_size)
  return entries[: cdiv(length, block_size)], length


def find_mamba_fine(
  cached_fine: CachedFn, block_size: int, hash_block_size: int, max_length: int, num_fine: int
) -> tuple[list[Entry], int]:
  """Recurrent lookup with partial hits (§2.5): the rightmost cached hash boundary wins.

  Scans fine indices `min(max_length // HBS, num_fine) - 1 .. 0`; a hit at fine index i sits in
  block i // k: `[None] * (i // k) + [entry]`, length (i+1)*HBS. No EAGLE drop.
  """
  k = block_size // hash_block_size
  for i in range(min(max_length // hash_block_size, num_fine) - 1, -1, -1):
    e = cached_fine(i)
    if e is not None:
      return [None] * (i // k) + [e], (i + 1) * hash_block_size
  return [], 0


def swa_need(window: int, block_size: int, drop_eagle: bool) -> int:
  """Contiguous blocks an SWA resume point needs: ceil((W-1)/B), +1 with the EAGLE drop."""
  return cdiv(window - 1, block_size) + (1 if drop_eagle else 0)


def find_swa(
  cached: CachedFn,
  block_size: int,
  window: int,
  max_length: int,
  drop_eagle: bool,
  alignment: int,
) -> tuple[list[Entry], int]:
  """Sliding window: right-to-left scan for `need` contiguous cached blocks (§2.3.2).

  A run may only start (at its right edge) on an aligned position; the run touching block 0
  counts even when shorter than `need`. Entries left of the run are None.
  """
  need = swa_need(window, block_size, drop_eagle)
  n = max_length // block_size
  entries: list[Entry] = [None] * n
  run = 0
  found = False
  for i in range(n - 1, -1, -1):
    e = cached(i)
    if e is not None:
      if run == 0 and block_size != alignment:
        end = i if drop_eagle else i + 1
        if (end * block_size) % alignment != 0:
          continue
      entries[i] = e
      run += 1
      if run >= need:
        del entries[i + run :]
        found = True
        break
    else:
      run = 0
  if not found:
    del entries[run:]
    while entries and (len(entries) * block_size) % alignment != 0:
      entries.pop()
  if drop_eagle and entries:
    entries.pop()
    while entries and (len(entries) * block_size) % alignment != 0:
      entries.pop()
  return entries, len(entries) * block_size


def find_mamba(
  cached: CachedFn, block_size: int, max_length: int, alignment: int
) -> tuple[list[Entry], int]:
  """Recurrent: the rightmost cached block whose right edge is aligned; one real block."""
  for i in range(max_length // block_size - 1, -1, -1):
    if ((i + 1) * block_size) % alignment != 0:
      continue
    e = cached(i)
    if e is not None:
      return [None] * i + [e], (i + 1) * block_size
  return [], 0
