"""How a checkpoint cache evicts: chain-aware GreedyDual, or LRU-2 on chains (`ChainEviction`).

Part of the checkpoint cache (`checkpoint_cache.py`, issue 15, item 2): `UnitCache` evicts with
these methods when its bytes exceed the capacity, and pushes a checkpoint's priority when it is
placed, hit or its unit changes shape.

Eviction is chain-aware GreedyDual (Cao & Irani's GreedyDual-Size-Frequency): the unit is a
checkpoint plus, when it is a leaf, the KV back to the previous checkpoint or branch point
(Marconi's evictable node); an interior checkpoint frees only its state. Its priority is
stamp + w, stamp = the clock when it was inserted or last served a hit (the deepest checkpoint
of a hit path serves it; a change of its unit's shape re-weights it at the same stamp), with

  w = (1 + hits) * p_kind * (eff / eff_ref) ** alpha,  eff = (F(d U) - F(a U)) / bytes,

F = `prefill_flops`, a = the depth of the previous checkpoint on the path (what a hit falls back
to without this one), bytes = what evicting it frees, eff_ref the running mean of eff,
p_kind the prior that a point of its placement kind is passed later (`SeenTrie.reach_prior`), the
clock = the priority of the last eviction (so equal weights evict in LRU order, alpha = 0 is
recency and frequency only, larger alpha favours FLOPs saved per byte).

LRU-2 on chains (`penultimate=True`, a fixed weighting of `adaptive`): a checkpoint's
priority is the time of its penultimate access instead (O'Neil et al., SIGMOD'93: evict the
oldest second-to-last reference). An access is a hit served by the checkpoint, or its placement;
a checkpoint placed by a request inherits the previous access of the checkpoint that served the
request's hit (the chain was last used then), and one placed without a hit has none (it goes
first). Time counts lookups. The last access of an evicted checkpoint is kept (LRU-K's retained
information), so a point placed again is not new. Sessions whose turns interleave (real
ShareGPT: a chain's last interval predicts its next, Spearman 0.45-0.57) are where it wins.

The heap is compacted when stale entries pile up (`_compact`) and per-checkpoint dicts hold only
held checkpoints (BENCHMARKS.md, "Capacity sweep under `adaptive`"). `compiled_replay` compiles
the same decisions (`compiled_kernels.py`), checked against these methods by
`tests/hybrid_cache/sim/compiled_replay_test.py`.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from hybrid_cache.sim.cache_bank import _BRANCH
from hybrid_cache.sim.cache_bank import _CKPT
from hybrid_cache.sim.cache_bank import _last_mark
from hybrid_cache.sim.cache_bank import _marks_above

if TYPE_CHECKING:
  from hybrid_cache.sim.eviction_weightings import Weighting

# LRU-2's penultimate access of a checkpoint that has none (`UnitCache(penultimate=True)`):
# now - NO_HISTORY, below every real access time, so such checkpoints go first, oldest first
NO_HISTORY = 1e12
# `UnitCache._compact` runs when the heap holds more than 2 x its valid entries + this: stale
# entries (a checkpoint re-pushed or evicted) of high priority are rarely popped and piled up to
# ~40x the live checkpoints (Mooncake, adaptive, 5e10: 3,000 entries for 77 checkpoints), which
# made every pop and push pay for them
_COMPACT_MIN = 256


class ChainEviction:
  """The eviction half of `UnitCache` (a base class: it reads and writes the cache's state).

  It reads the per-node rows (`_present`, `_flag`, `_nchild`), the per-checkpoint dicts
  (`entry`, `hits`, `kind`, `stamp`, `penult`), the heap, the clock, the weighting (`alpha`,
  `prior`, `frequency`, `penultimate`) and the pins of the running requests (`_pins`) that
  `UnitCache.__init__` sets, and `UnitCache._chain_pages` / `_leaf_bonus` for the bytes a chain
  frees.
  """

  def _push(self, n: int, touch: bool = True, prev: int = -1, a: int = -1) -> None:
    """(Re)computes checkpoint n's GreedyDual priority and pushes it; `touch` = it was
    inserted or hit now (else it keeps its last stamp: only its unit's shape changed).
    `prev` (the depth of the previous checkpoint above n) and `a` (leaf: the depth its chain
    hangs from) are found from n's ancestors unless the caller knows them."""
    seq = self.seq = self.seq + 1
    self.entry[n] = seq
    if touch:
      stamp = self.stamp[n] = self.clock
    else:
      stamp = self.stamp[n]
    heap = self.heap
    if self.penultimate:
      heapq.heappush(heap, (self.penult[n], seq, n))
      if len(heap) > self._compact_at:
        self._compact()
      return
    if self.alpha is None:
      w = 1.0
    else:
      if self._flat_weight:  # fixed alpha 0: the FLOPs term is 1 (see __init__)
        w = 1.0
      else:
        w = self._flops_term(n, prev, a)
      if self.frequency:
        w *= 1 + self.hits[n]
      prior = self.prior
      if prior == "reach":
        w *= self.trie.reach_prior(self.kind[n])
      elif prior == "hits":
        kind = self.kind[n]
        w *= (self.kind_hit.get(kind, 0.0) + 1.0) / (self.kind_placed.get(kind, 0.0) + 2.0)
    heapq.heappush(heap, (stamp + w, seq, n))
    if len(heap) > self._compact_at:
      self._compact()

  def reweigh(self) -> None:
    """Re-pushes every held checkpoint at its stamp with the current weighting (alpha,
    prior, frequency), after the re-tuning changed it: every valid heap entry is then
    stamp + w under one weighting (the older entries go stale)."""
    for n in list(self.entry):
      self._push(n, touch=False)

  def retune(self, w: Weighting) -> None:
    """The re-tuning's switch (`eviction_weightings._retune`, a cache made with `retuned`):
    takes weighting `w` and re-weights the held checkpoints under it (`reweigh`)."""
    self.alpha, self.prior, self.frequency = w.alpha, w.prior, w.frequency
    self.penultimate = w.penultimate
    self.reweigh()

  def _compact(self) -> None:
    """Drops the heap's stale entries in place (those `_evict_one` would skip: the node was
    re-pushed since, or holds no checkpoint). Exact: entries are totally ordered by
    (priority, seq), so the valid ones pop in the same order from any heap holding them."""
    heap, entry = self.heap, self.entry
    heap[:] = [e for e in heap if entry.get(e[2]) == e[1]]
    heapq.heapify(heap)
    self._compact_at = 2 * len(heap) + _COMPACT_MIN

  def _flops_term(self, n: int, prev: int, a: int) -> float:
    """(eff / eff_ref) ** alpha of checkpoint n, eff_ref updated (see the module doc)."""
    dn = self.trie.depth[n]
    leaf = not self._nchild.item(n)
    if prev < 0 or (leaf and a < 0):
      # the previous checkpoint (0: root) and (leaf) the nearest checkpoint or branch above n
      prev, a = _marks_above(self._flag, self.trie.ancestors(n))
    sizes = self.sizes
    nbytes = sizes.ckpt_bytes  # interior: evicting it frees its state only
    if leaf:  # + the KV back to the previous checkpoint or branch point
      u, b = sizes.unit, sizes.block_size
      end = dn * u
      pages = end // b - (a * u) // b + (1 if end % b else 0)  # _chain_pages(a, dn)
      nbytes += pages * sizes.kv_page_bytes
    fl = self._flops.values  # holds every served depth (serve extends it)
    # the FLOPs difference (an exact int) rounded to a float first, as `compiled_replay` does
    eff = float(fl[dn] - fl[prev]) / max(nbytes, 1)
    self.eff_sum += eff
    self.eff_n += 1
    ref = self.eff_sum / self.eff_n
    rel = eff / ref if ref > 0 else 1.0
    return rel**self.alpha if rel > 0 else 0.0

  def _evict_one(self, pins: list[tuple[list[int], int]] | None = None) -> bool:
    """Evicts the lowest-priority unpinned unit; False when none is left. `pins`: the
    values of `_pins` (read here when None)."""
    held = []
    ok = False
    entry, nchild, heap = self.entry, self._nchild, self.heap
    depth = self.trie.depth
    if pins is None:
      pins = list(self._pins.values())
    zero_state = self.sizes.ckpt_bytes == 0
    while heap:
      prio, seq, n = heapq.heappop(heap)
      if entry.get(n) != seq:  # stale: re-pushed or evicted since (held <=> in `entry`)
        continue
      if pins:
        dn = depth[n]
        for pp, pd in pins:
          if dn <= pd and pp[dn - 1] == n:
            break
        else:
          dn = 0
        if dn:
          held.append(n)
          continue
      if zero_state and nchild.item(n):
        continue  # a zero-byte interior hit point frees nothing (re-pushed once a leaf)
      if not self.penultimate:  # GreedyDual's clock (LRU-2's priorities are access times)
        self.clock = max(self.clock, prio)
      self._drop(n)
      ok = True
      break
    for n in held:
      self._push(n, touch=False)
    return ok

  def _drop_state(self, n: int) -> None:
    """Drops checkpoint n's state and per-checkpoint entries (not its KV)."""
    self._flag[n] = self._flag.item(n) & _BRANCH  # .item: Python ints, no NumPy scalars
    self.nckpt -= 1
    del self.entry[n], self.hits[n], self.kind[n], self.stamp[n]
    if self._history:
      del self.penult[n]  # its last access stays: a ghost, read if n is placed again

  def _drop(self, n: int) -> None:
    """Evicts checkpoint n; a leaf also drops its KV chain up to the nearest ancestor that is
    a checkpoint, a branch (>= 2 children) or pinned."""
    flag, nchild = self._flag, self._nchild
    self._drop_state(n)
    self.evicted_ckpts += 1
    if nchild.item(n):
      return
    trie = self.trie
    dn = trie.depth[n]
    s0 = trie.home[n]
    flat = trie.flat  # n's root path is flat[s0 : s0 + dn]: its ancestors, then n
    a = _last_mark(flag, flat[s0 : s0 + dn - 1])  # depth of the node the chain hangs from
    for pp, pd in self._pins.values():  # a pinned ancestor deeper than a stops it too
      # the nodes pinned by (pp, pd) are pp[:pd]; n's ancestors agree with pp on a prefix
      k = min(pd, dn - 1)
      if a < k and flat.item(s0 + a) == pp[a]:
        lo, hi = a, k  # ancestor lo == pp[lo]; ancestor hi != pp[hi] or hi == k
        if flat.item(s0 + k - 1) == pp[k - 1]:
          lo = k - 1
        while hi - lo > 1:
          mid = (lo + hi) // 2
          if flat.item(s0 + mid) == pp[mid]:
            lo = mid
          else:
            hi = mid
        a = lo + 1
    chain = flat[s0 + a : s0 + dn]  # the dropped nodes, n included
    self._present[chain] = False
    nchild[chain] = 0
    self.pages -= self._chain_pages(a, dn)
    if a < self._absent and flat.item(s0 + a) == self._cur_pa.item(a):
      self._absent = a  # the chain left the last admitted path from depth a + 1 on
    if a == 0:
      self.root_children -= 1
      return
    p = flat.item(s0 + a - 1)
    c = nchild.item(p) - 1
    nchild[p] = c
    if c == 1:
      flag[p] = flag.item(p) & _CKPT
    elif c == 0:
      self.pages += self._leaf_bonus(a)
      if flag.item(p) & _CKPT:
        self._push(p, touch=False)  # became a leaf: its unit now includes its chain

  def fit(self, limit: int) -> bool:
    """Evicts until `used` <= limit; False if the pinned items alone exceed it."""
    page, state = self.sizes.kv_page_bytes, self.sizes.ckpt_bytes
    if self.pages * page + self.nckpt * state <= limit:
      return True
    pins = list(self._pins.values())  # evictions never change the pins
    while self.pages * page + self.nckpt * state > limit:
      if not self._evict_one(pins):
        return False
    return True


__all__ = ["NO_HISTORY", "ChainEviction"]
