"""One scheduler step over a padded batch of entries, in list order, in ONE jitted call.

Per entry (vLLM §4): a waiting request is looked up (coordinator), the chunk is limited by the
token budget, `max_tokens` and the block-aligned split (§4.3, align mode), then `allocate_slots`:
release skipped blocks, count, check capacity (full-sequence gate and watermark for admissions),
touch the hit blocks, allocate fresh blocks per group (align: §2.4.3), and register keys
optimistically up to the scheduler-block floor of the computed tokens (§1.7), with retention
masks (§2.3.4, §2.4.7). Entries run sequentially (`lax.scan`), so a later entry sees the keys an
earlier one registered in the same step (same-step rule, §2.4.6).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_cache.core import admission
from hybrid_cache.core import block_index
from hybrid_cache.core import block_pool
from hybrid_cache.core import compile_cache
from hybrid_cache.core import coordinator
from hybrid_cache.core import eviction
from hybrid_cache.core import release as release_lib
from hybrid_cache.config import CacheConfig
from hybrid_cache.core.groups import recurrent
from hybrid_cache.core.groups import sliding_window
from hybrid_cache.core.state import AUX_END
from hybrid_cache.core.state import AUX_STEP
from hybrid_cache.core.state import BIG
from hybrid_cache.core.state import C_REC_ADMITTED
from hybrid_cache.core.state import C_SEQ
from hybrid_cache.core.state import C_STEP
from hybrid_cache.core.state import C_TAIL
from hybrid_cache.core.state import INFO_COMPUTED
from hybrid_cache.core.state import INFO_PROMPT
from hybrid_cache.core.state import INFO_SPB
from hybrid_cache.core.state import INFO_STATUS
from hybrid_cache.core.state import INFO_TOKENS
from hybrid_cache.core.state import P_FULL_FIT
from hybrid_cache.core.state import P_JUNCTION
from hybrid_cache.core.state import P_MAX_BATCHED
from hybrid_cache.core.state import P_MAX_MODEL_LEN
from hybrid_cache.core.state import P_NUM_BLOCKS
from hybrid_cache.core.state import P_PIN_MIN_DROP
from hybrid_cache.core.state import P_RETENTION
from hybrid_cache.core.state import P_WATERMARK
from hybrid_cache.core.state import RG_LAST
from hybrid_cache.core.state import RG_LEN
from hybrid_cache.core.state import RG_NCACHED
from hybrid_cache.core.state import STATUS_EMPTY
from hybrid_cache.core.state import STATUS_RUNNING
from hybrid_cache.core.state import STATUS_WAITING
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import Layout
from hybrid_cache.core.state import cdiv
from hybrid_cache.core.state import floor_to
from hybrid_cache.core.state import layout

REASON_NONE, REASON_ALLOC, REASON_BUDGET = 0, 1, 2
# admit-only steps with at least this many (padded) entries pop from a per-step free-queue
# order (`block_pool.queue_order`; smaller ones scatter the pool per pop, cheaper below ~4
# entries) and write each request's req_info row once (`_entry`'s `one_write`)
ORDER_MIN_ENTRIES = 8


# ---------------------------------------------------------------------------------------------
# block-aligned split (§4.3)


def checkpoint_position(num_tokens, unit: int, eagle: bool):
  """vLLM `get_mamba_prefill_checkpoint_position` (`reference.rules.checkpoint_position`):
  floor((N-1)/unit)*unit, EAGLE floor(N/unit)*unit - unit, never below 0."""
  if eagle:
    return jnp.maximum(floor_to(num_tokens, unit) - unit, 0)
  return jnp.maximum(floor_to(num_tokens - 1, unit), 0)


def split(lay: Layout, start, n, num_tokens, num_prompt, spb, max_chunk):
  """Tokens to schedule so chunk ends land where a recurrent state is cached (align mode).

  vLLM 0.33 `Scheduler._mamba_block_aligned_split`, the same rule as
  `reference.rules.block_aligned_split` (see there), on the scheduler block: a chunk ending
  before the prefill end is floored to the block unless that leaves nothing and the block is
  wider than `max_chunk` (the entry's cap, else the configured budget); then it stops at the
  earliest of the next block boundary (a chunk starting mid-block), the last cacheable
  boundary floor((N-1)/B)*B, the partial-tail boundary floor((P-1)/HBS)*HBS (partial hits),
  the block-floored junction. Example (bs 4, 22-token prompt, no hit, n 22): 20, then 2.
  """
  if not lay.align_bs:
    return n
  bs = lay.sbs
  eagle = any(g.eagle for g in lay.groups)
  prefill_end = jnp.maximum(num_prompt, num_tokens - 1)
  decode = start >= prefill_end
  lcp = checkpoint_position(num_tokens, bs, eagle)  # last cacheable boundary (SPEC A8)
  end = start + n
  aligned = floor_to(end, bs)
  end = jnp.where((end < prefill_end) & ((aligned > start) | (bs <= max_chunk)), aligned, end)
  nxt = cdiv(start, bs) * bs
  cands = [
    jnp.where(start % bs != 0, nxt, BIG),
    lcp,
    jnp.where((start < spb) & (spb < end), start + floor_to(spb - start, bs), BIG),
  ]
  if lay.partial:  # §2.5: a chunk stops at the prompt's last hash boundary (partial entry)
    tail = checkpoint_position(num_prompt, lay.hash_block_size, eagle)
    cands.append(jnp.where((lcp < tail) & (tail < num_prompt), tail, BIG))
  best = end
  for s in cands:
    best = jnp.where((s > start) & (s < best), s, best)
  return jnp.where(decode, n, jnp.maximum(best - start, 0))


# ---------------------------------------------------------------------------------------------
# releasing skipped blocks (§2.1, §2.3.3, §2.4.4, pinning SPEC B1)


def remove_skipped(lay: Layout, config: CacheConfig, state: CacheState, r, c) -> CacheState:
  """Frees blocks of request `r` no longer needed once `c` tokens are computed."""
  pos = jnp.arange(lay.max_blocks)
  for g, spec in enumerate(lay.groups):
    if spec.kind == "full" or (spec.kind == "mamba" and spec.mode == "none"):
      continue
    row = state.tables[r, g]
    length = state.req_group[r, g, RG_LEN]
    cg = c
    k = jnp.minimum(admission.skipped_blocks(spec, cg), length)
    j0 = jnp.max(jnp.where((pos < k) & (row == 0), pos, -1))
    drop = (pos > j0) & (pos < k)
    if spec.kind == "swa" and config.pinning:
      need = -(-(spec.window - 1) // spec.block_size)
      big_enough = (k - 1 - j0) >= state.params[P_PIN_MIN_DROP]
      to_pin = drop & (pos >= k - need) & big_enough & (state.block_group[row] >= 0)
      state = block_pool.pin(state, jnp.where(to_pin, row, 0))
    ids = jnp.where(drop, row, 0)[::-1]
    state = block_pool.free_ordered(state, ids, jnp.zeros_like(ids))
    row = jnp.where(drop, 0, row)
    rg = state.req_group
    if spec.kind == "mamba" and spec.mode == "align":
      ls = state.req_group[r, g, RG_LAST]
      due = (ls >= 0) & (ls < cdiv(cg, spec.block_size) - 1)
      blk = jnp.where(due, row[jnp.maximum(ls, 0)], 0)
      state = block_pool.free_ordered(state, blk[None], jnp.zeros((1,), jnp.int32))
      row = jnp.where(due & (pos == ls), 0, row)
      rg = state.req_group.at[r, g, RG_LAST].set(jnp.where(due, -1, ls))
    state = state.replace(tables=state.tables.at[r, g].set(row), req_group=rg)
  return state


# ---------------------------------------------------------------------------------------------
# allocation + caching


def _allocate(
  lay: Layout,
  config: CacheConfig,
  state: CacheState,
  r,
  is_new,
  hit,
  hit_ids,
  n,
  ok,
  queued,
  keys=None,
  order=None,
  info=None,
):
  """Touches hits, allocates fresh blocks per group and registers keys (allocate_slots 4-6).

  Every write is masked by `ok` (bool): with `ok` False the state is returned unchanged, so
  the caller needs no `lax.cond` (whose branches copy the state leaves on XLA:CPU).
  `queued` (i32[2]): blocks in the normal free queue and in the pinned tier before the hits
  are touched. Returns (state, queued after the touches and pops), and the head of `order`
  (`block_pool.pop_many`) after the pop when given (before a partial-hit step's cows).
  `info` (optional i32[5]): the request's `req_info` row as the caller writes it back at the
  end of the entry (read from the state when not given).

  All groups' fresh blocks come from ONE vectorised pop (groups pop in order from the same
  queue, so the concatenation is the queue's first `sum(counts)` blocks).
  """
  if info is None:
    info = state.req_info[r]
  start = info[INFO_COMPUTED] + hit
  main = start + n
  need_tokens = jnp.minimum(main + lay.lookahead, state.params[P_MAX_MODEL_LEN])
  s = lay.num_spec_blocks
  pos = jnp.arange(lay.max_blocks)
  touched = jnp.where(ok, hit_ids, 0).reshape(-1)
  # touching unlinks the hits that sit in a queue (small gather, no pool reduction)
  in_queue = (touched > 0)[None, :] & (state.queue_key[:, touched] < BIG)
  n_norm, n_pin = queued - jnp.sum(in_queue, axis=1).astype(jnp.int32)
  # touch scatters into queue_key in place only if XLA sees every read of it (the gather
  # above) ordered before: the ids depend on n_norm (>= 0 always, so this is the identity);
  # without it XLA copies the [2, NB] array twice per entry
  touched = jnp.where(n_norm >= 0, touched, 0)
  state = block_pool.touch(state, touched)
  rows = jnp.where(is_new, hit_ids, state.tables[r])
  rg = state.req_group[r]
  # per-group values collected in Python lists and stacked once (one small array op instead
  # of a chain of single-element updates per group)
  row_l, len_l, nc_l, last_l, bases, counts = [], [], [], [], [], []
  # partial hits (§2.5): per group, a copy-on-write block is the group's first popped block;
  # `cow_new` (a new request's hit ending inside the block: the copy replaces the hit block at
  # `hit // bs`), `cow_own` (a recurrent partial entry on the request's own running block: the
  # key moves to the copy, the table keeps the block)
  cow_new_l, cow_own_l, cow_src_l = [], [], []
  for g, spec in enumerate(lay.groups):
    bs = spec.block_size
    hits_len = jnp.where(is_new, cdiv(hit, bs) if lay.partial else hit // bs, 0)
    len0 = rg[g, RG_LEN]
    length = jnp.where(is_new, hits_len, len0)
    # a partial hit caches its last (copied) block again once it is full: hit // bs
    nc_l.append(jnp.where(is_new, hit // bs if lay.partial else hits_len, rg[g, RG_NCACHED]))
    if lay.partial:
      cow_new = is_new & (hit > 0) & (hit % bs != 0)
      cow_own = jnp.bool_(False)
      if spec.kind == "mamba" and spec.mode == "align":
        cow_own = ~is_new & (state.req_partial[r, g] > 0)
      own_pos = jnp.maximum(state.req_partial[r, g] - 1, 0)
      src = jnp.where(cow_new, rows[g, jnp.minimum(hit // bs, lay.max_blocks - 1)], 0)
      src = jnp.where(cow_own, rows[g, own_pos], src)
      cow_new_l.append(cow_new)
      cow_own_l.append(cow_own)
      cow_src_l.append(src)
      has_cow = cow_new | cow_own
    last = rg[g, RG_LAST]
    row = rows[g]
    if spec.kind == "mamba" and spec.mode == "align":
      req = cdiv(main, bs) + s
      grow = req > length
      enter = (grow | has_cow) if lay.partial else grow
      prev = length
      last_state = jnp.where(len0 > 0, prev - 1 - s, jnp.where(hits_len > 0, prev - 1, -1))
      skip_to = req - s - 1
      base = jnp.maximum(prev, skip_to)
      nrel = jnp.int32(0)
      for t in range(s):
        j = prev - s + t
        move = grow & (len0 > 0) & (j >= 0) & (j < skip_to)
        blk = row[jnp.maximum(j, 0)]
        row = jnp.where(move & (pos == base + nrel), blk, row)
        row = jnp.where(move & (pos == j), 0, row)
        nrel = nrel + move.astype(jnp.int32)
      bases.append(base + nrel)
      counts.append(jnp.where(grow, req - base - nrel, 0))
      last = jnp.where(enter, last_state, last)
      length = jnp.maximum(length, req)
    elif spec.kind == "mamba" and spec.mode == "none":
      cnt = jnp.where(length == 0, 1 + s, 0)
      bases.append(length)
      counts.append(cnt)
      length = length + cnt
    else:
      extra = bs * s if spec.kind == "mamba" else 0
      target = cdiv(need_tokens + extra, bs)
      cnt = jnp.maximum(target - length, 0)
      bases.append(length)
      counts.append(cnt)
      length = length + cnt
    if lay.partial:
      counts[-1] = counts[-1] + has_cow.astype(jnp.int32)
    row_l.append(row)
    len_l.append(length)
    last_l.append(last)
  rows = jnp.stack(row_l)
  rg = jnp.stack([jnp.stack(len_l), jnp.stack(nc_l), jnp.stack(last_l)], axis=1)
  # exclusive prefix of the counts by scalar adds (a cumsum is a reduce-window thunk)
  offsets = [jnp.int32(0)]
  for g in range(1, lay.num_groups):
    offsets.append(offsets[-1] + counts[g - 1])
  kmax = lay.num_groups * lay.max_blocks
  total = jnp.where(ok, sum(counts[1:], counts[0]), 0)
  popped = block_pool.pop_many(
    state, total, kmax, lay.recurrent_groups, n_norm=n_norm, scan_all=lay.extra_keys, order=order
  )
  state, ids = popped[:2]
  k1 = jnp.minimum(total, n_norm)  # popped from the normal queue, the rest from the pinned tier
  queued = jnp.stack([n_norm - k1, n_pin - (total - k1)])
  # fresh blocks of every group in one [G, MB] gather
  j = pos[None, :] - jnp.stack(bases)[:, None]
  take = (j >= 0) & (j < jnp.stack(counts)[:, None])
  if lay.partial:  # the copy-on-write block comes first in its group's pops
    first = jnp.stack([(a | b).astype(jnp.int32) for a, b in zip(cow_new_l, cow_own_l)])
    take &= j < (jnp.stack(counts) - first)[:, None]
    fresh = ids[jnp.clip(jnp.stack(offsets)[:, None] + first[:, None] + j, 0, kmax - 1)]
  else:
    fresh = ids[jnp.clip(jnp.stack(offsets)[:, None] + j, 0, kmax - 1)]
  rows = jnp.where(take, fresh, rows)
  cows = None
  if lay.partial:
    cow_ids = jnp.where(first > 0, ids[jnp.clip(jnp.stack(offsets), 0, kmax - 1)], 0)
    cow_ids = jnp.where(ok, cow_ids, 0)
    cow_new = jnp.stack(cow_new_l) & ok
    cow_own = jnp.stack(cow_own_l) & ok
    srcs = jnp.where(ok, jnp.stack(cow_src_l), 0)
    # a new request's copy replaces the hit block it copies (position hit // bs)
    at = jnp.stack([hit // g.block_size for g in lay.groups])
    rows = jnp.where(cow_new[:, None] & (pos[None, :] == at[:, None]), cow_ids[:, None], rows)
    state = _cow(lay, state, r, cow_new, cow_own, srcs, cow_ids)
    cows = jnp.stack([srcs, cow_ids], axis=1)  # i32[G, 2] (src, copy), 0 = none
  state = state.replace(
    tables=state.tables.at[r].set(jnp.where(ok, rows, state.tables[r])),
    req_group=state.req_group.at[r].set(jnp.where(ok, rg, state.req_group[r])),
  )
  state = _cache(lay, config, state, r, start + n, ok, keys, info)
  head = popped[2:]  # () without `order`
  if lay.partial:
    return (state, queued, *head, cows)
  return (state, queued, *head)


def _cow(lay: Layout, state: CacheState, r, cow_new, cow_own, srcs, cow_ids) -> CacheState:
  """Copy-on-write of partial hits (vLLM §2.5), per group (bool[G] / i32[G] arguments).

  A new request's copy (`cow_new`) takes one more reference (the step end releases it and
  the source's hit reference). A running request's own partial entry (`cow_own`) moves its key
  (index entry, hash, group, token end; registration step = now, so no same-step hit) from the
  source to the copy, the source takes one more reference (released at the step end, where
  the copy, held by no table, becomes a free cached block) and the pending entry is cleared.
  """
  nb = lay.num_blocks
  buckets = state.index_entry.shape[0]
  ref = state.ref_cnt.at[jnp.where(cow_new, cow_ids, nb)].add(1, mode="drop")
  ref = ref.at[jnp.where(cow_own, srcs, nb)].add(1, mode="drop")
  state = state.replace(ref_cnt=ref)
  # key move src -> copy (index entry re-pointed with a fresh insertion sequence number)
  src = jnp.where(cow_own, srcs, 0)
  grp = jnp.where(cow_own, state.block_group[src], -1)
  keyed = cow_own & (grp >= 0)
  h = state.block_hash[src]
  b = block_index.bucket_of(h, grp, buckets)
  hit = (state.index_entry[b, :, 0] == src[:, None]) & keyed[:, None]
  way = jnp.min(jnp.where(hit, jnp.arange(hit.shape[1]), hit.shape[1]), axis=1)
  c = state.counters
  seq = c[C_SEQ] + jnp.cumsum(keyed.astype(jnp.int32)) - 1
  bi = jnp.where(keyed & (way < hit.shape[1]), b, buckets)
  ent = state.index_entry.at[bi, way].set(jnp.stack([cow_ids, seq], axis=-1), mode="drop")
  dst = jnp.where(keyed, cow_ids, nb)
  sdx = jnp.where(keyed, src, nb)
  aux_src = state.block_aux[src]
  step = c[C_STEP]
  aux_new = jnp.stack([jnp.full_like(src, step), jnp.zeros_like(src), aux_src[:, AUX_END]], axis=1)
  state = state.replace(
    index_entry=ent,
    block_group=state.block_group.at[dst].set(grp, mode="drop").at[sdx].set(-1, mode="drop"),
    block_hash=state.block_hash.at[dst].set(h, mode="drop"),
    block_aux=state.block_aux.at[dst]
    .set(aux_new, mode="drop")
    .at[sdx, AUX_STEP]
    .set(-1, mode="drop")
    .at[sdx, AUX_END]
    .set(-1, mode="drop"),
    counters=c.at[C_SEQ].add(jnp.sum(keyed).astype(jnp.int32)),
    req_partial=state.req_partial.at[r].set(jnp.where(cow_own, 0, state.req_partial[r])),
  )
  return state


def _cache(
  lay: Layout, config: CacheConfig, state: CacheState, r, computed, ok=True, keys=None, info=None
):
  """Registers keys of request `r`'s full blocks up to the scheduler-block floor (§1.7).

  Nothing is written when `ok` (bool) is False. `keys` (optional): the request's
  (`coordinator.query_keys`, their buckets), precomputed. `info` (optional): the request's
  `req_info` row (read from the state when not given).
  """
  if not lay.caching:
    return state
  if info is None:
    info = state.req_info[r]
  raw = jnp.minimum(computed, info[INFO_TOKENS])
  # with partial hits (§1.7, §2.5) the cached tokens are not floored to the scheduler block
  nc = raw if lay.partial else floor_to(raw, lay.sbs)
  pos = jnp.arange(lay.max_blocks)
  hashes = state.req_hashes[r]
  boundaries = (info[INFO_PROMPT] - 1, info[INFO_SPB])
  all_ids, all_keys, all_groups, all_ends, all_prom, n_g = [], [], [], [], [], []
  rg = state.req_group[r]
  for g, spec in enumerate(lay.groups):
    bs = spec.block_size
    eagle = spec.eagle and spec.kind != "mamba"
    upto = (jnp.minimum(raw, nc + bs) if eagle else nc) // bs
    row = state.tables[r, g]
    nca = rg[g, RG_NCACHED]
    unkeyed = state.block_group[row] < 0
    if g in lay.tail_groups:  # partial -> full promotion (§2.5): a shorter key is replaced
      promote = ~unkeyed & (state.block_aux[row, AUX_END] < (pos + 1) * bs)
      all_prom.append(jnp.where(promote & (pos >= nca) & (pos < upto) & (row > 0) & ok, row, 0))
      unkeyed = unkeyed | promote
    sel = (pos >= nca) & (pos < upto) & (row > 0) & unkeyed & ok
    if spec.kind == "swa":
      need = -(-(spec.window - 1) // bs) + (1 if spec.eagle else 0)
      sel &= sliding_window.retention_mask(
        pos, bs, need, lay.hit_align, state.params[P_RETENTION], spec.eagle, boundaries
      )
    elif spec.kind == "mamba":
      if spec.mode == "none":
        sel &= False
      else:
        sel &= recurrent.retention_mask(
          pos, bs, lay.hit_align, state.params[P_RETENTION], boundaries
        )
    if keys is None:
      all_keys.append(coordinator.group_hashes(lay, hashes, info[INFO_TOKENS], g)[0])
    all_ids.append(jnp.where(sel, row, 0))
    all_groups.append(jnp.full((lay.max_blocks,), g, jnp.int32))
    all_ends.append((pos + 1) * bs)
    rg = rg.at[g, RG_NCACHED].set(jnp.where(ok, jnp.maximum(nca, upto), nca))
    if lay.tail_groups:
      n_g.append(jnp.minimum(raw, nc + bs) if eagle else nc)
  ids = jnp.concatenate(all_ids)
  if all_prom:  # every key of a promoted block goes (its extra partial key too)
    prom = jnp.concatenate(all_prom)
    state = block_index.evict_ids(state, prom, scan_all=True)
  if keys is None:
    state = block_index.insert(state, ids, jnp.concatenate(all_keys), jnp.concatenate(all_groups))
  else:  # the same keys, groups and buckets (group-major, `coordinator.query_keys`)
    state = block_index.insert(state, ids, keys[0], jnp.concatenate(all_groups), keys[1])
  nb = lay.num_blocks
  step = state.counters[C_STEP]
  sidx = jnp.where(ids > 0, ids, nb)
  # registration step and token end of each registered block in ONE [k, 2] scatter
  cols = jnp.asarray([AUX_STEP, AUX_END], jnp.int32)
  ends = jnp.concatenate(all_ends)
  vals = jnp.stack([jnp.full_like(ends, step), ends], axis=1)
  aux = state.block_aux.at[sidx[:, None], cols[None, :]].set(vals, mode="drop")
  counters = state.counters
  if lay.recurrent_groups:
    n_rec = sum(jnp.sum(all_ids[g] > 0) for g in lay.recurrent_groups).astype(jnp.int32)
    counters = counters.at[C_REC_ADMITTED].add(n_rec)
  state = state.replace(block_aux=aux, req_group=state.req_group.at[r].set(rg), counters=counters)
  if lay.tail_groups:
    state = _cache_partial_tail(lay, state, r, n_g, ok, info)
  return state


def _cache_partial_tail(lay: Layout, state: CacheState, r, n_g, ok, info=None) -> CacheState:
  """Partial entries (vLLM §2.5 `_cache_partial_tail_block`, `cache_partial_block`) of the fine
  groups (`Layout.tail_groups`), after the full blocks are cached.

  `n_g`: per group, the tokens the group caches up to (unfloored with partial hits, else the
  scheduler-block floor, EAGLE full attention one own block more). Full attention (with or
  without partial hits, vLLM `FullAttentionManager.cache_blocks`): boundary t =
  floor((P-1)/HBS)*HBS (EAGLE floor(P/HBS)*HBS); whenever t <= n and t is not block aligned,
  the block holding t gets t's key. Recurrent `align` (partial hits, vLLM
  `MambaManager._cache_partial_tail_block`): t = the prompt's checkpoint position
  (`checkpoint_position`); only when n == t (a chunk ends exactly there) and the state block
  ending at t is not keyed at t already, that block gets the key (registration step = now, no
  same-step hit) and, when t is inside it, is remembered in `req_partial` for the
  copy-on-write of the request's next allocation. The key becomes the block's own key if it
  has none (a shorter own key is dropped first), else an extra index entry (the block keeps
  its longer key).
  """
  gs = list(lay.tail_groups)
  if info is None:
    info = state.req_info[r]
  hbs = lay.hash_block_size
  # the prompt-tail boundary: full attention floor((P-1)/HBS)*HBS (a re-sent prompt hits at
  # most P-1 tokens; EAGLE lookups read the whole prompt: P), recurrent the prompt's checkpoint
  # position (EAGLE one hash block lower)
  eagle = any(g.eagle for g in lay.groups)
  prompt = info[INFO_PROMPT]
  t_full = floor_to(prompt if eagle else prompt - 1, hbs)
  t_rec = checkpoint_position(prompt, hbs, eagle)
  hashes = state.req_hashes[r]
  ids, ts = [], []
  for g in gs:
    bs = lay.groups[g].block_size
    t = t_full if lay.groups[g].kind == "full" else t_rec
    ts.append(t)
    if lay.groups[g].kind == "full":  # the block holding t, t inside it, once cached past t
      p = t // bs
      cond = (t % bs != 0) & (t <= n_g[g])
    else:  # the state block ending at t, when a chunk ends exactly there (t may be aligned)
      p = cdiv(t, bs) - 1
      cond = n_g[g] == t
    cond &= ok & (t > 0) & (p < state.req_group[r, g, RG_LEN])
    blk = state.tables[r, g, jnp.clip(p, 0, lay.max_blocks - 1)]
    if lay.groups[g].kind != "full":  # already keyed at t (a hit or an earlier step)
      cond &= ~((state.block_group[blk] >= 0) & (state.block_aux[blk, AUX_END] == t))
    ids.append(jnp.where(cond, blk, 0))
  ids = jnp.stack(ids)
  t = jnp.stack(ts)  # i32[len(gs)]: each group's boundary
  grp = jnp.asarray(gs, jnp.int32)
  keys = hashes[jnp.clip(t // hbs - 1, 0, hashes.shape[0] - 1)]  # u32[len(gs), 2]
  bg = state.block_group[ids]
  primary_same = (bg == grp) & jnp.all(state.block_hash[ids] == keys, axis=-1)
  already = (ids > 0) & (primary_same | block_index.has_entry(state, keys, grp, ids))
  shorter = (ids > 0) & ~already & (bg >= 0) & (state.block_aux[ids, AUX_END] < t)
  state = block_index.evict_ids(state, jnp.where(shorter, ids, 0), scan_all=True)
  keyed = state.block_group[ids] >= 0
  prim = jnp.where((ids > 0) & ~already & ~keyed, ids, 0)
  extra = jnp.where((ids > 0) & ~already & keyed, ids, 0)
  state = block_index.insert(state, prim, keys, grp)
  state = block_index.insert_extra(state, extra, keys, grp)
  nb = lay.num_blocks
  sidx = jnp.where(prim > 0, prim, nb)
  step = state.counters[C_STEP]
  vals = jnp.stack([jnp.full_like(prim, step), jnp.zeros_like(prim) + t], axis=1)
  cols = jnp.asarray([AUX_STEP, AUX_END], jnp.int32)
  aux = state.block_aux.at[sidx[:, None], cols[None, :]].set(vals, mode="drop")
  ncached = state.req_group[r, :, RG_NCACHED]
  pend = state.req_partial[r]
  n_rec = jnp.int32(0)
  for i, g in enumerate(gs):
    if lay.groups[g].kind != "mamba":
      continue
    # the state block just written: keep it pending for the copy-on-write (and the same-step
    # rule) even if it already carried this key
    bs = lay.groups[g].block_size
    aux = aux.at[jnp.where(ids[i] > 0, ids[i], nb), AUX_STEP].set(step, mode="drop")
    ti = t[i]
    sub = (ids[i] > 0) & (ti % bs != 0)  # a sub-block entry: copy-on-write at the next allocation
    ncached = ncached.at[g].set(jnp.where(sub, ti // bs, ncached[g]))
    pend = pend.at[g].set(jnp.where(sub, ti // bs + 1, pend[g]))
    n_rec = n_rec + ((prim[i] > 0) | (extra[i] > 0)).astype(jnp.int32)
  return state.replace(
    block_aux=aux,
    req_group=state.req_group.at[r, :, RG_NCACHED].set(ncached),
    req_partial=state.req_partial.at[r].set(pend),
    counters=state.counters.at[C_REC_ADMITTED].add(n_rec),
  )


# ---------------------------------------------------------------------------------------------
# one entry, one step


def _lookup_or_zero(lay, state, r, is_new, keys=None, info=None):
  if info is None:
    info = state.req_info[r]
  g_n, mb = lay.num_groups, lay.max_blocks

  def yes(_):
    return coordinator.lookup(lay, state, state.req_hashes[r], info[INFO_TOKENS], keys)

  def no(_):
    z = jnp.int32(0)
    return dict(
      hit=z,
      alone=jnp.zeros((g_n,), jnp.int32),
      hit_mask=jnp.zeros((g_n, mb), bool),
      found=jnp.full((g_n, mb), -1, jnp.int32),
      spb=z,
    )

  return jax.lax.cond(is_new, yes, no, None)


def _lookup_masked(lay, state, r, is_new, keys=None, info=None):
  """`_lookup_or_zero` without the `lax.cond`: the lookup always runs and its outputs are
  masked by `is_new` (same values). For steps where (nearly) every entry is new: the cond's
  nested executor and its output copies cost more than the rare wasted lookup."""
  if info is None:
    info = state.req_info[r]
  lk = coordinator.lookup(lay, state, state.req_hashes[r], info[INFO_TOKENS], keys)
  z = jnp.int32(0)
  return dict(
    hit=jnp.where(is_new, lk["hit"], z),
    alone=jnp.where(is_new, lk["alone"], z),
    hit_mask=lk["hit_mask"] & is_new,
    found=jnp.where(is_new, lk["found"], -1),
    spb=jnp.where(is_new, lk["spb"], z),
  )


def _entry(
  lay: Layout,
  config: CacheConfig,
  carry,
  x,
  admit_only: bool = False,
  one_write: bool = False,
):
  """One entry of a step (the scan body). `admit_only` (static): no entry's request is
  running, so no entry releases skipped blocks and the `remove_skipped` cond is left out
  (XLA:CPU copies the state leaves a cond passes through, even on its identity branch).
  `one_write` (static, with `admit_only`): the request's req_info row is read once and
  written once (see below)."""
  # carry: (state, budget, queued) or, from an admit-only `schedule_step`, also the
  # precomputed free-queue order and its head (`block_pool.queue_order`)
  state, budget, queued = carry[:3]
  order = carry[3:] or None
  # x: (slot, max_tokens, valid) or, from `schedule_step`, also the slot's precomputed query
  # keys and buckets (`coordinator.query_keys`; the request hashes do not change in a step)
  r, max_tok, valid = x[:3]
  keys = x[3:] if len(x) > 3 else None
  # one_write (admit-only steps of several entries): the request's req_info row in its own
  # buffer, read by the lookup, `_allocate` and `_cache` instead of req_info, and written
  # ONCE at the end of the entry (one in-place update; the general path writes it twice and
  # re-reads it, which XLA runs faster for `admit_one` in the simulator's scan)
  one_write = one_write and admit_only
  info = block_index.materialise(state.req_info[r]) if one_write else state.req_info[r]
  status = info[INFO_STATUS]
  has_budget = budget > 0
  is_new = valid & (status == STATUS_WAITING) & has_budget
  # admit-only steps: every valid entry is waiting or preempted, so the lookup runs unmasked
  lookup = _lookup_masked if admit_only else _lookup_or_zero
  lk = lookup(lay, state, r, is_new, keys, info if one_write else None)
  hit = jnp.where(is_new, lk["hit"], 0)
  spb_new = jnp.where(state.params[P_JUNCTION] != 0, lk["spb"], 0)
  spb = jnp.where(is_new, spb_new, info[INFO_SPB])
  num_tokens = info[INFO_TOKENS]
  start = info[INFO_COMPUTED] + hit
  remaining = num_tokens - start
  cap = jnp.where(max_tok >= 0, max_tok, BIG)
  n0 = jnp.maximum(jnp.minimum(jnp.minimum(remaining, budget), cap), 0)
  # a running request never reaches max_model_len (vLLM's running loop leaves the last
  # position for the token it samples)
  mml = state.params[P_MAX_MODEL_LEN]
  n0 = jnp.where(is_new, n0, jnp.maximum(jnp.minimum(n0, mml - start - 1), 0))
  max_chunk = jnp.where(max_tok >= 0, max_tok, state.params[P_MAX_BATCHED])
  n = split(lay, start, n0, num_tokens, info[INFO_PROMPT], spb, max_chunk)
  active = valid & (status != STATUS_EMPTY)
  attempt = active & (n > 0)

  # skip mask per group: hits before the out-of-window / superseded prefix are not kept
  pos = jnp.arange(lay.max_blocks)
  hit_ids = []
  for g, spec in enumerate(lay.groups):
    skip = admission.skipped_blocks(spec, hit)
    keep = lk["hit_mask"][g] & (pos >= skip) & is_new
    hit_ids.append(jnp.where(keep, lk["found"][g], 0))
  hit_ids = jnp.stack(hit_ids)

  # allocate_slots without `lax.cond` over the state (XLA:CPU copies the state leaves a cond
  # passes through): every write below is masked by `attempt` / `ok`
  c = info[INFO_COMPUTED]

  def release_skipped(carry):
    s = remove_skipped(lay, config, carry[0], r, c)
    return s, free_counts(s)

  if not admit_only:  # only a running request (status RUNNING) continues with `~is_new`
    state, queued = jax.lax.cond(attempt & ~is_new, release_skipped, lambda sq: sq, (state, queued))
  main = start + n
  need_tokens = jnp.minimum(main + lay.lookahead, state.params[P_MAX_MODEL_LEN])
  count, impossible = admission.blocks_needed(
    lay, config, state, r, is_new, hit, hit_ids, need_tokens, main
  )
  free = queued[0] + queued[1]  # = block_pool.num_free(state)
  ok = attempt & ~impossible & (count <= free)
  full_main = num_tokens  # full_sequence_must_fit (a runtime parameter)
  full_need = jnp.minimum(num_tokens, state.params[P_MAX_MODEL_LEN])
  fcount, _ = admission.blocks_needed(
    lay, config, state, r, is_new, hit, hit_ids, full_need, full_main, swa_cap=True
  )
  others = (state.req_info[:, INFO_STATUS] == STATUS_RUNNING) & (jnp.arange(lay.max_requests) != r)
  watermark = jnp.where(jnp.any(others), state.params[P_WATERMARK], 0)
  # the watermark applies to the full-sequence gate too (vLLM `allocate_slots`: both counts
  # are checked against the free blocks less the watermark)
  ok &= ~is_new | (fcount + watermark <= free) | (state.params[P_FULL_FIT] == 0)
  ok &= ~is_new | (count + watermark <= free)
  spb_row = jnp.where(attempt & (ok | ~is_new), spb, info[INFO_SPB])
  if one_write:  # column selects, not updates of the row (no copies)
    col = jnp.arange(info.shape[0])
    info = jnp.where(col == INFO_SPB, spb_row, info)
  else:
    state = state.replace(req_info=state.req_info.at[r, INFO_SPB].set(spb_row))
  lens_now = state.req_group[r, :, RG_LEN]
  bss = jnp.asarray(lay_bs(lay))
  hit_len = (hit + bss - 1) // bss if lay.partial else hit // bss
  lens_before = jnp.where(attempt & is_new, hit_len, lens_now)
  row = info if one_write else None
  res = _allocate(lay, config, state, r, is_new, hit, hit_ids, n, ok, queued, keys, order, row)
  state, queued = res[:2]
  if one_write:
    info = jnp.where(ok & (col == INFO_COMPUTED), start + n, info)
    info = jnp.where(ok & (col == INFO_STATUS), STATUS_RUNNING, info)
    state = state.replace(req_info=state.req_info.at[r].set(info))
    computed = info[INFO_COMPUTED]
  else:
    inf = state.req_info[r]
    done = inf.at[INFO_COMPUTED].set(start + n).at[INFO_STATUS].set(STATUS_RUNNING)
    state = state.replace(req_info=state.req_info.at[r].set(jnp.where(ok, done, inf)))
    computed = state.req_info[r, INFO_COMPUTED]
  scheduled = jnp.where(ok, n, 0)
  reason = jnp.where(attempt & ~ok, REASON_ALLOC, jnp.where(valid & (n == 0), REASON_BUDGET, 0))
  out = dict(
    admission=is_new,
    hit=hit,
    alone=lk["alone"],
    hit_blocks=jnp.sum(lk["hit_mask"], axis=1).astype(jnp.int32),
    spb=lk["spb"],
    scheduled=scheduled,
    reason=reason,
    computed=computed,
    lens_before=lens_before,
    lens_after=state.req_group[r, :, RG_LEN],
    row=state.tables[r],
  )
  if lay.partial:
    out["cows"] = res[-1]  # i32[G, 2]: this entry's copy-on-write (source, copy) per group
  if order is not None:
    return (state, budget - scheduled, queued, order[0], res[2]), out
  return (state, budget - scheduled, queued), out


def free_counts(state: CacheState) -> jax.Array:
  """i32[2]: free blocks in the normal queue and in the pinned tier (one pool reduction)."""
  return jnp.sum(state.queue_key < BIG, axis=1).astype(jnp.int32)


def lay_bs(lay: Layout):
  return tuple(g.block_size for g in lay.groups)


def stats(lay: Layout, state: CacheState):
  """Pool counters (null block excluded): free, used, free cached, cached per group, pinned."""
  free_mask = jnp.any(state.queue_key < BIG, axis=0)
  keyed = state.block_group >= 0
  num_free = jnp.sum(free_mask).astype(jnp.int32)
  per_group = (
    jnp.zeros((lay.num_groups,), jnp.int32)
    .at[state.block_group]
    .add(keyed.astype(jnp.int32), mode="drop")
  )
  return dict(
    num_free=num_free,
    num_used=state.params[P_NUM_BLOCKS] - 1 - num_free,
    num_free_cached=jnp.sum(free_mask & keyed).astype(jnp.int32),
    cached_per_group=per_group,
    num_pinned=jnp.sum(state.queue_key[1] < BIG).astype(jnp.int32),
  )


# ---------------------------------------------------------------------------------------------
# jitted entry points (one jitted function per compile key, `compile_cache.entry_point`;
# state donated)


ENTRY_SCALARS = ("admission", "hit", "spb", "scheduled", "reason", "computed")
ENTRY_VECTORS = ("alone", "hit_blocks", "lens_before", "lens_after")


def pack_stats(lay: Layout, st) -> jax.Array:
  """i32[4 + G]: the pool counters as one array (one host transfer)."""
  head = jnp.stack([st["num_free"], st["num_used"], st["num_free_cached"], st["num_pinned"]])
  return jnp.concatenate([head, st["cached_per_group"]]).astype(jnp.int32)


def unpack_stats(packed) -> dict:
  """Host side of `pack_stats` (NumPy in, dict of ints/arrays out)."""
  p = np.asarray(packed)
  return dict(
    num_free=p[0], num_used=p[1], num_free_cached=p[2], num_pinned=p[3], cached_per_group=p[4:]
  )


def _pack_entry(out) -> jax.Array:
  """i32[K]: one entry's outputs (`_entry`) in one row (see `unpack_step` for the columns)."""
  cols = [out[k].astype(jnp.int32)[None] for k in ENTRY_SCALARS]
  cols += [out[k].astype(jnp.int32) for k in ENTRY_VECTORS]
  cols.append(out["row"].reshape(-1))
  if "cows" in out:
    cols.append(out["cows"].reshape(-1))
  return jnp.concatenate(cols)


def _pack_step(lay: Layout, body, st) -> jax.Array:
  """i32[E + 1, K]: the entries' packed rows (`_pack_entry`), the pool counters last."""
  tail = jnp.zeros((1, body.shape[1]), jnp.int32)
  stats_row = pack_stats(lay, st)
  tail = tail.at[0, : stats_row.shape[0]].set(stats_row)
  return jnp.concatenate([body, tail], axis=0)


def unpack_step(config: CacheConfig, packed) -> tuple[dict, dict]:
  """Host side of the packed `schedule_step` output: (per-entry dict of arrays, stats)."""
  lay = layout(config)
  p = np.asarray(packed)
  body, g = p[:-1], lay.num_groups
  out, c = {}, 0
  for k in ENTRY_SCALARS:
    out[k] = body[:, c]
    c += 1
  for k in ENTRY_VECTORS:
    out[k] = body[:, c : c + g]
    c += g
  out["row"] = body[:, c : c + g * lay.max_blocks].reshape(body.shape[0], g, lay.max_blocks)
  if lay.partial:
    c += g * lay.max_blocks
    out["cows"] = body[:, c : c + 2 * g].reshape(body.shape[0], g, 2)
  return out, unpack_stats(p[-1, : 4 + g])


def release_cows(lay: Layout, state: CacheState, cows: jax.Array) -> CacheState:
  """End of a step with partial hits (vLLM `_free_cow_retained_blocks`): frees the retained
  (source, copy) endpoints of every copy-on-write of the step, group by group, in entry order,
  in ONE `free_blocks` call. `cows` i32[E, G, 2] (0 = none). A block listed twice (one source
  copied for two requests) joins the free queue at its last occurrence, as in vLLM."""
  ids = jnp.transpose(cows, (1, 0, 2)).reshape(-1)
  k = ids.shape[0]
  i = jnp.arange(k)
  later = (ids[None, :] == ids[:, None]) & (i[None, :] > i[:, None]) & (ids[:, None] > 0)
  last = ~jnp.any(later, axis=1)
  nb = lay.num_blocks
  # earlier occurrences only drop their reference
  early = jnp.where((ids > 0) & ~last, ids, nb)
  state = state.replace(ref_cnt=state.ref_cnt.at[early].add(-1, mode="drop"))
  ids = jnp.where(last, ids, 0)
  return block_pool.free_ordered(state, ids, jnp.zeros_like(ids))


@compile_cache.entry_point(static_argnames=("admit_only",), donate_argnums=(0,))
def schedule_step(
  config: CacheConfig, state: CacheState, slots, max_tokens, valid, admit_only: bool = False
):
  """One scheduler step over padded entries (i32[E], i32[E] (-1 = no cap), bool[E]).

  `admit_only` (static): the caller guarantees that no valid entry's request is running
  (status RUNNING: waiting or preempted ones only); the step then leaves out the release of
  skipped blocks, which only a running request needs (same results, cheaper step).

  Returns (state, packed i32[E + 1, K]); decode with `unpack_step`.
  """
  lay = layout(config)
  state = block_pool.maybe_renormalise(state)
  state = state.replace(counters=state.counters.at[C_STEP].add(1))
  state = eviction.prepare(lay, config, state)
  many = admit_only and slots.shape[0] >= ORDER_MIN_ENTRIES  # static

  def body(carry, x):
    # each entry's outputs packed into one row inside the body: the scan stacks ONE array
    # (one in-place update per entry instead of one per output)
    carry, out = _entry(lay, config, carry, x, admit_only=admit_only, one_write=many)
    return carry, _pack_entry(out)

  # the free counts are computed once and carried from entry to entry (updated by touches,
  # pops and releases) instead of one pool reduction per entry
  # every entry's query keys and their buckets at once, before the scan (they depend only on
  # the request's hashes, which no entry of the step changes): shared by lookup and insert
  xs = (slots, max_tokens, valid)
  if lay.caching:
    qk, grp = coordinator.query_keys(lay, state.req_hashes[slots])
    xs += (qk, block_index.bucket_of(qk, grp, lay.buckets))
  carry = (state, state.params[P_MAX_BATCHED], free_counts(state))
  if many:
    # no block joins the normal free queue during an admit-only step (touches and pops only
    # take blocks out): its key order is computed once here and every pop reads its window
    # from a moving head (`block_pool.queue_order`) instead of scattering the pool by key.
    # The order costs about one pop (a pool scatter and a prefix count): from a few entries on
    kmax = lay.num_groups * lay.max_blocks
    carry += (block_pool.queue_order(state, kmax), jnp.int32(0))
  carry, rows = jax.lax.scan(body, carry, xs)
  state = carry[0]
  if lay.partial:
    g = lay.num_groups
    cows = rows[:, rows.shape[1] - 2 * g :].reshape(rows.shape[0], g, 2)
    state = release_cows(lay, state, cows)
  return state, _pack_step(lay, rows, stats(lay, state))


@compile_cache.entry_point()
def lookup_only(config: CacheConfig, state: CacheState, hashes, num_tokens):
  """Read-only lookup for a fresh request (hashes u32[MH, 2]).

  Returns i32[2 + 2G]: hit, shared-prefix boundary, per-group alone hits, hit blocks per group.
  """
  lay = layout(config)
  lk = coordinator.lookup(lay, state, hashes, num_tokens)
  return jnp.concatenate(
    [
      jnp.stack([lk["hit"], lk["spb"]]),
      lk["alone"],
      jnp.sum(lk["hit_mask"], axis=1).astype(jnp.int32),
    ]
  ).astype(jnp.int32)


@compile_cache.entry_point(donate_argnums=(0,))
def write_request(config: CacheConfig, state: CacheState, slot, hashes, num_tokens, num_prompt):
  """Jitted `register_request` plus the pool counters."""
  state = register_request(state, slot, hashes, num_tokens, num_prompt)
  return state, pack_stats(layout(config), stats(layout(config), state))


@compile_cache.entry_point(donate_argnums=(0,))
def write_request_only(
  config: CacheConfig, state: CacheState, slot, hashes, num_tokens, num_prompt
) -> CacheState:
  """Jitted `register_request` alone: it changes no pool counter (only `req_info` and
  `req_hashes`), so the host keeps its counters and needs no device read."""
  del config  # only the compile key: one jitted function per state layout
  return register_request(state, slot, hashes, num_tokens, num_prompt)


def register_request(state: CacheState, slot, hashes, num_tokens, num_prompt) -> CacheState:
  """Registers a waiting request in `slot` (or updates tokens of an existing one); pure."""
  info = state.req_info[slot]
  status = jnp.where(info[INFO_STATUS] == STATUS_EMPTY, STATUS_WAITING, info[INFO_STATUS])
  info = info.at[INFO_STATUS].set(status).at[INFO_TOKENS].set(num_tokens)
  info = info.at[INFO_PROMPT].set(num_prompt)
  return state.replace(
    req_info=state.req_info.at[slot].set(info), req_hashes=state.req_hashes.at[slot].set(hashes)
  )


def admit_one(config: CacheConfig, state: CacheState, slot, max_tokens):
  """One scheduler step with a single entry (no padding): the unit of a trace scan."""
  lay = layout(config)
  state = state.replace(counters=state.counters.at[C_STEP].add(1))
  state = eviction.prepare(lay, config, state)
  (state, _, _), out = _entry(
    lay,
    config,
    (state, state.params[P_MAX_BATCHED], free_counts(state)),
    (slot, max_tokens, jnp.bool_(True)),
  )
  if lay.partial:
    state = release_cows(lay, state, out["cows"][None])
  return state, out


@compile_cache.entry_point(static_argnames=("preempt",), donate_argnums=(0,))
def release_request(config: CacheConfig, state: CacheState, slot, preempt: bool):
  """Jitted `release` plus the pool counters after it."""
  lay = layout(config)
  state = release_lib.release(lay, config, state, slot, preempt)
  return state, pack_stats(lay, stats(lay, state))


@compile_cache.entry_point(donate_argnums=(0,))
def reset_prefix_cache(config: CacheConfig, state: CacheState):
  """Drops every key if no block is held; pinned-tier blocks return to the normal tail."""
  lay = layout(config)
  nb = lay.num_blocks
  ok = block_pool.num_free(state) == state.params[P_NUM_BLOCKS] - 1  # the real pool
  pinned = state.queue_key[1] < BIG
  order = jnp.argsort(jnp.where(pinned, state.queue_key[1], BIG))
  rank = jnp.zeros((nb,), jnp.int32).at[order].set(jnp.arange(nb, dtype=jnp.int32))
  k0 = jnp.where(pinned, state.counters[C_TAIL] + rank, state.queue_key[0])
  new = state.replace(
    queue_key=jnp.stack([k0, jnp.full((nb,), BIG, jnp.int32)]),
    block_group=jnp.full_like(state.block_group, -1),
    block_aux=jnp.stack(
      [jnp.full((nb,), -1, jnp.int32), jnp.zeros((nb,), jnp.int32), jnp.full((nb,), -1, jnp.int32)],
      axis=1,
    ),
    index_entry=jnp.full_like(state.index_entry, -1),
    counters=state.counters.at[C_TAIL].add(jnp.sum(pinned).astype(jnp.int32)),
  )
  state = jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, state)
  return state, ok, pack_stats(lay, stats(lay, state))


@compile_cache.entry_point()
def pool_stats(config: CacheConfig, state: CacheState):
  lay = layout(config)
  return pack_stats(lay, stats(lay, state))
