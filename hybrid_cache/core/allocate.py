"""`allocate_slots` for one entry (vLLM §2.1-§2.4, `KVCacheManager.allocate_slots`).

`remove_skipped` releases blocks a running request no longer needs (out of the sliding window,
superseded recurrent states; pinning SPEC B1); `allocate_slots` touches the hit blocks,
allocates fresh ones per group (each kind's `place_blocks`; align: §2.4.3) and registers keys
(`cache_keys`);
`copy_on_write` / `release_cows` are the partial-hit copies of §2.5 (full-attention blocks larger
than the hash block).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from hybrid_cache.core import access_history
from hybrid_cache.core import block_index
from hybrid_cache.core import block_pool
from hybrid_cache.core import byte_budget
from hybrid_cache.core import eviction
from hybrid_cache.core import groups
from hybrid_cache.core import xla_cpu
from hybrid_cache.core.cache_keys import cache_blocks
from hybrid_cache.core.groups.placement import Placement
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.state import BIG
from hybrid_cache.core.state import BlockAux
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import Counters
from hybrid_cache.core.state import IndexEntry
from hybrid_cache.core.state import QueueCounts
from hybrid_cache.core.state import ReqGroup
from hybrid_cache.core.state import ReqInfo
from hybrid_cache.core.state import cdiv

# ---------------------------------------------------------------------------------------------
# releasing skipped blocks (§2.1, §2.3.3, §2.4.4, pinning SPEC B1)


def remove_skipped(lay: Layout, state: CacheState, r, c) -> CacheState:
  """Frees blocks of request `r` no longer needed once `c` tokens are computed."""
  pos = jnp.arange(lay.max_blocks)
  for g, spec in enumerate(lay.groups):
    kind = groups.rules(spec)
    if not kind.frees_skipped(spec):
      continue
    row = state.tables[r, g]
    length = ReqGroup(state.req_group)[r, g].length
    k = jnp.minimum(kind.skipped_blocks(spec, c), length)
    # blocks [j0 + 1, k) are dropped now; the ones up to j0 were already (null in the row)
    j0 = jnp.max(jnp.where((pos < k) & (row == 0), pos, -1))
    drop = (pos > j0) & (pos < k)
    state = kind.before_skipped_free(lay, state, spec, row, drop, k, j0)
    ids = jnp.where(drop, row, 0)[::-1]
    state = block_pool.free_ordered(state, ids, jnp.zeros_like(ids))
    row = jnp.where(drop, 0, row)
    state, row = kind.after_skipped_free(state, spec, r, g, row, c)
    state = state.replace(tables=state.tables.at[r, g].set(row))
  return state


# ---------------------------------------------------------------------------------------------
# allocation + caching


class Allocation(NamedTuple):
  """What `allocate_slots` returns.

  Attributes:
    state: the cache state after the touches, pops, copy-on-writes and key registration.
    queued: i32[2], free blocks (normal queue, pinned tier: `QueueCounts`) after the
      touches and pops.
    cows: with partial hits, i32[G, 2]: each group's copy-on-write (source, copy), 0 = none;
      else None.
  """

  state: CacheState
  queued: jax.Array
  cows: jax.Array | None


def allocate_slots(
  lay: Layout,
  state: CacheState,
  r,
  is_new,
  hit,
  hit_ids,
  n,
  ok,
  queued,
  keys=None,
):
  """Touches hits, allocates fresh blocks per group and registers keys (allocate_slots 4-6).

  Every write is masked by `ok` (bool): with `ok` False the state is returned unchanged, so
  the caller needs no `lax.cond` (whose branches copy the state leaves on XLA:CPU).
  `queued` (i32[2], `QueueCounts`): blocks in the normal free queue and in the pinned tier
  before the hits are touched. Returns an `Allocation`.

  All groups' fresh blocks come from ONE vectorised pop (groups pop in order from the same
  queue, so the concatenation is the queue's first `sum(counts)` blocks).
  """
  info = state.req_info[r]
  start = ReqInfo(info).computed + hit
  main = start + n
  need_tokens = jnp.minimum(main + lay.lookahead, state.max_model_len)
  s = lay.num_spec_blocks
  pos = jnp.arange(lay.max_blocks)
  touched = jnp.where(ok, hit_ids, 0).reshape(-1)
  # touching unlinks the hits that sit in a queue (small gather, no pool reduction)
  in_queue = (touched > 0)[None, :] & (state.queue_key[:, touched] < BIG)
  if lay.state_pool:  # per pool (pages, state slots): i32[2, 2]
    slot = block_pool.is_slot(state, touched)[None, :]
    left = queued - jnp.stack(
      [jnp.sum(in_queue & ~slot, axis=1), jnp.sum(in_queue & slot, axis=1)]
    ).astype(jnp.int32)
    n_norm, n_pin = QueueCounts(left).free, QueueCounts(left).pinned
  else:
    left = queued - jnp.sum(in_queue, axis=1).astype(jnp.int32)
    n_norm, n_pin = QueueCounts(left).free, QueueCounts(left).pinned
  # touch scatters into queue_key in place only if XLA sees the gather above ordered before
  touched = xla_cpu.ordered_after(touched, jnp.min(n_norm) if lay.state_pool else n_norm)
  state = block_pool.touch(state, touched)
  if lay.chain_features:  # each touched hit block counts one hit on its key (`key_hits`)
    hit_idx = jnp.where(touched > 0, touched, lay.num_blocks)
    state = state.replace(block_aux=BlockAux(state.block_aux)[hit_idx].add(key_hits=1, mode="drop"))
  if lay.eviction_clock:  # a hit re-stamps its key with the eviction clock; no longer ranked
    clock = state.evict_clock
    aux = BlockAux(state.block_aux)[hit_idx].set(evict_stamp=clock, evict_ranked=0, mode="drop")
    state = state.replace(block_aux=aux)
  if lay.access_history:  # a hit: the key's latest access becomes its penultimate, now latest
    idx = jnp.where(touched > 0, touched, lay.num_blocks)
    last = BlockAux(state.block_aux)[touched].key_last
    # a new request inherits the previous access of the blocks serving its hit (per recurrent
    # group, else per full-attention group, the deepest hit block; `access_history`)
    rows_hit = touched.reshape(lay.num_groups, lay.max_blocks)
    last_hit = last.reshape(lay.num_groups, lay.max_blocks)
    inherit = jnp.int32(0)
    for g in lay.recurrent_groups or lay.prefix_groups:
      p = jnp.max(jnp.where(rows_hit[g] > 0, pos, -1))
      inherit = jnp.maximum(inherit, jnp.where(p >= 0, last_hit[g, jnp.maximum(p, 0)], 0))
    aux = BlockAux(state.block_aux)[idx].set(key_penult=last, key_last=state.clock, mode="drop")
    state = state.replace(block_aux=aux)
    old = access_history.inherit(state, r)
    state = access_history.set_inherit(state, r, jnp.where(is_new & ok, inherit, old))
  rows = jnp.where(is_new, hit_ids, state.tables[r])
  rg0 = ReqGroup(state.req_group[r])  # the request's row before the allocation
  # per-group values collected in Python lists and stacked once (one small array op instead
  # of a chain of single-element updates per group)
  row_l, len_l, nc_l, last_l, bases, counts = [], [], [], [], [], []
  # partial hits (§2.5): per group, a copy-on-write block is the group's first popped block;
  # `cow_new` (a new request's hit ending inside the block: the copy replaces the hit block at
  # `hit // bs`), `cow_own` (a recurrent partial entry on the request's own running block: the
  # key moves to the copy, the table keeps the block)
  cow_new_l, cow_own_l, cow_src_l = [], [], []
  for g, spec in enumerate(lay.groups):
    kind = groups.rules(spec)
    bs = spec.block_size
    hits_len = jnp.where(is_new, cdiv(hit, bs) if lay.partial else hit // bs, 0)
    len0 = rg0[g].length
    length = jnp.where(is_new, hits_len, len0)
    # a partial hit caches its last (copied) block again once it is full: hit // bs
    nc_l.append(jnp.where(is_new, hit // bs if lay.partial else hits_len, rg0[g].ncached))
    has_cow = None
    if lay.partial:
      cow_new = is_new & (hit > 0) & (hit % bs != 0)
      cow_own = kind.own_cow(spec, state, r, g, is_new)
      own_pos = jnp.maximum(state.req_partial[r, g] - 1, 0)
      src = jnp.where(cow_new, rows[g, jnp.minimum(hit // bs, lay.max_blocks - 1)], 0)
      src = jnp.where(cow_own, rows[g, own_pos], src)
      cow_new_l.append(cow_new)
      cow_own_l.append(cow_own)
      cow_src_l.append(src)
      has_cow = cow_new | cow_own
    last = rg0[g].last
    row = rows[g]
    placement = Placement(
      row=row,
      pos=pos,
      length=length,
      len0=len0,
      hits_len=hits_len,
      last=last,
      main=main,
      need_tokens=need_tokens,
      has_cow=has_cow,
      num_spec_blocks=s,
      partial=lay.partial,
    )
    row, base, count, last, length = kind.place_blocks(spec, placement)
    bases.append(base)
    counts.append(count)
    if lay.partial:
      counts[-1] = counts[-1] + has_cow.astype(jnp.int32)
    row_l.append(row)
    len_l.append(length)
    last_l.append(last)
  rows = jnp.stack(row_l)
  # chain features: a new request's latest kept state is its hit (0 = none); `cache_keys`
  # moves it on
  chain = {"chain": jnp.where(is_new, hit, rg0.chain)} if lay.chain_features else {}
  rg = ReqGroup.stack(
    length=jnp.stack(len_l), ncached=jnp.stack(nc_l), last=jnp.stack(last_l), **chain
  )
  if lay.state_pool:
    state, ids, offsets, queued = _pop_two_pools(lay, state, ok, counts, n_norm, n_pin)
    kmax = ids.shape[0]
  else:
    # exclusive prefix of the counts by scalar adds (a cumsum is a reduce-window thunk)
    offsets = [jnp.int32(0)]
    for g in range(1, lay.num_groups):
      offsets.append(offsets[-1] + counts[g - 1])
    kmax = lay.num_groups * lay.max_blocks
    total = jnp.where(ok, sum(counts[1:], counts[0]), 0)
    state = eviction.order_for_pop(lay, state, total)
    state, ids = block_pool.pop_many(
      state, total, kmax, lay.recurrent_groups, n_norm=n_norm, scan_all=lay.extra_keys
    )
    k1 = jnp.minimum(total, n_norm)  # popped from the normal queue, the rest from the pinned tier
    queued = QueueCounts.stack(free=n_norm - k1, pinned=n_pin - (total - k1))
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
    state = copy_on_write(lay, state, r, cow_new, cow_own, srcs, cow_ids)
    cows = jnp.stack([srcs, cow_ids], axis=1)  # i32[G, 2] (src, copy), 0 = none
  state = state.replace(
    tables=state.tables.at[r].set(jnp.where(ok, rows, state.tables[r])),
    req_group=state.req_group.at[r].set(jnp.where(ok, rg, state.req_group[r])),
  )
  if lay.byte_budget:  # the pops may leave the cached blocks over the shared byte budget
    state = byte_budget.enforce(lay, state)
  state = cache_blocks(lay, state, r, start + n, ok, keys, info, is_new=is_new, hit=hit)
  return Allocation(state, queued, cows)


def _pop_two_pools(lay: Layout, state: CacheState, ok, counts, n_norm, n_pin):
  """The fresh blocks of every group with two pools (`Layout.state_pool`): each pool's groups
  pop in group order from that pool's queue (as one pool's groups do from the shared one).

  `counts`: per group, i32 blocks to pop; `n_norm`, `n_pin`: i32[2] per pool. Returns (state,
  ids, offsets, queued): `ids` the page pops then the slot pops (each pool's part `P_g *
  max_blocks` wide, P_g its groups), `offsets[g]` group g's first pop in `ids`, `queued`
  i32[2, 2] after the pops (`QueueCounts` per pool).
  """
  ids_l, offsets, queued_l, base = [], [None] * lay.num_groups, [], 0
  for p in range(2):
    members = [g for g in range(lay.num_groups) if lay.group_pool[g] == p]
    off = jnp.int32(base)
    for g in members:
      offsets[g] = off
      off = off + counts[g]
    kmax = max(1, len(members)) * lay.max_blocks
    total = jnp.where(ok, sum((counts[g] for g in members), jnp.int32(0)), 0)
    rec = tuple(g for g in lay.recurrent_groups if g in members)
    state = eviction.order_for_pop(lay, state, total, pool=p)
    state, ids = block_pool.pop_many(
      state, total, kmax, rec, n_norm=n_norm[p], scan_all=lay.extra_keys, pool=p
    )
    k1 = jnp.minimum(total, n_norm[p])  # normal queue first, then the pinned tier
    queued_l.append(QueueCounts.stack(free=n_norm[p] - k1, pinned=n_pin[p] - (total - k1)))
    ids_l.append(ids)
    base += kmax
  return state, jnp.concatenate(ids_l), offsets, jnp.stack(queued_l)


def copy_on_write(lay: Layout, state: CacheState, r, cow_new, cow_own, srcs, cow_ids) -> CacheState:
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
  hit = (IndexEntry(state.index_entry)[b].block == src[:, None]) & keyed[:, None]
  way = jnp.min(jnp.where(hit, jnp.arange(hit.shape[1]), hit.shape[1]), axis=1)
  c = state.counters
  seq = state.next_seq + jnp.cumsum(keyed.astype(jnp.int32)) - 1
  bi = jnp.where(keyed & (way < hit.shape[1]), b, buckets)
  ent = state.index_entry.at[bi, way].set(IndexEntry.stack(block=cow_ids, seq=seq), mode="drop")
  dst = jnp.where(keyed, cow_ids, nb)
  sdx = jnp.where(keyed, src, nb)
  aux_src = BlockAux(state.block_aux[src])
  step = state.clock
  # the key's token end goes with it (and its hits and chain start: chain features)
  chain = (
    {"key_hits": aux_src.key_hits, "chain_start": aux_src.chain_start} if lay.chain_features else {}
  )
  if lay.eviction_clock:  # and its eviction stamp (the copy is held: not ranked)
    chain.update(evict_stamp=aux_src.evict_stamp, evict_ranked=jnp.zeros_like(src))
  if lay.access_history:  # and its access history (the chain and clock columns idle if unread)
    idle = BlockAux.NO_KEY
    chain.update(
      {
        f: jnp.full_like(src, idle[BlockAux.FIELDS[f]])
        for f in list(BlockAux.FIELDS)[3:7]
        if f not in chain
      },
      key_last=aux_src.key_last,
      key_penult=aux_src.key_penult,
      kv_owner=jnp.full_like(src, -1),
    )
  aux_new = BlockAux.stack(
    key_step=jnp.full_like(src, step), pinned=jnp.zeros_like(src), key_end=aux_src.key_end, **chain
  )
  group = state.block_group.at[dst].set(grp, mode="drop").at[sdx].set(-1, mode="drop")
  block_hash = state.block_hash.at[dst].set(h, mode="drop")
  # the source loses its key (its pinned flag stays)
  aux = state.block_aux.at[dst].set(aux_new, mode="drop")
  aux = block_index.clear_key_columns(
    aux, sdx, lay.chain_features, lay.eviction_clock, lay.access_history
  )
  state = state.replace(
    index_entry=ent,
    block_group=group,
    block_hash=block_hash,
    block_aux=aux,
    counters=Counters(c).add(next_seq=jnp.sum(keyed).astype(jnp.int32)),
    req_partial=state.req_partial.at[r].set(jnp.where(cow_own, 0, state.req_partial[r])),
  )
  return state


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
