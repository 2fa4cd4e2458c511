"""Plain-Python oracle of FLOP-aware eviction (SPEC B2) for `ReferencePolicy`'s free list.

Same rule as the jitted core (`hybrid_cache.core.eviction`), on the reference's ordered free list
(head first) instead of int32 keys. At the start of every scheduler step, when alpha > 0:

1. blocks without a key stay first, in their current order (scratch first);
2. then dead recurrent states (`dead_states`: the first full-attention group has a block
   ending where the state ends but no block carries that key), least recently freed first;
3. then the other keyed free blocks (the candidates) by increasing utility
   `1000 * rn + alpha_milli * en`, ties by recency (least recently freed first), with
   `rn = (r << 14) // (n - 1)` (r = rank by the time the block was last freed to the tail,
   0 = least recent among the n candidates; 2^14 when n == 1) and
   `en = ((q - q_min) << 14) // (q_max - q_min)` (q = quantised FLOPs saved per byte of the
   block's group at its key's token end, `eviction_costs.efficiency_table`; 2^14 when all
   equal).

alpha = 0 leaves the list as it is (vLLM's LRU). Recency is the time of the last append
(free to the tail) of each block: `reorder` returns a `StampedFree` list that records appends,
so the policy must keep using the returned list as its free list.

Hook (in `ReferencePolicy`): keep `_key_end[b]` = token end of block b's key when registered,
build `fe = FlopEviction(config)` when `config.eviction == "flop_aware"`, and at the start
of `schedule`:

  groups = [None if k is None else k[1] for k in self._key]
  dead = dead_states(self.config, self._key, self._key_end, self._index)
  self._free = fe.reorder(self._free, groups, self._key_end, dead)
"""

from __future__ import annotations

from collections.abc import Collection
from collections.abc import Container
from collections.abc import Iterable
from collections.abc import Sequence

from hybrid_cache.config import CacheConfig
from hybrid_cache.core.eviction_costs import alpha_milli
from hybrid_cache.core.eviction_costs import efficiency_table

NORM_BITS = 14


def dead_states(
  config: CacheConfig,
  keys: Sequence[tuple[int, int] | None],
  ends: Sequence[int],
  index: Container[tuple[int, int]],
) -> set[int]:
  """Blocks whose key is a recurrent state that can never be hit (its KV prefix is gone).

  Args:
    config: the cache config (group kinds and block sizes).
    keys: per block id, its key (hash, group) or None.
    ends: per block id, the token end of its key.
    index: the (hash, group) keys present in the hash index.
  """
  groups = config.resolved_groups
  full = [i for i, g in enumerate(groups) if g.kind == "full"]
  if not full:
    return set()
  fg = full[0]
  out = set()
  for b, key in enumerate(keys):
    if key is None or groups[key[1]].kind != "mamba":
      continue
    if ends[b] % groups[fg].block_size == 0 and (key[0], fg) not in index:
      out.add(b)
  return out


class StampedFree(list):
  """A free list (head first) that stamps every block appended to its tail."""

  def __init__(self, items: Iterable[int], owner: FlopEviction):
    super().__init__(items)
    self._owner = owner

  def append(self, b: int) -> None:
    self._owner.stamp(b)
    super().append(b)

  def extend(self, items: Iterable[int]) -> None:
    for b in items:
      self.append(b)

  def __iadd__(self, items):
    self.extend(items)
    return self


class FlopEviction:
  """FLOP-aware re-ordering of one reference policy's free list (module docstring)."""

  def __init__(self, config: CacheConfig, alpha: float = 0.0):
    self.config = config
    self._table = efficiency_table(config)
    self._bs = [g.block_size for g in config.resolved_groups]
    self._stamps: dict[int, int] = {}
    self._clock = 0
    self.alpha_milli = 0
    self.set_alpha(alpha)

  def set_alpha(self, alpha: float) -> None:
    """Sets alpha (ValueError outside [0, ALPHA_MAX]); stored in thousandths like the core."""
    self.alpha_milli = alpha_milli(alpha)

  def stamp(self, b: int) -> None:
    """Records that block b was just freed to the tail (most recent)."""
    self._clock += 1
    self._stamps[b] = self._clock

  def efficiency(self, group: int, end: int) -> int:
    """Quantised FLOPs saved per byte of the block of `group` whose key ends at `end`."""
    col = min(max(end // self._bs[group], 0), self._table.shape[1] - 1)
    return int(self._table[group][col])

  def reorder(
    self,
    free: Sequence[int],
    groups: Sequence[int | None],
    ends: Sequence[int],
    dead: Collection[int] = (),
  ) -> StampedFree:
    """The free list for this step (a new `StampedFree`; use it as the policy's free list).

    Args:
      free: the normal free queue, head first.
      groups: per block id, the group of its key, or None (no key).
      ends: per block id, the token end of its key (read for keyed blocks only).
      dead: keyed blocks that can never be hit (`dead_states`); evicted right after the
        key-less blocks.
    """
    if not (isinstance(free, StampedFree) and free._owner is self):
      for b in free:  # keyed blocks this oracle has not seen freed: as if freed now, in order
        if groups[b] is not None and b not in self._stamps:
          self.stamp(b)
    if self.alpha_milli == 0:
      return StampedFree(free, self)
    scratch = [b for b in free if groups[b] is None]
    keyed = sorted((b for b in free if groups[b] is not None), key=lambda b: self._stamps[b])
    gone = [b for b in keyed if b in dead]
    cand = [b for b in keyed if b not in dead]
    n = len(cand)
    rank = {b: i for i, b in enumerate(cand)}
    q = {b: self.efficiency(groups[b], ends[b]) for b in cand}
    q_min = min(q.values(), default=0)
    span = max(q.values(), default=0) - q_min
    one = 1 << NORM_BITS

    def utility(b: int) -> int:
      rn = (rank[b] << NORM_BITS) // (n - 1) if n > 1 else one
      en = ((q[b] - q_min) << NORM_BITS) // span if span > 0 else one
      return 1000 * rn + self.alpha_milli * en

    cand.sort(key=lambda b: (utility(b), rank[b]))
    return StampedFree(scratch + gone + cand, self)
