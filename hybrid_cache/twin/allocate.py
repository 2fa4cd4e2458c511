"""`allocate_slots` of the plain-Python twin (vLLM §2.1-§2.5, `KVCacheManager.allocate_slots`).

Jitted twin: `core/allocate.py`. `remove_skipped` releases the blocks a running request no
longer needs (out of the sliding window, superseded align states; SWA pinning, SPEC B1);
`allocate_slots` checks admission (`admission`), touches the hit blocks (`add_hits`), appends
fresh blocks per group (`allocate`; align layout §2.4.3 from `rules.mamba_align_layout`),
enforces a shared byte budget and registers keys (`cache_keys.cache_blocks`). `apply_cow` /
`release_cow` are the partial-hit copy-on-writes of §2.5 (core `copy_on_write`,
`release_cows`).
"""

from __future__ import annotations

from hybrid_cache.twin import admission
from hybrid_cache.twin import block_pool
from hybrid_cache.twin import byte_budget
from hybrid_cache.twin import cache_keys
from hybrid_cache.twin import rules
from hybrid_cache.twin.state import NULL
from hybrid_cache.twin.state import Request
from hybrid_cache.twin.state import TwinState
from hybrid_cache.types import StateCopy


def remove_skipped(s: TwinState, req: Request, computed: int) -> None:
  """vLLM `remove_skipped_blocks`: nulls and frees what no group needs any more (window drops
  pin their last window, SPEC B1; align frees the superseded running state)."""
  for gid, row in enumerate(req.rows):
    kind, bs = s.groups[gid].kind, s.bs[gid]
    if kind == "full":
      continue
    c = computed
    idx = rules.skipped_indices(row, admission.skipped_tokens(s, gid, c) // bs)
    dropped = [row[i] for i in idx]
    if kind == "swa" and s.config.pinning and len(dropped) >= s.config.pin_min_drop_size:
      k = idx[0] + 1
      need = rules.cdiv(s.groups[gid].window - 1, bs)
      for i in idx:
        if i >= k - need and s.key[row[i]] is not None:
          s.pinned[row[i]] = True
    for i in idx:
      row[i] = NULL
    block_pool.free_blocks(s, dropped)
    if kind == "mamba" and s.mode[gid] == "align":
      ls = req.last_state.get(gid)
      if ls is not None and ls < rules.cdiv(c, bs) - 1 and ls < len(row):
        if row[ls] != NULL:
          b = row[ls]
          row[ls] = NULL
          block_pool.free_blocks(s, [b])


def add_hits(
  s: TwinState, req: Request, hit_rows: list[list[int]], total_computed: int, hit_tokens: int = 0
) -> None:
  """A new request takes its hit blocks (touched; skipped ones stay null); §2.5 partial tails
  are queued for a copy-on-write. The request inherits the previous access of the blocks
  serving its hit (`Request.inherit`, core `access_history`): per recurrent group (else per
  full-attention group) its deepest hit block's last access before this hit, the largest."""
  serving = [g for g, grp in enumerate(s.groups) if grp.kind == "mamba"]
  serving = serving or [g for g, grp in enumerate(s.groups) if grp.kind == "full"]
  req.inherit = 0
  for gid in serving:
    skip = admission.skipped_tokens(s, gid, total_computed) // s.bs[gid]
    kept = [b for b in hit_rows[gid][skip:] if b != NULL]
    if kept:
      req.inherit = max(req.inherit, s.last[kept[-1]])
  for gid, hits in enumerate(hit_rows):
    skip = admission.skipped_tokens(s, gid, total_computed) // s.bs[gid]
    kept = hits[skip:]
    block_pool.touch(s, kept)
    for b in kept:  # each touched hit block counts one hit on its key, re-stamped by it
      if b != NULL:
        s.hits[b] += 1
        s.stamp[b] = s.evict_clock
        s.ranked[b] = 0
        s.penult[b], s.last[b] = s.last[b], s.step  # an access: the latest becomes penultimate
    req.rows[gid] = [NULL] * skip + list(kept)
    req.chain[gid] = hit_tokens  # the latest kept state: the hit (0 = none)
  req.num_cached = [len(r) for r in req.rows]
  if not s.partial:
    return
  for gid in range(len(req.rows)):
    bs = s.bs[gid]
    kept = hit_rows[gid][admission.skipped_tokens(s, gid, total_computed) // bs :]
    if kept and hit_tokens % bs != 0:
      # §2.5: the shared tail block gets a private copy when the request allocates
      req.partial[gid] = (hit_tokens // bs, kept[-1])
      req.num_cached[gid] = hit_tokens // bs


def allocate(s: TwinState, req: Request, gid: int, need: int, main: int, first: bool) -> list[int]:
  """Appends blocks to the group's row; returns the appended entries (nulls included)."""
  row = req.rows[gid]
  bs = s.bs[gid]
  before = len(row)
  pending = req.partial.pop(gid, None)
  if s.mode[gid] == "align":
    layout, last_state = rules.mamba_align_layout(
      row,
      num_tokens_main=main,
      block_size=bs,
      num_spec_blocks=s.spec_s,
      already_allocated=not first,
      came_with_hit=first and any(b != NULL for b in row),
      pending_cow=pending is not None,
    )
    if len(layout) == before and pending is None:
      return []
    fresh_ids = block_pool.get_new_blocks(s, layout.count(rules.FRESH) + (pending is not None), gid)
    cow = fresh_ids.pop(0) if pending is not None else None
    fresh = iter(fresh_ids)
    row[:] = [next(fresh) if b == rules.FRESH else b for b in layout]
    if last_state is not None:
      req.last_state[gid] = last_state
    if pending is None:
      return row[before:]
    idx, src = pending
    if first:
      apply_cow(s, req, gid, idx, src, cow)
      return [cow] + row[before:]
    # the producer keeps writing src (append-only table): its keys move to the copy (§2.5)
    assert row[idx] == src
    end, hits, chain, stamp = s.key_end[src], s.hits[src], s.chain[src], s.stamp[src]
    history = s.last[src], s.penult[src]
    for key in block_pool.evict_key(s, src, ghost=False):
      block_pool.insert_key(s, cow, key, end, chain)
    if s.key[cow] is not None:  # the key's hits (and eviction stamp) go with it
      s.hits[cow] = hits
      s.stamp[cow] = stamp
      s.last[cow], s.penult[cow] = history
    s.cow.append((gid, req.name, src, cow))
    s.ref[src] += 1
    if s.key[cow] is not None:
      s.cached_this_step.add(s.key[cow])
    return row[before:]
  cows = []
  if pending is not None:
    cows = block_pool.get_new_blocks(s, 1, gid)
    apply_cow(s, req, gid, pending[0], pending[1], cows[0])
  tokens = need + (bs * s.spec_s if s.groups[gid].kind == "mamba" else 0)
  required = rules.cdiv(tokens, bs)
  row.extend(block_pool.get_new_blocks(s, required - before, gid))
  return cows + row[before:]


def apply_cow(s: TwinState, req: Request, gid: int, idx: int, src: int, cow: int) -> None:
  """A new request's partial hit: its row takes a private copy of the shared tail (§2.5).

  Both ends stay retained (src keeps the hit's reference, cow takes one more) until the
  step ends (`release_cow`), as vLLM's scheduler releases them after queueing the copy.
  """
  row = req.rows[gid]
  assert row[idx] == src and src != NULL
  row[idx] = cow
  s.cow.append((gid, req.name, src, cow))
  s.ref[cow] += 1


def release_cow(s: TwinState) -> list[StateCopy]:
  """End of step: the copy records (group order, then queue order) and the retention frees."""
  queued = sorted(s.cow, key=lambda c: c[0])  # stable: queue order within a group
  s.cow = []
  retained = []
  for _, _, src, cow in queued:
    retained += [src, cow]
  block_pool.free_blocks(s, retained)
  return [StateCopy(name, gid, src, cow, 0) for gid, name, src, cow in queued]


def allocate_slots(
  s: TwinState, req: Request, num_new: int, hit: int, hit_rows: list[list[int]] | None
) -> list[list[int]] | None:
  """vLLM's `allocate_slots` (§4.2); returns appended entries per group or None."""
  cfg = s.config
  first = req.num_cached is None
  local = req.num_computed + hit
  total_computed = min(local, cfg.max_model_len)
  main = total_computed + num_new
  # EAGLE lookahead slots (vLLM's num_lookahead_tokens = S): every group but Mamba align
  need = min(main + s.spec_s, cfg.max_model_len)
  ng = len(s.groups)
  hits = hit_rows if (first and hit_rows is not None) else [[] for _ in range(ng)]
  if not req.rows:
    req.rows = [[] for _ in range(ng)]
  watermark = 0
  if first and any(r.status == "running" for r in s.reqs.values() if r is not req):
    watermark = cfg.watermark_blocks
  if cfg.full_sequence_must_fit and first:
    full = min(len(req.tokens), cfg.max_model_len)
    counts = [
      admission.blocks_needed(s, req, g, full, full, hits[g], total_computed, True, hit)
      for g in range(ng)
    ]
    if not admission.fits(s, counts, watermark):
      return None
  remove_skipped(s, req, total_computed)
  counts = [
    admission.blocks_needed(s, req, g, need, main, hits[g], total_computed, False, hit)
    for g in range(ng)
  ]
  if not admission.fits(s, counts, watermark):
    return None
  if first:
    add_hits(s, req, hits, total_computed, hit)
  new = [allocate(s, req, g, need, main, first) for g in range(ng)]
  if cfg.byte_budget is not None:  # the pops may leave the cached blocks over budget
    byte_budget.enforce(s)
  if s.caching:
    cache_keys.cache_blocks(
      s, req, min(total_computed + num_new, len(req.tokens)), admitted=first, hit=hit
    )
  return new
