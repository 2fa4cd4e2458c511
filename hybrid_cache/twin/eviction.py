"""Plain-Python twin of the eviction policies' free-list order, for `PythonCacheManager`.

Same rule as the jitted core (`hybrid_cache.core.eviction`), on the twin's ordered free list
(head first) instead of int32 keys. `lru` leaves the list alone. For any other registered
policy (`hybrid_cache.policies`, twin `hybrid_cache/twin/policies/<name>.py`), at the start of
every scheduler step, unless the policy's `active(order)` is false (flop_aware: alpha = 0):

1. blocks without a key stay first, in their current order (scratch first);
2. then dead recurrent states (`dead_states`: the first full-attention group has a block
   ending where the state ends but no block carries that key), least recently freed first;
3. then the other keyed free blocks (the candidates) by increasing
   `policy.priority(config, FreeBlocks, order)`, ties by recency (least recently freed first,
   recency = the time of the block's last append to the tail).

`reorder` returns a `StampedFree` list that records appends, so the policy must keep using the
returned list as its free list.

Hook (in the twin's `TwinState`, `twin/state.py`): keep `key_end[b]` = token end of
block b's key when registered, `hits[b]` / `chain[b]` = its hits and chain start (`FreeBlocks`),
build `evict = EvictionOrder(config)` unless `config.eviction == "lru"`, and at the start of
each step (`twin/scheduler.py`, `schedule_step`):

  groups = [None if k is None else k[1] for k in s.key]
  dead = dead_states(s.config, s.key, s.key_end, s.index)
  s.free = s.evict.reorder(s.free, groups, s.key_end, dead, s.hits, s.chain)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from collections.abc import Container
from collections.abc import Iterable
from collections.abc import Sequence

from hybrid_cache import policies
from hybrid_cache.config import CacheConfig
from hybrid_cache.core.eviction_costs import CLOCK_LIMIT
from hybrid_cache.core.eviction_costs import CLOCK_REBASE
from hybrid_cache.core.eviction_costs import alpha_milli


def rebase_clock(clock: int, stamps: Sequence[int]) -> tuple[int, list[int]]:
  """(clock, stamps) lowered by CLOCK_REBASE (stamps floored at 0) once the clock exceeds
  CLOCK_LIMIT, else unchanged (core `eviction.rebase_clock`)."""
  if clock <= CLOCK_LIMIT:
    return clock, list(stamps)
  return clock - CLOCK_REBASE, [max(t - CLOCK_REBASE, 0) for t in stamps]


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

  def __init__(self, items: Iterable[int], owner: EvictionOrder):
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


@dataclasses.dataclass(frozen=True)
class FreeBlocks:
  """What an eviction policy's twin sees (the jitted `core.eviction.FreeBlocks`).

  Attributes:
    candidates: keyed free blocks that can still be hit, least recently freed first (a
      candidate's index here is its recency rank).
    group: per block id, the group of its key, or None.
    token_end: per block id, the token position where its key ends (read for keyed blocks).
    hits: per block id, prefix-cache hits since its key was registered (the core's
      `CacheState.key_hits`; read for keyed blocks).
    chain_start: per block id, where its key's KV span starts (the core's
      `CacheState.chain_start`: recurrent, the previous state its registering request kept,
      0 = none; else the block's first token; read for keyed blocks).

  `hits` and `chain_start` (the chain features) are None unless the policy declares it reads
  them (`Reads(chain=True)` in `hybrid_cache.policies.EVICTION`), as in the core, which
  maintains them only then. The twin (`TwinState`) keeps them for every policy (plain
  Python, no speed to save); the machines compare them only where the core maintains them.
  `stamp` (per block id, the eviction clock when its key was registered or last hit: the
  core's `CacheState.evict_stamp`) likewise only under `Reads(clock=True)`, `penult` (per
  block id, the step of its key's access before the latest, 0 = none: the core's
  `CacheState.key_penult`) and `owner` (per block id, the state a full-attention block was
  kept for, -1 = none: the core's `CacheState.kv_owner`, `twin.kv_owner`) only under
  `Reads(history=True)`.
  """

  candidates: tuple[int, ...]
  group: Sequence[int | None]
  token_end: Sequence[int]
  hits: Sequence[int] | None = None
  chain_start: Sequence[int] | None = None
  stamp: Sequence[int] | None = None
  penult: Sequence[int] | None = None
  owner: Sequence[int] | None = None


class EvictionOrder:
  """Re-orders the twin's free list by a registered policy (module docstring)."""

  def __init__(self, config: CacheConfig, alpha: float = 0.0):
    self.config = config
    self.policy = policies.twin_eviction(config.eviction)
    # a policy with an eviction clock (GreedyDual): `ranked` = candidate -> the priority the
    # last `reorder` ranked it with (the scheduler copies it to `TwinState.ranked`)
    self.clocked = policies.reads_clock(config.eviction)
    self.ranked: dict[int, int] = {}
    self._stamps: dict[int, int] = {}
    self._clock = 0
    self.alpha_milli = 0
    self.set_alpha(alpha)
    # eviction `tuned`'s weighting (the core's `CacheState.eviction_weighting`; 0 = GreedyDual)
    self.weighting = 0

  def set_alpha(self, alpha: float) -> None:
    """Sets alpha (ValueError outside [0, ALPHA_MAX]); stored in thousandths like the core."""
    self.alpha_milli = alpha_milli(alpha)

  def stamp(self, b: int) -> None:
    """Records that block b was just freed to the tail (most recent)."""
    self._clock += 1
    self._stamps[b] = self._clock

  def reorder(
    self,
    free: Sequence[int],
    groups: Sequence[int | None],
    ends: Sequence[int],
    dead: Collection[int] = (),
    hits: Sequence[int] | None = None,
    chains: Sequence[int] | None = None,
    stamps: Sequence[int] | None = None,
    penults: Sequence[int] | None = None,
    owners: Sequence[int] | None = None,
  ) -> StampedFree:
    """The free list for this step (a new `StampedFree`; use it as the policy's free list).

    Args:
      free: the normal free queue, head first.
      groups: per block id, the group of its key, or None (no key).
      ends: per block id, the token end of its key (read for keyed blocks only).
      dead: keyed blocks that can never be hit (`dead_states`); evicted right after the
        key-less blocks.
      hits: per block id, hits since its key was registered (None: 0 for every block).
      chains: per block id, its key's chain start (None: the token end's block start is not
        known here, so 0 for every block).
      stamps: per block id, the eviction clock when its key was registered or last hit (None:
        0 for every block); reaches the policy only if it keeps a clock
        (`policies.reads_clock`), which then also records each candidate's priority in
        `ranked`.
      penults: per block id, the step of its key's access before the latest (None: 0 for
        every block); reaches the policy only if it reads the access history
        (`policies.reads_history`), as `owners` (per block id, its KV owner, -1 = none;
        None: -1 for every block).
      `hits` / `chains` reach the policy only if it reads them (`policies.reads_chain`).
    """
    if not (isinstance(free, StampedFree) and free._owner is self):
      for b in free:  # keyed blocks this twin has not seen freed: as if freed now, in order
        if groups[b] is not None and b not in self._stamps:
          self.stamp(b)
    active = getattr(self.policy, "active", None)
    if self.policy is None or (active is not None and not active(self)):
      return StampedFree(free, self)
    scratch = [b for b in free if groups[b] is None]
    keyed = sorted((b for b in free if groups[b] is not None), key=lambda b: self._stamps[b])
    gone = [b for b in keyed if b in dead]
    cand = tuple(b for b in keyed if b not in dead)
    fields = {}
    if policies.reads_chain(self.config.eviction):
      fields["hits"] = [0] * len(groups) if hits is None else hits
      fields["chain_start"] = [0] * len(groups) if chains is None else chains
    if self.clocked:
      fields["stamp"] = [0] * len(groups) if stamps is None else stamps
    if policies.reads_history(self.config.eviction):
      fields["penult"] = [0] * len(groups) if penults is None else penults
      fields["owner"] = [-1] * len(groups) if owners is None else owners
    blocks = FreeBlocks(cand, groups, ends, **fields)
    prio = self.policy.priority(self.config, blocks, self)
    if self.clocked:  # what the clock may rise to (`clock_priority`: eviction `tuned`)
      on_clock = getattr(self.policy, "clock_priority", None)
      ranked = prio if on_clock is None else on_clock(self, prio)
      self.ranked = dict(zip(cand, ranked))
    order = sorted(range(len(cand)), key=lambda i: (prio[i], i))
    return StampedFree(scratch + gone + [cand[i] for i in order], self)
