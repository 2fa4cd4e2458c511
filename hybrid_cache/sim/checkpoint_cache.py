"""A prefix cache whose recurrent checkpoints sit at multiples of a unit U, decoupled from KV pages.

Issue 15, item 2. vLLM keeps a recurrent state only where a chunk ends on a KV block boundary
and pads the state to a KV page; the kernels can emit a state at any chunk boundary (64 tokens)
at no extra compute, so here:

- Content is a trie of U-token *units* shared by every cache of a replay (`seen_trie.py`: node
  k of a request covers tokens [kU, (k+1)U)); only whole units of a request's computed tokens
  (input + output - 1) are cached.
- A cache holds, per node, the full-attention KV of the unit (*present* nodes are prefix-closed)
  and optionally a *checkpoint* (the recurrent state after the unit, plus the sliding-window KV
  of the last `swa_window` tokens when the model has sliding-window layers).
- A hit of request r is the deepest depth d <= (input - 1) // U such that the first d units are
  present and (recurrent models) node d - 1 holds a checkpoint: hits are multiples of U, capped
  at input - 1 tokens (the last prompt token is always computed, as in vLLM). Models without
  recurrent layers hit at the deepest present unit.
- Bytes are exact, one capacity for both kinds (`checkpoint_costs.py`): checkpoints cost
  `ckpt_bytes` each (never padded to a page) and KV is allocated in pages of B tokens
  (`block_size`), a page shared by the branches that agree on all of its cached tokens.
- A request's life is `admit` (lookup, at its admission) then `finish` (insertion, when it has
  computed everything); `serve` = both, the sequential replay of the other simulators. At r's
  admission the cache (everything but the hit paths of the running requests, which are pinned:
  `_pin` counts the running requests whose hit path holds a node) is evicted until cache + the
  working sets of the running requests and r's fit the capacity (a working set: the KV pages of
  the request's tokens after the last whole page of its hit, and one running state), so a
  policy never holds more than the capacity, its running requests included. At r's finish, the
  *placement* rule picks the depths that get a checkpoint; the KV of r's path up to the deepest
  one is kept (KV past the last checkpoint cannot serve a recurrent hit and is dropped); r's
  working set is released and the cache is evicted to the capacity minus the working sets still
  running. With one request at a time (sequential) nothing else is pinned or reserved.
- Retirement (`retire=True` at r's finish, decided by the placement rule: `adaptive` sets it
  while the checkpoints its requests supersede are rarely used again,
  `adaptive_stats.SupersessionStats`): once r's new checkpoints are in, every checkpoint
  on r's path above its deepest new one that has a single present child is *superseded* (a
  request reaching it continues to the deeper one) and is dropped at once, its state only (its
  KV is the deeper chain's prefix), unless the trie saw that point reused after an earlier
  supersession (`SeenTrie.reused_from` <= r: a shared system prompt's state, which each new
  session passes and extends). A chat session's previous turn keeps a state that only a
  regenerated answer would use: without retirement each session holds one state (~409 tokens of
  KV on marconi_7b) per turn until eviction reaches it. With an access history (LRU-2, below)
  the deepest new checkpoint takes the latest penultimate access of those it retires, so the
  session's chain keeps its history.
- Admission control (`can_admit`, the concurrent replay): a request waits unless the capacity
  covers the running working sets, a bound on the running requests' pinned hit paths (whole
  pages of the hit + its path's checkpoints, summed without sharing) and its own working set
  without a hit, so the eviction at its admission always fits (recurrent models: once every
  unpinned checkpoint is evicted, only the pinned paths remain).

Eviction is chain-aware GreedyDual over a checkpoint and, for a leaf, its KV chain (Marconi's
evictable node), weighted by FLOPs saved per byte, hits and a prior per placement kind; or LRU-2
on chains (`chain_eviction.py`, the base class of `UnitCache`).

The replay is online: what happens at request r depends only on requests 0..r (no trace-wide
statistic is read), so replaying a prefix of a trace gives the prefix of the full replay.

Layout for speed (same decisions as one object per node): the trie and its flat array of walked
paths are shared by every cache of a replay (`seen_trie.py`); the caches' per-node state is one
row each of `CacheBank`'s [K, nodes] arrays (`cache_bank.py`), so a sweep over capacities finds
all K caches' hits with one gather per request; a chain of KV units is added or dropped by one
scatter, its pages telescoped (`UnitCache._chain_pages`). In the sequential replay
`UnitCache.serve` is admit + finish in one call (BENCHMARKS.md, "Capacity sweep under
`adaptive`", for what each bought). The sequential replay's default is `compiled_replay`, this
class's step compiled with numba (same decisions, checked against this class by
`tests/hybrid_cache/sim/compiled_replay_test.py`): a change here must be made there too.
"""

