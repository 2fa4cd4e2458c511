"""Plain-Python reference of the cache core: vLLM 0.33's hybrid prefix cache, exactly.

`ReferencePolicy(config)` answers `hybrid_cache.types.CacheManager` with dicts, lists and
an explicit ordered free queue (readability over speed). It is the oracle the jitted core
(`hybrid_cache.manager.JaxCacheManager`) is compared with, call by call, block ids included.

Pool (reference §1.3, §1.6): block 0 is the null block; the free queue starts ordered by id;
allocation pops from the head and evicts the popped block's key; freeing puts unhashed blocks
at the head (in order) and hashed ones at the tail; a request frees tail first, one batch per
group in group order; touching a free cached block unlinks it. Optional pinned tier (SPEC B1):
SWA window drops pin the most recent window; a finished (not preempted) request pins what keeps
its prefix hittable (`rules.finish_pin_indices`, same rule as `hybrid_cache.core.release`).

Hash index (§1.5): key (hash, group) -> block ids in insertion order; lookups use the first.
Coordinator (§3.2), admission / allocation / optimistic caching (§1.7, §4.2), align-mode
layout and freeing (§2.4.3/4), block-aligned split + Marconi junction (§4.3/4), masks (§2.3.4,
§2.4.7) and pre-forward state copies (§5.2) follow `hybrid_cache.oracle.rules`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from hybrid_cache import hashing
from hybrid_cache import policies
from hybrid_cache.config import CacheConfig
from hybrid_cache.config import ResolvedGroup
from hybrid_cache.hashing import NO_EXTRAS
from hybrid_cache.hashing import RequestExtras
from hybrid_cache.oracle import eviction
from hybrid_cache.oracle import rules
from hybrid_cache.types import EntryResult
from hybrid_cache.types import HitInfo
from hybrid_cache.types import PoolStats
from hybrid_cache.types import RecurrentSlots
from hybrid_cache.types import RequestView
from hybrid_cache.types import ScheduleEntry
from hybrid_cache.types import StateCopy
from hybrid_cache.types import StepResult

NULL = 0


@dataclasses.dataclass
class _SpecGroup:
  """Groups with equal specs, looked up together (a hit needs the key in every member)."""

  kind: str
  block_size: int
  window: int | None
  mode: str
  eagle: bool
  members: list[int]


@dataclasses.dataclass
class _Request:
  name: str
  tokens: list[int]
  num_prompt_tokens: int
  extras: RequestExtras
  fine_hashes: np.ndarray
  status: str = "waiting"
  num_computed: int = 0
  rows: list[list[int]] = dataclasses.field(default_factory=list)
  num_cached: list[int] | None = None  # None = not admitted (no allocation yet)
  last_state: dict[int, int] = dataclasses.field(default_factory=dict)
  state_col: dict[int, int] = dataclasses.field(default_factory=dict)
  boundary: int = 0
  # §2.5: group -> (row index, source block) of a pending copy-on-write (vLLM _partial_hit_reqs)
  partial: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)
  # group -> token end of the latest kept state (hit at admission, then each registered state;
  # the core's `RG_CHAIN`), the chain start of the next state it registers
  chain: dict[int, int] = dataclasses.field(default_factory=dict)


class ReferencePolicy:
  """The plain-Python `CacheManager` (see module docstring)."""

  def __init__(self, config: CacheConfig):
    self.config = config
    cfg = config
    self._groups: tuple[ResolvedGroup, ...] = cfg.resolved_groups
    self._caching = cfg.enable_prefix_caching and not any(
      g.kind == "mamba" and g.mode == "none" for g in self._groups
    )
    # Effective block size per group: a recurrent group without prefix caching holds one
    # state block per request (vLLM sets its block size to max_model_len).
    self._bs = [
      cfg.max_model_len
      if g.kind == "mamba" and (g.mode == "none" or not self._caching)
      else g.block_size
      for g in self._groups
    ]
    self._mode = [
      (g.mode if self._caching else "none") if g.kind == "mamba" else None for g in self._groups
    ]
    self._sbs = cfg.scheduler_block_size
    self._hbs = cfg.resolved_hash_block_size
    # §2.5 partial (fine-grained) hits: every hit aligns to the hash block instead of the LCM
    self._partial = self._caching and cfg.partial_hits
    # beyond vLLM (`CacheConfig.fine_keys`): full-attention blocks keyed at every inner boundary
    self._fine_keys = self._partial and cfg.fine_keys
    self._align = self._hbs if self._partial else self._sbs
    self._spec_s = cfg.num_speculative_blocks
    align = [i for i, m in enumerate(self._mode) if m == "align"]
    # vLLM splits on the scheduler block (`cache_config.block_size`), whatever the groups' sizes
    # (with fine keys, beyond vLLM, the junction on the recurrent block: `junction_block_size`)
    self._split_bs = self._sbs if align else None
    self._spec_groups = self._make_spec_groups()
    # pool: ids [1, num_blocks) are pages; with `state_slots` the ids [num_blocks, pool_size)
    # are state slots, from which the mamba groups draw (`_group_pool`). One free list holds
    # both: each pool's free queue is that list restricted to its ids.
    n = cfg.pool_size
    self._group_pool = [
      1 if cfg.state_slots and g.kind == "mamba" else 0 for g in cfg.resolved_groups
    ]
    self._ref = [0] * n
    self._key: list[tuple[int, int] | None] = [None] * n
    self._pinned = [False] * n
    self._free: list[int] = list(range(1, n))
    self._pinned_free: list[int] = []  # oldest first
    self._key_end = [-1] * n  # token end of each block's key (FLOP-aware eviction)
    # per block: hits since its key was registered, its key's chain start (-1 = no key); the
    # core's `CacheState.key_hits` / `chain_start`, read by eviction policies. Kept for every
    # policy (plain Python, cheap); the core keeps them, and the eviction policy sees them,
    # only when it declares it reads them (`policies.reads_chain`, `oracle.eviction.FreeBlocks`)
    self._hits = [0] * n
    self._chain = [-1] * n
    self._evict = None if cfg.eviction == "lru" else eviction.EvictionOrder(cfg)
    # placement and admission seams (`hybrid_cache.policies`): None = vLLM's own rule
    self._placement = policies.oracle_policy("placement", cfg.placement)
    admission = policies.oracle_policy("admission", cfg.admission)
    self._admission = None if admission is None else admission.Admission(cfg)
    self._retention = policies.oracle_policy("retention", cfg.retention)
    self._index: dict[tuple[int, int], list[int]] = {}
    # extra keys of a block besides its primary one (vLLM cached_block_hashes_by_block, §2.5)
    self._extra: dict[int, list[tuple[int, int]]] = {}
    # copy-on-writes queued this step: (group, req, src, cow); released at the step's end
    self._cow: list[tuple[int, str, int, int]] = []
    self._cached_this_step: set[tuple[int, int]] = set()  # keys (hash, group) cached this step
    self._reqs: dict[str, _Request] = {}

  # ------------------------------------------------------------------------------------------
  # setup helpers
  # ------------------------------------------------------------------------------------------

  def _make_spec_groups(self) -> list[_SpecGroup]:
    out: list[_SpecGroup] = []
    for gid, g in enumerate(self._groups):
      key = (g.kind, self._bs[gid], g.window, self._mode[gid])
      for sg in out:
        if (sg.kind, sg.block_size, sg.window, sg.mode) == key:
          sg.members.append(gid)
          sg.eagle = sg.eagle or g.eagle
          break
      else:
        out.append(_SpecGroup(g.kind, self._bs[gid], g.window, self._mode[gid], g.eagle, [gid]))
    return [sg for sg in out if sg.kind == "full"] + [sg for sg in out if sg.kind != "full"]

  def _group_hashes(self, fine: np.ndarray, block_size: int) -> list[int]:
    if block_size % self._hbs:
      return []
    view = hashing.group_view(fine, block_size, self._hbs)
    return [int(x) for x in hashing.as_u64(view)] if len(view) else []

  # ------------------------------------------------------------------------------------------
  # pool primitives (§1.6) and the pinned tier (SPEC B1)
  # ------------------------------------------------------------------------------------------

  def set_eviction_alpha(self, alpha: float) -> None:
    """FLOP-aware eviction weight alpha in [0, 100] (ValueError otherwise, or if not flop_aware)."""
    if self.config.eviction != "flop_aware":
      raise ValueError(f"eviction must be 'flop_aware' to set alpha, got {self.config.eviction!r}")
    self._evict.set_alpha(alpha)

  def _pool(self, b: int) -> int:
    """0 = page, 1 = state slot (`CacheConfig.state_slots`)."""
    return int(b >= self.config.num_blocks)

  def _num_free(self, pool: int | None = None) -> int:
    """Free blocks (normal queue + pinned tier), of one pool or of both."""
    if pool is None:
      return len(self._free) + len(self._pinned_free)
    return sum(1 for b in self._free + self._pinned_free if self._pool(b) == pool)

  def _unindex(self, key: tuple[int, int], b: int) -> None:
    ids = self._index.get(key)
    if ids and b in ids:
      ids.remove(b)
      if not ids:
        del self._index[key]

  def _evict_key(self, b: int) -> list[tuple[int, int]]:
    """Drops every key of block b (primary first, then extras); returns them in that order."""
    key = self._key[b]
    removed = [] if key is None else [key]
    removed += self._extra.pop(b, [])
    for k in removed:
      self._unindex(k, b)
    self._key[b] = None
    self._key_end[b] = -1
    self._hits[b] = 0
    self._chain[b] = -1
    return removed

  def _insert_key(self, b: int, key: tuple[int, int], end: int, chain: int) -> None:
    """vLLM `_insert_block_hash`: a key becomes b's primary key (token end `end`, chain start
    `chain`, no hits yet), or an extra one if b has one."""
    if self._key[b] == key or b in self._index.get(key, ()):
      return
    if self._key[b] is None:
      self._key[b] = key
      self._key_end[b] = end
      self._hits[b] = 0
      self._chain[b] = chain
    else:
      self._extra.setdefault(b, []).append(key)
    self._index.setdefault(key, []).append(b)

  def _demote(self, n: int, pool: int | None = None) -> None:
    """Moves the n oldest pinned free blocks (of `pool`, None = any) to the normal free-queue
    tail (hash kept)."""
    for b in [b for b in self._pinned_free if pool is None or self._pool(b) == pool][:n]:
      self._pinned_free.remove(b)
      self._pinned[b] = False
      self._free.append(b)

  def _get_new_blocks(self, n: int, gid: int) -> list[int]:
    """Pops n blocks for group `gid` from the head of its pool's free queue."""
    if n <= 0:
      return []
    pool = self._group_pool[gid] if self.config.state_slots else None
    mine = self._free if pool is None else [b for b in self._free if self._pool(b) == pool]
    if len(mine) < n:
      self._demote(n - len(mine), pool)
      mine = self._free if pool is None else [b for b in self._free if self._pool(b) == pool]
    assert len(mine) >= n, "admission accounting let an allocation overflow the pool"
    out = mine[:n]
    if pool is None:
      del self._free[:n]
    else:
      taken = set(out)  # in place: the free list may be the eviction order's `StampedFree`
      self._free[:] = [b for b in self._free if b not in taken]
    for b in out:
      self._evict_key(b)
      self._pinned[b] = False
      self._ref[b] = 1
    return out

  def _touch(self, blocks: Sequence[int]) -> None:
    for b in blocks:
      if b == NULL:
        continue
      if self._ref[b] == 0:
        if b in self._pinned_free:
          self._pinned_free.remove(b)
        else:
          self._free.remove(b)
      self._ref[b] += 1

  def _free_blocks(self, ordered: Sequence[int]) -> None:
    head = []
    for b in ordered:
      if b == NULL:
        continue
      self._ref[b] -= 1
      assert self._ref[b] >= 0
      if self._ref[b] == 0:
        if self._pinned[b] and self.config.pinning:
          self._pinned_free.append(b)
        elif self._key[b] is None and self.config.free_order == "scratch_first":
          head.append(b)
        else:
          self._free.append(b)
    self._free[0:0] = head

  # ------------------------------------------------------------------------------------------
  # lookup (§2.2–§2.4, §3.2)
  # ------------------------------------------------------------------------------------------

  def _cached_fn(self, hashes: list[int], members: Sequence[int]):
    def cached(i: int):
      if i >= len(hashes):
        return None
      out = []
      for g in members:
        ids = self._index.get((hashes[i], g))
        if not ids:
          return None
        out.append(ids[0])
      return tuple(out)

    return cached

  def _find(self, sg: _SpecGroup, fine, members, max_length: int, drop: bool):
    hashes = self._group_hashes(fine, sg.block_size)
    cached = self._cached_fn(hashes, members)
    max_length = max(0, max_length)
    align = self._align
    if self._partial and sg.block_size > self._hbs and sg.kind in ("full", "mamba"):
      fine_keys = [int(x) for x in hashing.as_u64(fine)] if len(fine) else []
      cached_fine = self._cached_fn(fine_keys, members)
      if sg.kind == "full":
        return rules.find_full_fine(
          cached, cached_fine, sg.block_size, self._hbs, max_length, len(fine_keys), drop
        )
      return rules.find_mamba_fine(
        cached_fine, sg.block_size, self._hbs, max_length, len(fine_keys)
      )
    if sg.kind == "full":
      return rules.find_full(cached, sg.block_size, max_length, drop, align)
    if sg.kind == "swa":
      return rules.find_swa(cached, sg.block_size, sg.window, max_length, drop, align)
    return rules.find_mamba(cached, sg.block_size, max_length, align)

  def _lookup(self, fine: np.ndarray, num_tokens: int):
    """(HitInfo, per-group hit rows) for a fresh request of `num_tokens` tokens."""
    ng = len(self._groups)
    max_len = num_tokens - 1
    empty = HitInfo(0, (0,) * ng, (0,) * ng, 0), [[] for _ in range(ng)]
    if not self._caching or max_len <= 0:
      return empty
    # each group alone, as vLLM's `find_longest_cache_hit_per_group`: groups of equal specs are
    # looked up together (a hit needs the key in every member), each member reports that hit
    per_group = [0] * ng
    for sg in self._spec_groups:
      drop = self._groups[sg.members[0]].eagle and sg.kind != "mamba"
      hit_alone = self._find(sg, fine, sg.members, max_len, drop)[1]
      for gid in sg.members:
        per_group[gid] = hit_alone
    hit, entries, longest = self._reconcile(fine, max_len)
    rows = [[] for _ in range(ng)]
    for sg, ent in zip(self._spec_groups, entries):
      for k, gid in enumerate(sg.members):
        rows[gid] = [NULL if e is None else e[k] for e in ent]
    boundary = longest if longest > hit else 0
    info = HitInfo(
      hit_tokens=hit,
      per_group_hit_tokens=tuple(per_group),
      hit_blocks_per_group=tuple(sum(1 for b in r if b != NULL) for r in rows),
      shared_prefix_boundary=boundary,
    )
    return info, rows

  def _reconcile(self, fine: np.ndarray, max_len: int):
    """The coordinator's fixed point (§3.2): (hit, entries per spec group, longest)."""
    sgs = self._spec_groups
    if len(sgs) == 1:
      sg = sgs[0]
      drop = sg.eagle and sg.kind != "mamba"
      ent, length = self._find(sg, fine, sg.members, max_len, drop)
      return length, [ent], length
    hit = max_len
    longest = 0
    verified: set[int] = set()
    entries: list[list] = [[] for _ in sgs]
    lengths = [0] * len(sgs)
    looked_up = [False] * len(sgs)
    while True:
      cur = hit
      for k, sg in enumerate(sgs):
        if sg.kind == "full" and looked_up[k]:
          cur = min(cur, lengths[k])
          continue
        drop = sg.eagle and sg.kind != "mamba" and k not in verified
        cap = cur
        if drop:
          # EAGLE margin: one hash block for a fine-grained full-attention group (§2.5)
          fine_grained = self._partial and sg.kind == "full" and sg.block_size > self._hbs
          cap = min(cur + (self._hbs if fine_grained else sg.block_size), max_len)
        ent, length = self._find(sg, fine, sg.members, cap, drop)
        if drop:
          verified.add(k)
        elif length < cur:
          verified.clear()
        cur = length
        entries[k], lengths[k], looked_up[k] = ent, length, True
        longest = max(longest, cur)
      if cur >= hit:
        break
      hit = cur
      if len(sgs) == 2 and sgs[0].kind == "full":
        break
    for k, sg in enumerate(sgs):
      if sg.kind == "full":
        entries[k] = entries[k][: rules.cdiv(hit, sg.block_size)]
    return hit, entries, longest

  # ------------------------------------------------------------------------------------------
  # per-group managers
  # ------------------------------------------------------------------------------------------

  def _kind(self, gid: int) -> str:
    return self._groups[gid].kind

  def _skipped_tokens(self, gid: int, computed: int) -> int:
    g = self._groups[gid]
    if g.kind == "mamba" and self._mode[gid] == "none":
      return 0
    return rules.num_skipped_tokens(g.kind, computed, g.window)

  def _remove_skipped(self, req: _Request, computed: int) -> None:
    for gid, row in enumerate(req.rows):
      kind, bs = self._kind(gid), self._bs[gid]
      if kind == "full":
        continue
      c = computed
      idx = rules.skipped_indices(row, self._skipped_tokens(gid, c) // bs)
      dropped = [row[i] for i in idx]
      if kind == "swa" and self.config.pinning and len(dropped) >= self.config.pin_min_drop_size:
        k = idx[0] + 1
        need = rules.cdiv(self._groups[gid].window - 1, bs)
        for i in idx:
          if i >= k - need and self._key[row[i]] is not None:
            self._pinned[row[i]] = True
      for i in idx:
        row[i] = NULL
      self._free_blocks(dropped)
      if kind == "mamba" and self._mode[gid] == "align":
        ls = req.last_state.get(gid)
        if ls is not None and ls < rules.cdiv(c, bs) - 1 and ls < len(row):
          if row[ls] != NULL:
            b = row[ls]
            row[ls] = NULL
            self._free_blocks([b])

  def _admission_cap(self, gid: int) -> int | None:
    g = self._groups[gid]
    if g.kind != "swa":
      return None
    tokens = min(g.window - 1 + self.config.max_num_batched_tokens, self.config.max_model_len)
    return rules.cdiv(tokens, self._bs[gid]) + 1

  def _blocks_needed(
    self,
    req: _Request,
    gid: int,
    num_tokens: int,
    num_tokens_main: int,
    hits: list[int],
    total_computed: int,
    cap: bool,
    hit_tokens: int = 0,
  ) -> int:
    bs = self._bs[gid]
    row_len = len(req.rows[gid]) if req.rows else 0
    running = req.num_cached is not None
    ref = lambda b: self._ref[b]  # noqa: E731
    # §2.5: the hit ends inside this group's last hit block -> one more block for the CoW
    cow = self._partial and bool(hits) and hit_tokens % bs != 0
    if self._kind(gid) == "mamba":
      last = hits[-1] if hits else NULL
      if not running and last != NULL and self._key[last] in self._cached_this_step:
        return self.config.pool_size + 1  # same-step rule (§2.4.6): impossible count
      if self._mode[gid] == "align":
        return rules.mamba_align_blocks_needed(
          num_tokens_main=num_tokens_main,
          block_size=bs,
          num_spec_blocks=self._spec_s,
          row_len=row_len,
          already_allocated=running,
          hits=hits,
          hit_ref_cnt=ref,
          partial_cow=cow or gid in req.partial,
        )
      num_tokens = num_tokens + bs * self._spec_s
    return rules.generic_blocks_needed(
      num_tokens=num_tokens,
      block_size=bs,
      row_len=row_len,
      running=running,
      hits=hits,
      hit_ref_cnt=ref,
      skipped_tokens=self._skipped_tokens(gid, total_computed),
      admission_cap=self._admission_cap(gid) if cap else None,
      partial_cow=cow,
    )

  def _add_hits(
    self, req: _Request, hit_rows: list[list[int]], total_computed: int, hit_tokens: int = 0
  ) -> None:
    for gid, hits in enumerate(hit_rows):
      skip = self._skipped_tokens(gid, total_computed) // self._bs[gid]
      kept = hits[skip:]
      self._touch(kept)
      for b in kept:  # each touched hit block counts one hit on its key
        if b != NULL:
          self._hits[b] += 1
      req.rows[gid] = [NULL] * skip + list(kept)
      req.chain[gid] = hit_tokens  # the latest kept state: the hit (0 = none)
    req.num_cached = [len(r) for r in req.rows]
    if not self._partial:
      return
    for gid in range(len(req.rows)):
      bs = self._bs[gid]
      kept = hit_rows[gid][self._skipped_tokens(gid, total_computed) // bs :]
      if kept and hit_tokens % bs != 0:
        # §2.5: the shared tail block gets a private copy when the request allocates
        req.partial[gid] = (hit_tokens // bs, kept[-1])
        req.num_cached[gid] = hit_tokens // bs

  def _allocate(self, req: _Request, gid: int, need: int, main: int, first: bool) -> list[int]:
    """Appends blocks to the group's row; returns the appended entries (nulls included)."""
    row = req.rows[gid]
    bs = self._bs[gid]
    before = len(row)
    pending = req.partial.pop(gid, None)
    if self._mode[gid] == "align":
      layout, last_state = rules.mamba_align_layout(
        row,
        num_tokens_main=main,
        block_size=bs,
        num_spec_blocks=self._spec_s,
        already_allocated=not first,
        came_with_hit=first and any(b != NULL for b in row),
        pending_cow=pending is not None,
      )
      if len(layout) == before and pending is None:
        return []
      fresh_ids = self._get_new_blocks(layout.count(rules.FRESH) + (pending is not None), gid)
      cow = fresh_ids.pop(0) if pending is not None else None
      fresh = iter(fresh_ids)
      row[:] = [next(fresh) if b == rules.FRESH else b for b in layout]
      if last_state is not None:
        req.last_state[gid] = last_state
      if pending is None:
        return row[before:]
      idx, src = pending
      if first:
        self._apply_cow(req, gid, idx, src, cow)
        return [cow] + row[before:]
      # the producer keeps writing src (append-only table): its keys move to the copy (§2.5)
      assert row[idx] == src
      end, hits, chain = self._key_end[src], self._hits[src], self._chain[src]
      for key in self._evict_key(src):
        self._insert_key(cow, key, end, chain)
      if self._key[cow] is not None:  # the key's hits go with it
        self._hits[cow] = hits
      self._cow.append((gid, req.name, src, cow))
      self._ref[src] += 1
      if self._key[cow] is not None:
        self._cached_this_step.add(self._key[cow])
      return row[before:]
    cows = []
    if pending is not None:
      cows = self._get_new_blocks(1, gid)
      self._apply_cow(req, gid, pending[0], pending[1], cows[0])
    tokens = need + (bs * self._spec_s if self._kind(gid) == "mamba" else 0)
    required = rules.cdiv(tokens, bs)
    row.extend(self._get_new_blocks(required - before, gid))
    return cows + row[before:]

  def _apply_cow(self, req: _Request, gid: int, idx: int, src: int, cow: int) -> None:
    """A new request's partial hit: its row takes a private copy of the shared tail (§2.5).

    Both ends stay retained (src keeps the hit's reference, cow takes one more) until the
    step ends (`_release_cow`), as vLLM's scheduler releases them after queueing the copy.
    """
    row = req.rows[gid]
    assert row[idx] == src and src != NULL
    row[idx] = cow
    self._cow.append((gid, req.name, src, cow))
    self._ref[cow] += 1

  def _release_cow(self) -> list[StateCopy]:
    """End of step: the copy records (group order, then queue order) and the retention frees."""
    queued = sorted(self._cow, key=lambda c: c[0])  # stable: queue order within a group
    self._cow = []
    retained = []
    for _, _, src, cow in queued:
      retained += [src, cow]
    self._free_blocks(retained)
    return [StateCopy(name, gid, src, cow, 0) for gid, name, src, cow in queued]

  def _cacheable(self, req: _Request, gid: int, i: int) -> bool:
    # vLLM `reachable_block_mask` segments and aligns on the hit alignment (the hash block with
    # partial hits, else the scheduler block)
    g = self._groups[gid]
    r = self.config.retention_interval
    boundaries = [req.num_prompt_tokens - 1]
    if req.boundary > 0:
      boundaries.append(req.boundary)
    if self._fine_keys:  # beyond vLLM: also the scheduler-block states vLLM keeps there
      boundaries += [b for b in (rules.floor_to(x, self._sbs) for x in boundaries) if b > 0]
    if g.kind == "swa":
      return rules.swa_cacheable(
        i,
        block_size=self._bs[gid],
        need=rules.swa_need(g.window, self._bs[gid], g.eagle),
        alignment_tokens=self._align,
        eagle=g.eagle,
        retention_interval=r,
        boundaries=boundaries,
      )
    if g.kind == "mamba":
      keep = rules.mamba_cacheable(
        i,
        block_size=self._bs[gid],
        alignment_tokens=self._align,
        retention_interval=r,
        boundaries=boundaries,
      )
      if self._placement is not None:
        keep = self._placement.keep(self.config, i, self._bs[gid], self._align, boundaries, keep)
      return keep
    return True

  def _cache_blocks(self, req: _Request, num_tokens: int) -> None:
    """Optimistic caching (§1.7): register keys up to `num_tokens` (floored to the LCM).

    With partial hits (§2.5) nothing is floored and the prompt-tail entries are added too.
    """
    floored = num_tokens if self._partial else rules.floor_to(num_tokens, self._sbs)
    for gid in range(len(req.rows)):
      g, bs = self._groups[gid], self._bs[gid]
      n = floored
      if g.eagle and g.kind != "mamba":
        n = min(num_tokens, floored + bs)
      full = n // bs
      if self._partial:
        self._cache_partial_tail(req, gid, n, full)
        continue
      if req.num_cached[gid] < full:
        self._cache_full(req, gid, full)
      if g.kind == "full" and bs != self._hbs:
        # vLLM FullAttentionManager.cache_blocks: the prompt-tail entry is not gated on partial
        # hits; with n floored to sbs it is an extra key of a full block (EAGLE: maybe primary)
        self._cache_fa_tail(req, gid, n)

  def _cache_full(self, req: _Request, gid: int, full: int) -> None:
    """Keys the group's blocks [num_cached, full) (null / masked ones skipped)."""
    row, bs = req.rows[gid], self._bs[gid]
    hashes = self._group_hashes(req.fine_hashes, bs)
    state = self._groups[gid].kind == "mamba"
    for i in range(req.num_cached[gid], min(full, len(row))):
      b = row[i]
      if b == NULL or not self._cacheable(req, gid, i):
        continue
      admitted = True
      if self._admission is not None and self._groups[gid].kind == "mamba":
        admitted = self._admission.admit(gid, hashes[i])  # every kept state is offered
      if self._key[b] is not None:
        if self._key_end[b] >= (i + 1) * bs:
          continue
        self._evict_key(b)  # partial -> full promotion drops every key of the block (§2.5)
      if not admitted:
        continue
      key = (hashes[i], gid)
      self._index.setdefault(key, []).append(b)
      self._key[b] = key
      self._key_end[b] = (i + 1) * bs
      self._hits[b] = 0
      # chain start: a state's previous kept state (then this one), else the block's start
      self._chain[b] = req.chain.get(gid, 0) if state else i * bs
      if state:
        req.chain[gid] = (i + 1) * bs
      self._cached_this_step.add(key)
      if self._fine_keys and self._groups[gid].kind == "full" and bs > self._hbs:
        self._cache_fine_keys(req, gid, b, i)
    req.num_cached[gid] = full

  def _cache_fine_keys(self, req: _Request, gid: int, b: int, i: int) -> None:
    """Beyond vLLM (`CacheConfig.fine_keys`, core `cache_keys.fine_key_entries`): full block
    b at table position i, just keyed, gets an extra key at every hash-block boundary inside
    it, in token order."""
    bs, hbs = self._bs[gid], self._hbs
    for t in range(i * bs + hbs, (i + 1) * bs, hbs):
      self._insert_key(b, self._partial_key(req, t, gid), t, i * bs)

  def _cache_partial_tail(self, req: _Request, gid: int, n: int, full: int) -> None:
    """Partial-hits caching of one group (§2.5): full blocks, then the prompt-tail entry.

    Full attention keys the block holding `t = _tail_boundary(req)` under the prefix hash at
    t once n >= t; a recurrent align group only when a chunk ends exactly at t, and then its
    block (when t is inside it) waits for a copy-on-write at the request's next allocation.
    """
    row, bs, hbs = req.rows[gid], self._bs[gid], self._hbs
    if req.num_cached[gid] < full:
      self._cache_full(req, gid, full)
    kind = self._kind(gid)
    if kind == "full":
      self._cache_fa_tail(req, gid, n)
      return
    if kind != "mamba" or self._mode[gid] != "align" or bs == hbs:
      return
    # vLLM MambaManager._cache_partial_tail_block: only when the chunk ends exactly at the
    # prompt's checkpoint position (`rules.checkpoint_position`: floor((P-1)/HBS)*HBS, EAGLE
    # floor(P/HBS)*HBS - HBS)
    t = self._tail_boundary(req, gid)
    j = rules.cdiv(t, bs) - 1
    if t <= 0 or n != t or j >= len(row) or row[j] == NULL:
      return
    if self._key[row[j]] is not None and self._key_end[row[j]] == t:
      return  # already keyed at t (a hit or an earlier step)
    b = row[j]
    self._cache_partial_block(req, b, t, gid, req.chain.get(gid, 0))
    req.chain[gid] = max(req.chain.get(gid, 0), t)  # the tail state is the latest kept one
    self._cached_this_step.add(self._partial_key(req, t, gid))
    if t % bs:  # a sub-block entry: the next allocation moves it to a copy (copy-on-write)
      req.partial[gid] = (j, b)
      req.num_cached[gid] = j

  def _cache_fa_tail(self, req: _Request, gid: int, n: int) -> None:
    """vLLM `FullAttentionManager._cache_partial_tail_block` (needs bs > HBS).

    Keys the block holding t = `_tail_boundary` under the prefix hash at t once n >= t,
    unless t is 0 or block aligned, or the block is not allocated / null.
    """
    row, bs = req.rows[gid], self._bs[gid]
    t = self._tail_boundary(req, gid)
    if bs == self._hbs or t == 0 or t > n or t % bs == 0 or t // bs >= len(row):
      return
    if row[t // bs] != NULL:
      self._cache_partial_block(req, row[t // bs], t, gid, t // bs * bs)

  def _tail_boundary(self, req: _Request, gid: int) -> int:
    """The prompt-tail boundary of group `gid` (vLLM `_cache_partial_tail_block`).

    Full attention: floor((P-1)/HBS)*HBS (a re-sent prompt hits at most P-1 tokens; EAGLE
    lookups read the whole prompt: floor(P/HBS)*HBS). Recurrent: the prompt's checkpoint
    position (`rules.checkpoint_position`, EAGLE one hash block lower).
    """
    p, eagle = req.num_prompt_tokens, self.config.use_eagle
    if self._kind(gid) == "mamba":
      return rules.checkpoint_position(p, self._hbs, eagle)
    return rules.floor_to(p if eagle else p - 1, self._hbs)

  def _partial_key(self, req: _Request, t: int, gid: int) -> tuple[int, int]:
    """The key of the prefix of `t` tokens (a hash-block multiple) in group `gid`."""
    return (int(hashing.as_u64(req.fine_hashes[t // self._hbs - 1])), gid)

  def _cache_partial_block(self, req: _Request, b: int, t: int, gid: int, chain: int) -> None:
    """vLLM `cache_partial_block`: key the prefix of t tokens on block b (t inside b); `chain`:
    the key's chain start if it becomes b's primary key."""
    key = self._partial_key(req, t, gid)
    already = self._key[b] == key or b in self._index.get(key, ())
    if not already and self._key[b] is not None and self._key_end[b] < t:
      self._evict_key(b)
    self._insert_key(b, key, t, chain)

  def _fits(self, counts: list[int], watermark: int) -> bool:
    """vLLM's admission check (§4.2): the blocks needed (`counts`, per group) plus the
    watermark fit the free blocks; with two pools (`state_slots`) each pool's groups fit that
    pool, the watermark counting pages only; with a shared `byte_budget` they also fit it in
    bytes beside the held blocks (`hybrid_cache.core.byte_budget`)."""
    if not self.config.state_slots:
      return sum(counts) + watermark <= self._num_free()
    need = [0, 0]
    for g, c in enumerate(counts):
      need[self._group_pool[g]] += c
    if need[0] + watermark > self._num_free(0) or need[1] > self._num_free(1):
      return False
    cfg = self.config
    if cfg.byte_budget is None:
      return True
    held = sum(self._cost(b) for b in range(1, cfg.pool_size) if self._ref[b] > 0)
    want = (need[0] + watermark) * cfg.page_bytes + need[1] * cfg.slot_bytes
    return held + want <= cfg.byte_budget

  def _cost(self, b: int) -> int:
    """What block b occupies of the shared byte budget when held or cached."""
    return self.config.slot_bytes if self._pool(b) else self.config.page_bytes

  def _occupied_bytes(self) -> int:
    """Bytes of the held and the cached blocks (shared byte budget)."""
    return sum(
      self._cost(b)
      for b in range(1, self.config.pool_size)
      if self._ref[b] > 0 or self._key[b] is not None
    )

  def _enforce_budget(self) -> None:
    """`byte_budget.enforce`: while the held and cached blocks exceed the byte budget, the
    first cached free block in free-queue order (the normal queue, then the pinned tier,
    oldest first) loses its keys and keeps its place."""
    over = self._occupied_bytes() - self.config.byte_budget
    for b in self._free + self._pinned_free:
      if over <= 0:
        return
      if self._key[b] is not None:
        self._evict_key(b)
        over -= self._cost(b)

  def _allocate_slots(
    self, req: _Request, num_new: int, hit: int, hit_rows: list[list[int]] | None
  ) -> list[list[int]] | None:
    """vLLM's `allocate_slots` (§4.2); returns appended entries per group or None."""
    cfg = self.config
    first = req.num_cached is None
    local = req.num_computed + hit
    total_computed = min(local, cfg.max_model_len)
    main = total_computed + num_new
    # EAGLE lookahead slots (vLLM's num_lookahead_tokens = S): every group but Mamba align
    need = min(main + self._spec_s, cfg.max_model_len)
    ng = len(self._groups)
    hits = hit_rows if (first and hit_rows is not None) else [[] for _ in range(ng)]
    if not req.rows:
      req.rows = [[] for _ in range(ng)]
    watermark = 0
    if first and any(r.status == "running" for r in self._reqs.values() if r is not req):
      watermark = cfg.watermark_blocks
    if cfg.full_sequence_must_fit and first:
      full = min(len(req.tokens), cfg.max_model_len)
      counts = [
        self._blocks_needed(req, g, full, full, hits[g], total_computed, True, hit)
        for g in range(ng)
      ]
      if not self._fits(counts, watermark):
        return None
    self._remove_skipped(req, total_computed)
    counts = [
      self._blocks_needed(req, g, need, main, hits[g], total_computed, False, hit)
      for g in range(ng)
    ]
    if not self._fits(counts, watermark):
      return None
    if first:
      self._add_hits(req, hits, total_computed, hit)
    new = [self._allocate(req, g, need, main, first) for g in range(ng)]
    if cfg.byte_budget is not None:  # the pops may leave the cached blocks over budget
      self._enforce_budget()
    if self._caching:
      self._cache_blocks(req, min(total_computed + num_new, len(req.tokens)))
    return new

  # ------------------------------------------------------------------------------------------
  # scheduling (§4)
  # ------------------------------------------------------------------------------------------

  def _split(self, req: _Request, start: int, n: int, max_chunk: int) -> int:
    if self._split_bs is None:
      return n
    return rules.block_aligned_split(
      start,
      n,
      num_tokens=len(req.tokens),
      num_prompt_tokens=req.num_prompt_tokens,
      block_size=self._split_bs,
      use_eagle=self.config.use_eagle,
      shared_prefix_boundary=req.boundary,
      max_chunk_tokens=max_chunk,
      partial_hash_block=self._hbs if self._partial else None,
      junction_block_size=self.config.junction_block_size,
    )

  def _state_copies(self, req: _Request, computed_before: int, n: int) -> list[StateCopy]:
    out = []
    for gid in range(len(self._groups)):
      if self._mode[gid] != "align":
        continue
      copy, curr = rules.pre_forward_copy(req.state_col.get(gid), computed_before, n, self._bs[gid])
      req.state_col[gid] = curr
      if copy is not None:
        row = req.rows[gid]
        out.append(StateCopy(req.name, gid, row[copy[0]], row[copy[1]], 0))
    return out

  def _state_slots(self, req: _Request, start: int, n: int) -> tuple[RecurrentSlots, ...]:
    """Each recurrent group's read / write / checkpoint blocks for the chunk (§5.1-5.4)."""
    out = []
    for gid, mode in enumerate(self._mode):
      if mode is not None:
        read, write, ckpts = rules.recurrent_state_slots(
          mode, req.rows[gid], start, n, self._bs[gid]
        )
        out.append(RecurrentSlots(gid, read, write, ckpts))
    return tuple(out)

  def _schedule_one(self, entry: ScheduleEntry, budget: int):
    req = self._reqs[entry.req]
    ng = len(self._groups)
    no_new = tuple(() for _ in range(ng))
    waiting = req.status in ("waiting", "preempted")
    cfg_budget = self.config.max_num_batched_tokens
    cap = entry.max_tokens if entry.max_tokens is not None else budget
    # the split's chunk limit: the entry's cap, else the configured budget (not what is left)
    max_chunk = entry.max_tokens if entry.max_tokens is not None else cfg_budget

    def result(admission, hit, n, reason, new=no_new, slots=()):
      return EntryResult(req.name, admission, hit, n, reason, req.num_computed, new, slots)

    if waiting:
      if budget <= 0:
        return result(False, None, 0, "no_token_budget"), [], 0
      info, hit_rows = self._lookup(req.fine_hashes, len(req.tokens))
      req.boundary = info.shared_prefix_boundary if self.config.marconi_junction else 0
      hit = info.hit_tokens
      n = min(len(req.tokens) - hit, cap, budget)
      n = self._split(req, hit, n, max_chunk)
      if n <= 0:
        return result(True, info, 0, "no_token_budget"), [], 0
      new = self._allocate_slots(req, n, hit, hit_rows)
      if new is None:
        return result(True, info, 0, "allocate_slots_failed"), [], 0
      req.status = "running"
      req.num_computed = hit
      copies = self._state_copies(req, hit, n)
      slots = self._state_slots(req, hit, n)
      req.num_computed = hit + n
      return result(True, info, n, None, tuple(tuple(r) for r in new), slots), copies, n
    n = min(len(req.tokens) - req.num_computed, cap, budget)
    # a running request never reaches max_model_len (vLLM's running loop: the last position
    # is left for the token it samples)
    n = min(n, self.config.max_model_len - req.num_computed - 1)
    if n > 0:
      n = self._split(req, req.num_computed, n, max_chunk)
    if n <= 0:
      return result(False, None, 0, "no_token_budget"), [], 0
    new = self._allocate_slots(req, n, 0, None)
    if new is None:
      return result(False, None, 0, "allocate_slots_failed"), [], 0
    copies = self._state_copies(req, req.num_computed, n)
    slots = self._state_slots(req, req.num_computed, n)
    req.num_computed += n
    return result(False, None, n, None, tuple(tuple(r) for r in new), slots), copies, n

  # ------------------------------------------------------------------------------------------
  # CacheManager protocol
  # ------------------------------------------------------------------------------------------

  def _validate_tokens(self, tokens: Sequence[int], field: str) -> list[int]:
    arr = hashing.validate_tokens(tokens, field)
    return [int(t) for t in arr]

  def add_request(
    self, req: str, tokens: Sequence[int], extras: RequestExtras | None = None
  ) -> None:
    if not isinstance(req, str) or not req:
      raise ValueError(f"req must be a non-empty string, got {req!r}")
    if req in self._reqs:
      raise ValueError(f"req {req!r} is already active; free it before reusing the name")
    toks = self._validate_tokens(tokens, "tokens")
    if not toks:
      raise ValueError(f"tokens of {req!r} must be a non-empty prompt, got length 0")
    if len(toks) > self.config.max_model_len:
      raise ValueError(
        f"tokens of {req!r} must have length in [1, max_model_len={self.config.max_model_len}],"
        f" got {len(toks)}"
      )
    extras = extras or NO_EXTRAS
    fine = hashing.block_hashes(toks, self._hbs, extras)
    self._reqs[req] = _Request(req, toks, len(toks), extras, fine)

  def lookup(self, tokens: Sequence[int], extras: RequestExtras | None = None) -> HitInfo:
    toks = self._validate_tokens(tokens, "tokens")
    if not toks:
      raise ValueError("tokens must be a non-empty prompt, got length 0")
    fine = hashing.block_hashes(toks, self._hbs, extras or NO_EXTRAS)
    return self._lookup(fine, len(toks))[0]

  def schedule(self, entries: Sequence[ScheduleEntry]) -> StepResult:
    seen = set()
    for i, e in enumerate(entries):
      if e.req not in self._reqs:
        raise ValueError(
          f"entries[{i}].req must name an active request, got {e.req!r}; "
          f"active: {sorted(self._reqs)}"
        )
      if e.req in seen:
        raise ValueError(f"entries[{i}].req {e.req!r} appears twice in one step")
      seen.add(e.req)
      if e.max_tokens is not None and (
        isinstance(e.max_tokens, bool) or not isinstance(e.max_tokens, int) or e.max_tokens < 1
      ):
        raise ValueError(f"entries[{i}].max_tokens must be an integer >= 1, got {e.max_tokens!r}")
    if self._evict is not None:  # a registered eviction policy re-orders the free list
      groups = [None if k is None else k[1] for k in self._key]
      dead = eviction.dead_states(self.config, self._key, self._key_end, self._index)
      self._free = self._evict.reorder(
        self._free, groups, self._key_end, dead, self._hits, self._chain
      )
    self._cached_this_step.clear()
    budget = self.config.max_num_batched_tokens
    out, copies = [], []
    for e in entries:
      res, cps, n = self._schedule_one(e, budget)
      budget -= n
      out.append(res)
      copies.extend(cps)
    copies[0:0] = self._release_cow()  # CoW copies run first (§2.5); retention released
    return StepResult(tuple(out), tuple(copies))

  def append_tokens(self, req: str, tokens: Sequence[int]) -> None:
    r = self._get(req)
    toks = self._validate_tokens(tokens, "tokens")
    if len(r.tokens) + len(toks) > self.config.max_model_len:
      raise ValueError(
        f"tokens appended to {req!r} would make its length {len(r.tokens) + len(toks)}, "
        f"allowed at most max_model_len={self.config.max_model_len}"
      )
    r.tokens.extend(toks)
    r.fine_hashes = hashing.extend_block_hashes(r.fine_hashes, r.tokens, self._hbs, r.extras)

  def _get(self, req: str) -> _Request:
    if req not in self._reqs:
      raise ValueError(
        f"req must name an active request, got {req!r}; active: {sorted(self._reqs)}"
      )
    return self._reqs[req]

  def _pin_finished(self, r: _Request) -> None:
    """Flags the blocks that keep a finishing request's prefix hittable (SPEC B1), or those the
    retention policy picks (`hybrid_cache.policies`, seam `retention`)."""
    keyed, sel, kinds = [], [], []
    for gid, row in enumerate(r.rows):
      g = self._groups[gid]
      keyed.append([i for i, b in enumerate(row) if b != NULL and self._key[b] is not None])
      need = rules.swa_need(g.window, self._bs[gid], g.eagle) if g.kind == "swa" else 1
      sel.append(rules.finish_pin_indices(g.kind, keyed[-1], need))
      kinds.append((g.kind, self._bs[gid], need))
    if self._retention is not None:
      sel = self._retention.pin(self.config, kinds, keyed, sel, r.num_prompt_tokens, self._align)
    for row, idx in zip(r.rows, sel):
      for i in idx:
        self._pinned[row[i]] = True

  def _release(self, r: _Request, finished: bool) -> None:
    """Frees a request's blocks tail first, group by group; a finished one pins first."""
    if finished and self.config.pinning:
      self._pin_finished(r)
    for row in r.rows:
      self._free_blocks(list(reversed(row)))
    r.rows = []
    r.num_cached = None
    r.last_state.clear()
    r.state_col.clear()
    r.partial.clear()
    r.chain.clear()

  def free(self, req: str) -> None:
    r = self._get(req)
    self._release(r, finished=True)
    del self._reqs[req]

  def preempt(self, req: str) -> None:
    r = self._get(req)
    self._release(r, finished=False)
    r.num_computed = 0
    r.boundary = 0
    r.status = "preempted"

  def reset_prefix_cache(self) -> bool:
    if self._num_free() != self.config.pool_size - 1:
      return False
    self._demote(len(self._pinned_free))
    self._index.clear()
    self._extra.clear()
    self._key = [None] * self.config.pool_size
    self._hits = [0] * self.config.pool_size
    self._chain = [-1] * self.config.pool_size
    self._pinned = [False] * self.config.pool_size
    self._cached_this_step.clear()
    return True

  def pool_stats(self) -> PoolStats:
    ng = len(self._groups)
    per_group = [0] * ng
    for key in self._key:
      if key is not None:
        per_group[key[1]] += 1
    free = self._num_free()
    free_cached = sum(1 for b in self._free + self._pinned_free if self._key[b] is not None)
    return PoolStats(
      num_free_blocks=free,
      num_used_blocks=self.config.pool_size - 1 - free,
      num_free_cached_blocks=free_cached,
      cached_blocks_per_group=tuple(per_group),
      num_pinned_blocks=len(self._pinned_free),
    )

  def request_view(self, req: str) -> RequestView:
    r = self._get(req)
    rows = r.rows or [[] for _ in self._groups]
    return RequestView(
      req=r.name,
      status=r.status,
      num_computed_tokens=r.num_computed,
      num_tokens=len(r.tokens),
      num_prompt_tokens=r.num_prompt_tokens,
      block_ids=tuple(tuple(row) for row in rows),
    )

  def active_requests(self) -> tuple[str, ...]:
    return tuple(self._reqs)

  # ------------------------------------------------------------------------------------------
  # test-only helpers
  # ------------------------------------------------------------------------------------------

  def evict_hash(
    self, tokens: Sequence[int], group: int, block_index: int, extras: RequestExtras | None = None
  ) -> int:
    """Test only: drops key (hash of group-block `block_index` of `tokens`, group).

    Mirrors vLLM's tests that pop a key from the hash map. Returns how many blocks lost it.
    """
    fine = hashing.block_hashes(list(tokens), self._hbs, extras or NO_EXTRAS)
    hashes = self._group_hashes(fine, self._bs[group])
    key = (hashes[block_index], group)
    ids = self._index.pop(key, [])
    for b in ids:
      if self._key[b] == key:
        self._key[b] = None
      elif key in self._extra.get(b, ()):
        self._extra[b].remove(key)
    return len(ids)

  def cached_positions(self, tokens: Sequence[int], group: int) -> set[int]:
    """Test only: group-block indices of `tokens` whose key is in the index for `group`."""
    req = next((r for r in self._reqs.values() if r.tokens == list(tokens)), None)
    fine = req.fine_hashes if req is not None else hashing.block_hashes(list(tokens), self._hbs)
    hashes = self._group_hashes(fine, self._bs[group])
    return {i for i, h in enumerate(hashes) if (h, group) in self._index}

  def evict_blocks(self, block_ids: Sequence[int]) -> None:
    """Drops the keys of these blocks (vLLM's `KVCacheManager.evict_blocks`); test helper."""
    for b in block_ids:
      self._evict_key(b)

  def chain_features(self) -> dict[int, tuple[int, int, int, int]]:
    """Test only: keyed block -> (group, token end, hits, chain start) of its primary key (hits
    and chain start kept for every policy; the core has them only under
    `policies.reads_chain`)."""
    return {
      b: (key[1], self._key_end[b], self._hits[b], self._chain[b])
      for b, key in enumerate(self._key)
      if key is not None
    }

  def ref_count(self, block: int) -> int:
    """Test only: the block's reference count."""
    return self._ref[block]

  def free_queue(self) -> tuple[int, ...]:
    """Test only: the normal free queue, head first."""
    return tuple(self._free)