from __future__ import annotations

import bisect

import numpy as np

from hybrid_cache.sim.cache_bank import _BRANCH
from hybrid_cache.sim.cache_bank import _CKPT
from hybrid_cache.sim.cache_bank import CacheBank
from hybrid_cache.sim.cache_bank import lookup
from hybrid_cache.sim.chain_eviction import _COMPACT_MIN
from hybrid_cache.sim.chain_eviction import NO_HISTORY
from hybrid_cache.sim.chain_eviction import ChainEviction
from hybrid_cache.sim.checkpoint_costs import CacheSizes
from hybrid_cache.sim.checkpoint_costs import flops_table
from hybrid_cache.sim.cost_model import CostModel
from hybrid_cache.sim.seen_trie import SeenTrie

PRIORS = ("hits", "reach", "none")


class UnitCache(ChainEviction):
  """One cache over a shared `SeenTrie`.

  Per-node state is two numpy arrays indexed by trie node id, grown with the trie: `_present`
  (bool) and `_nchild` (int32: present children), and `_flag` (uint8 bits: _CKPT = holds a
  checkpoint, _BRANCH = >= 2 present children), so the nearest checkpoint or branch above a node
  is one gather over its ancestors. What only checkpoints carry (`entry`, `hits`, `kind`, `stamp`)
  lives in dicts keyed by node. The pinned nodes are `path[:d]` of each running request with a
  hit of d units (`_pins`: r -> (path, d); one entry at most in the sequential replay), not a
  per-node field: a node of depth k is pinned iff some entry has d >= k and path[k - 1] == it.
  Chains are handled by depth arithmetic: the
  KV pages of the nodes at depths a+1..e of one root path telescope to `(e U) // B - (a U) // B`
  (+1 when e ends mid-page as a leaf), so adding or dropping a chain costs one numpy
  gather/scatter, not a step per node.
  """

  def __init__(
    self,
    trie: SeenTrie,
    sizes: CacheSizes,
    model: CostModel,
    alpha: float | None,
    prior: str = "hits",
    frequency: bool = True,
    bank: CacheBank | None = None,
    retuned: bool = False,
    penultimate: bool = False,
  ):
    """alpha: the eviction weight's exponent (>= 0); None = plain LRU (every weight 1).
    prior: "hits" (share of this cache's checkpoints of the kind that served a hit), "reach"
    (share of the kind's candidate points a later request passed, `SeenTrie.reach_prior`) or
    "none"; frequency: multiply by 1 + hits. bank: the `CacheBank` holding this cache's row
    (a new one of its own when None). retuned: alpha, prior and frequency may be changed
    between requests (the live cache of `adaptive`'s online re-tuning). penultimate: evict by
    the time of each checkpoint's penultimate access instead (LRU-2 on chains, `chain_eviction.py`;
    alpha, prior and frequency are then unused).

    With alpha 0 fixed (not retuned) the FLOPs term is (eff / eff_ref) ** 0 = 1 whenever
    eff > 0, and eff = (F(d U) - F(a U)) / bytes > 0 for a < d when F = `prefill_flops` is
    strictly increasing: the cost model's F is a sum of nondecreasing polynomials in L with
    nonnegative coefficients, strictly increasing once F(U) > F(0) (checked here). Such a cache
    skips eff and its running mean (`_flat_weight`), which nothing else reads."""
    if prior not in PRIORS:
      raise ValueError(f"prior must be one of {PRIORS}, got {prior!r}")
    self.trie, self.sizes, self.model = trie, sizes, model
    self.alpha, self.prior, self.frequency = alpha, prior, frequency
    self.bank = CacheBank() if bank is None else bank
    self.row = len(self.bank.caches)  # this cache's row in the bank
    self.bank.add(self)  # sets the row views _present, _flag, _nchild
    self._absent = 0  # first absent unit of the last admitted path (drops lower it)
    self._cur = -1  # the last admitted request while nothing else changed the cache since
    self._cur_pa = self._nchild[:0]  # its path (int64 array)
    # per held checkpoint n (entries are deleted when it is evicted, so the dicts stay as
    # small as the cache: keeping evicted nodes' entries made a 16-point sweep's 96 caches
    # hold ~5M of them, and every lookup a cache miss)
    self.entry: dict[int, int] = {}  # seq of n's valid heap entry (older entries are stale)
    self.hits: dict[int, int] = {}
    self.kind: dict[int, int] = {}
    self.stamp: dict[int, float] = {}  # the clock when checkpoint n was last inserted or hit
    self._pins: dict[int, tuple[list[int], int]] = {}  # running r with a hit -> (path, d)
    self.reserved = 0  # working sets of the running requests (bytes)
    self.pinned_bound = 0  # bound on their pinned hit paths (bytes, module doc)
    # r -> (path, path array, d, work, bound) of the admitted, unfinished requests
    self.running: dict[int, tuple[list[int], np.ndarray, int, int, int]] = {}
    self.root_children = 0
    self.pages = 0
    self.nckpt = 0
    self.heap: list = []
    self._compact_at = _COMPACT_MIN  # heap length that triggers `_compact`
    self.clock = 0.0
    self.seq = 0
    self.eff_sum, self.eff_n = 0.0, 0
    self.kind_placed: dict[int, float] = {}
    self.kind_hit: dict[int, float] = {}
    self.evicted_ckpts = 0
    self.admitted_ckpts = 0
    self.retired_ckpts = 0  # superseded checkpoints dropped at insertion (`_retire`)
    self._flops = flops_table(model, sizes.unit)
    self.retuned = retuned
    self.penultimate = penultimate
    # LRU-2 on chains (kept when it is the weighting, or may become it: a re-tuned cache, whose
    # tuner may list an LRU-2 weighting): per checkpoint its last
    # access, also after it is evicted (LRU-K's retained history: without it a re-placed point
    # counts as new and LRU-2 starves, real ShareGPT 2e9: 1.39e15 vs 5.70e15 FLOPs saved), and
    # per held checkpoint its penultimate one (`_now` counts the lookups; a checkpoint without
    # an earlier access has penultimate `_now - NO_HISTORY`)
    self._history = penultimate or retuned
    self.lastref: dict[int, int] = {}
    self.penult: dict[int, float] = {}
    self._now = 0
    self._inherit = 0.0  # the penultimate access a new checkpoint of the current request gets
    fl = self._flops.extend(1)
    self._flat_weight = alpha == 0 and not retuned and fl[1] > fl[0]
    self._recurrent = sizes.recurrent

  # ---- per-node views (copies, for checks) ----
  @property
  def present(self) -> list[bool]:
    return self._present[: len(self.trie)].tolist()

  @property
  def ckpt(self) -> list[bool]:
    return (self._flag[: len(self.trie)] & _CKPT).astype(bool).tolist()

  @property
  def nchild(self) -> list[int]:
    return self._nchild[: len(self.trie)].tolist()

  # ---- sizes ----
  def _grow(self) -> None:
    self.bank.grow(len(self.trie))

  @property
  def used(self) -> int:
    return self.pages * self.sizes.kv_page_bytes + self.nckpt * self.sizes.ckpt_bytes

  def _chain_pages(self, a: int, e: int) -> int:
    """Pages charged to a leaf chain of present nodes at depths a+1..e of one root path:
    pages ending in them (telescoped) + 1 if the leaf ends mid-page."""
    u, b = self.sizes.unit, self.sizes.block_size
    end = e * u
    return end // b - (a * u) // b + (1 if end % b else 0)

  def _leaf_bonus(self, depth: int) -> int:
    return 1 if (depth * self.sizes.unit) % self.sizes.block_size else 0

  def flops(self, depth: int) -> int:
    return self._flops.extend(depth)[depth]

  # ---- one request ----
  def serve(
    self,
    r: int,
    path: list[int],
    cap: int,
    n_comp: int,
    place,
    found: tuple[int, int, int, int, int] | None = None,
    fresh: tuple[int, int] | None = None,
    retire: bool = False,
  ) -> int:
    """Replays request r alone; returns its hit in tokens.

    Same decisions as `admit(r, ..., bound=False)` then `finish(r, place, fresh, retire)` (the two
    share `_take_hit` and `_insert`), in one call without the running-request bookkeeping,
    which nothing reads between the two when nothing else runs: the sequential replay calls
    this K times per request, and what it skips was ~10% of a call (Mooncake sweep, 2026-11-25).
    """
    pa = self._path_and_flops(path)
    if found is None:
      found = self._lookup_one(path, pa, cap)
    d, _ = self._take_hit(r, path, pa, found)
    s = self.sizes
    bs, page, state = s.block_size, s.kv_page_bytes, s.ckpt_bytes
    room = s.capacity - self.reserved  # nothing else is admitted during this call
    npages = -(-n_comp // bs)
    work = (npages - (d * s.unit) // bs) * page + state  # `_work` (state = 0: attention only)
    if self.pages * page + self.nckpt * state > room - work and not self.fit(room - work):
      self._pins.pop(r, None)  # the hit path does not fit beside the working set: recompute
      d = 0
      self.fit(room - npages * page - state)
    self._cur = -1
    self._insert(r, path, pa, d, place, fresh, retire)
    self._pins.pop(r, None)
    if self.pages * page + self.nckpt * state > room:
      self.fit(room)
    return d * s.unit

  def _work(self, n_comp: int, hit_tokens: int) -> int:
    """A working set: the KV pages after the hit's last whole page, + one running state."""
    s = self.sizes
    pages = -(-n_comp // s.block_size) - hit_tokens // s.block_size
    return pages * s.kv_page_bytes + (s.ckpt_bytes if s.recurrent else 0)

  def can_admit(self, n_comp: int) -> bool:
    """Admission control (module docstring): True when nothing runs or a request computing
    `n_comp` tokens fits beside the running ones whatever its hit."""
    need = self.reserved + self.pinned_bound + self._work(n_comp, 0)
    return not self.running or need <= self.sizes.capacity

  def _path_and_flops(self, path: list[int]) -> np.ndarray:
    """The path's array; the FLOPs table extended to its depth (pushes read it)."""
    if len(self._flops.values) <= len(path):
      self._flops.extend(len(path))
    return self.trie.path_array(path)

  def _lookup_one(self, path: list[int], pa: np.ndarray, cap: int):
    """This cache's row of `lookup` (when the caller did not look up the whole bank)."""
    self._grow()
    old = self.trie.existed(path)
    return tuple(x[0] for x in lookup(self._present[None], self._flag[None], pa, cap, old))

  def _take_hit(self, r: int, path: list[int], pa: np.ndarray, found) -> tuple[int, int]:
    """Applies r's lookup row `found` (see `admit`): pins the hit path and re-weights the
    checkpoint serving it; returns (the hit depth d in units, the serving checkpoint's depth)."""
    f, last, prev, top, self._absent = found
    self._cur, self._cur_pa = r, pa
    d = last if self._recurrent else f
    if d:
      self._pins[r] = (path, d)
    if self._history:
      now = self._now = self._now + 1
      self._inherit = now - NO_HISTORY  # new checkpoints of a request without a hit
    if last:  # the hit is served by the deepest checkpoint; shallower ones are not used
      n = path[last - 1]
      if self._history:
        before = self.lastref[n]
        self.penult[n] = self._inherit = before  # the chain's access before this one
        self.lastref[n] = now
      self.hits[n] += 1
      kind = self.kind[n]
      self.kind_hit[kind] = self.kind_hit.get(kind, 0.0) + 1.0
      self._push(n, prev=prev, a=top)
    return d, last

  def admit(
    self,
    r: int,
    path: list[int],
    cap: int,
    n_comp: int,
    found: tuple[int, int, int, int, int] | None = None,
    bound: bool = True,
  ) -> int:
    """Looks request r up, pins its hit path and reserves its working set (module docstring);
    returns its hit in tokens.

    `found`: this cache's row of `CacheBank.lookup(path, cap)` when the caller looked up all
    caches of the bank at once (after every cache grew to the trie), else it is looked up here.
    `bound`: add the hit path's bound to `pinned_bound` (read by `can_admit` only; `serve`
    finishes at once and skips it).
    """
    pa = self._path_and_flops(path)
    if found is None:
      found = self._lookup_one(path, pa, cap)
    d, last = self._take_hit(r, path, pa, found)
    s = self.sizes
    hit_tokens = d * s.unit
    work = self._work(n_comp, hit_tokens)
    if not self.fit(s.capacity - self.reserved - work):
      self._pins.pop(r, None)  # the hit path does not fit beside the working set: recompute
      d, hit_tokens, last = 0, 0, 0
      work = self._work(n_comp, 0)
      self.fit(s.capacity - self.reserved - work)
    b = 0
    if bound and d:  # whole pages of the hit + the checkpoints on its path
      b = -(-hit_tokens // s.block_size) * s.kv_page_bytes
      if last and s.ckpt_bytes:
        b += int(np.count_nonzero(self._flag[pa[:last]] & _CKPT)) * s.ckpt_bytes
    self.reserved += work
    self.pinned_bound += b
    self.running[r] = (path, pa, d, work, b)
    return hit_tokens

  def finish(
    self, r: int, place, fresh: tuple[int, int] | None = None, retire: bool = False
  ) -> int:
    """Inserts admitted request r's placements and releases it; returns the checkpoints added.

    `place(hit_depth)` returns the depths (1-based units, <= len(path)) that get a checkpoint,
    with their kind: a list of (depth, kind). `fresh` = (old, deepest): the units of r's path
    at depths old + 1..deepest were created by r and are already written as this call adds
    them (`CacheBank.insert_fresh`); deepest must be this call's deepest placement. `retire`:
    drop the checkpoints r's new ones supersede (module docstring, `_retire`).
    """
    path, pa, d, work, b = self.running.pop(r)
    self.reserved -= work
    self.pinned_bound -= b
    if self._cur != r:  # the cache changed since r's lookup: find its first absent unit again
      pres = self._present[pa]
      self._absent = len(pa) if pres.all() else int(pres.argmin())
      self._cur_pa = pa
    self._cur = -1
    added = self._insert(r, path, pa, d, place, fresh, retire)
    self._pins.pop(r, None)
    self.fit(self.sizes.capacity - self.reserved)
    return added

  def _insert(
    self, r: int, path: list[int], pa: np.ndarray, d: int, place, fresh, retire: bool = False
  ) -> int:
    """`finish`'s insertion of a request with hit depth d (see `finish`): its KV chain up to
    the deepest placement and its new checkpoints, pushed, then (`retire`) the superseded
    ones dropped; returns how many were added."""
    if self._recurrent:
      places = place(d)
    else:  # attention only: every unit is a zero-byte hit point
      places = [(k + 1, 0) for k in range(d, len(path))]
    deepest = max([q for q, _ in places]) if places else 0
    refresh: list[int] = []
    flag, nchild = self._flag, self._nchild
    if deepest:
      sub = pa[:deepest]
      j = min(self._absent, deepest)  # present units along a path are a prefix
      if j < deepest:  # add path[j:deepest] as one chain hanging from path[j - 1]
        if j == 0:
          self.root_children += 1
        else:
          p = path[j - 1]
          c = nchild.item(p)
          if c == 0:
            self.pages -= self._leaf_bonus(j)
            if flag.item(p) & _CKPT:
              refresh.append(j)  # no longer a leaf: its unit is now its state alone
          elif c == 1:
            flag[p] = flag.item(p) | _BRANCH
          nchild[p] = c + 1
        if fresh is None:
          self._present[sub[j:]] = True
          nchild[sub[j : deepest - 1]] = 1
        else:  # units old + 1..deepest are written (fresh[1] == deepest > old >= j)
          o = fresh[0]
          if fresh[1] != deepest or j > o:
            raise ValueError(f"fresh={fresh} does not match the chain {j}..{deepest}")
          if j < o:
            self._present[sub[j:o]] = True
            nchild[sub[j:o]] = 1
        self.pages += self._chain_pages(j, deepest)
    new = []
    kinds, hits, placed = self.kind, self.hits, self.kind_placed
    for q, kind in places:
      n = path[q - 1]
      fn = flag.item(n)
      if fn & _CKPT:
        continue
      flag[n] = fn | _CKPT
      kinds[n] = kind
      hits[n] = 0
      if self._history:
        before = self.lastref.get(n)  # a ghost: n held a checkpoint before
        self.penult[n] = self._inherit if before is None else before
        self.lastref[n] = self._now
      placed[kind] = placed.get(kind, 0.0) + 1.0
      new.append(q)
    self.nckpt += len(new)
    self.admitted_ckpts += len(new)
    if self._flat_weight:
      for q in [q for q in refresh if q not in new] + new:
        self._push(path[q - 1], q in new)
    elif new or refresh:
      # one gather along the path gives every pushed node's previous checkpoint and (leaf)
      # chain top: nothing changes between these pushes
      f = flag[pa[:deepest]]
      cks = (f & _CKPT).nonzero()[0].tolist()
      marks = f.nonzero()[0].tolist()
      for q, touch in [(q, False) for q in refresh if q not in new] + [(q, True) for q in new]:
        i = bisect.bisect_left(cks, q - 1)
        prev = cks[i - 1] + 1 if i else 0
        i = bisect.bisect_left(marks, q - 1)
        self._push(path[q - 1], touch, prev, marks[i - 1] + 1 if i else 0)
    if retire and new:
      self._retire(r, pa, new[-1])
    return len(new)

  def _retire(self, r: int, pa: np.ndarray, e: int) -> None:
    """Drops the states of the checkpoints request r's new one at depth e of path `pa`
    supersedes: those above it with a single present child, not seen reused by request r
    (module docstring, "Retirement"); with an access history, the one at e takes the latest
    penultimate access among them."""
    seg = pa[: e - 1]
    gone = seg[
      ((self._flag[seg] & _CKPT) != 0) & (self._nchild[seg] == 1) & (self.trie.reused_from[seg] > r)
    ].tolist()
    if not gone:
      return
    if self._history:
      ne = pa.item(e - 1)
      latest = max(self.penult[n] for n in gone)
      if latest > self.penult[ne]:
        self.penult[ne] = latest
        if self.penultimate:
          self._push(ne, touch=False)
    for n in gone:
      self._drop_state(n)
    self.retired_ckpts += len(gone)


__all__ = ["PRIORS", "UnitCache"]
