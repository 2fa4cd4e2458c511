"""Set-associative block index: (hash lanes, group) -> block, duplicates kept, oldest wins.

`index_entry[b, w] = (block, seq)` (block -1 = empty way) and `index_hash[b, w]` = the key's two
uint32 lanes; the bucket is a mix of both lanes and the group. A hit needs equal lanes and equal
group (the block's `block_group`); among duplicates the smallest insertion sequence wins (vLLM
returns the first-inserted block). A full bucket drops the insertion and counts it in
`counters[C_OVERFLOW]` (a miss later, never a wrong hit); pools are sized so this is rare.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.state import BIG
from hybrid_cache.state import C_OVERFLOW
from hybrid_cache.state import C_SEQ
from hybrid_cache.state import CacheState


def bucket_of(h: jax.Array, group: jax.Array, buckets: int) -> jax.Array:
  """Bucket of keys `h` (u32[..., 2]) in `group` (i32[...])."""
  x = (
    h[..., 0]
    ^ (h[..., 1] * jnp.uint32(0x9E3779B1))
    ^ ((group.astype(jnp.uint32) + jnp.uint32(1)) * jnp.uint32(0x85EBCA77))
  )
  x = x ^ (x >> jnp.uint32(15))
  return (x & jnp.uint32(buckets - 1)).astype(jnp.int32)


def probe(state: CacheState, h: jax.Array, group: jax.Array) -> jax.Array:
  """Block carrying key (h, group) for every query (u32[..., 2], i32[...]) or -1."""
  buckets = state.index_entry.shape[0]
  b = bucket_of(h, group, buckets)
  ent = state.index_entry[b]  # [..., W, 2]
  hh = state.index_hash[b]  # [..., W, 2]
  blk = ent[..., 0]
  same = jnp.all(hh == h[..., None, :], axis=-1) & (blk >= 0)
  same &= state.block_group[jnp.maximum(blk, 0)] == group[..., None]
  seq = jnp.where(same, ent[..., 1], BIG)
  # single-output reductions (XLA:CPU runs a variadic argmin reduce element by element);
  # sequence numbers are unique, so the oldest matching way is the one at the minimum
  oldest = same & (seq == jnp.min(seq, axis=-1, keepdims=True))
  return jnp.max(jnp.where(oldest, blk, -1), axis=-1)


def insert(state: CacheState, ids: jax.Array, keys: jax.Array, group: jax.Array) -> CacheState:
  """Registers block `ids[i]` (> 0 = insert, in list order) under (keys[i], group[i]).

  Sets the block's `block_group`/`block_hash` and adds index entries without a per-key loop:
  keys landing in one bucket are ranked in list order (one [k, k] compare, no sort) and take
  that bucket's empty ways in order; insertion sequence numbers follow list order.
  """
  nb = state.ref_cnt.shape[0]
  buckets, ways = state.index_entry.shape[:2]
  k = ids.shape[0]
  valid = ids > 0
  idx = jnp.where(valid, ids, nb)
  state = state.replace(
    block_group=state.block_group.at[idx].set(group, mode="drop"),
    block_hash=state.block_hash.at[idx].set(keys, mode="drop"),
  )
  c = state.counters
  bks = jnp.where(valid, bucket_of(keys, group, buckets), buckets)
  # rank among earlier keys of the same bucket: one [k, k] compare, no sort (the barrier keeps
  # XLA from recomputing the bucket hash for every pair)
  bks = jax.lax.optimization_barrier(bks)
  i = jnp.arange(k)
  earlier = (bks[None, :] == bks[:, None]) & (i[None, :] < i[:, None])
  rank = jnp.sum(earlier, axis=1).astype(jnp.int32)
  empty = state.index_entry[jnp.minimum(bks, buckets - 1), :, 0] < 0  # [k, W]
  # inclusive count of empty ways (an exact small matmul: XLA:CPU's cumsum is a reduce-window)
  tri = (jnp.arange(ways)[:, None] <= jnp.arange(ways)[None, :]).astype(jnp.float32)
  nth = jnp.matmul(empty.astype(jnp.float32), tri, precision=jax.lax.Precision.HIGHEST)
  nth = nth.astype(jnp.int32) - 1
  hit_way = empty & (nth == rank[:, None])
  ok = valid & jnp.any(hit_way, axis=1)
  way = jnp.min(jnp.where(hit_way, jnp.arange(ways), ways), axis=1)  # no variadic argmax
  seq = c[C_SEQ] + jnp.cumsum(valid) - 1
  bi = jnp.where(ok, bks, buckets)
  ent = state.index_entry.at[bi, way].set(jnp.stack([ids, seq], axis=-1), mode="drop")
  hsh = state.index_hash.at[bi, way].set(keys, mode="drop")
  nvalid = jnp.sum(valid).astype(jnp.int32)
  novf = jnp.sum(valid & ~ok).astype(jnp.int32)
  counters = c.at[C_SEQ].add(nvalid).at[C_OVERFLOW].add(novf)
  return state.replace(index_entry=ent, index_hash=hsh, counters=counters)


def evict(state: CacheState, mask: jax.Array) -> CacheState:
  """Removes every key of the blocks where `mask` (bool[NB]) is set."""
  blk = state.index_entry[..., 0]
  hit = (blk >= 0) & mask[jnp.maximum(blk, 0)]
  ent = jnp.where(hit[..., None], -1, state.index_entry)
  return state.replace(
    index_entry=ent,
    block_group=jnp.where(mask, -1, state.block_group),
    block_aux=state.block_aux.at[:, 0]
    .set(jnp.where(mask, -1, state.block_aux[:, 0]))
    .at[:, 2]
    .set(jnp.where(mask, -1, state.block_aux[:, 2])),
  )


def evict_ids(state: CacheState, ids: jax.Array) -> CacheState:
  """`evict` for the blocks `ids` (i32[k], unique, 0 = skip) without scanning the whole index.

  A block carries at most one key and its entry (if it was not dropped by a full bucket) lies
  in the bucket of its `block_hash`/`block_group`, so only those k buckets are searched.
  """
  nb = state.ref_cnt.shape[0]
  buckets = state.index_entry.shape[0]
  valid = ids > 0
  safe = jnp.where(valid, ids, 0)
  grp = state.block_group[safe]
  keyed = valid & (grp >= 0)
  b = bucket_of(state.block_hash[safe], grp, buckets)
  hit = (state.index_entry[b, :, 0] == ids[:, None]) & keyed[:, None]  # [k, W]
  # first hit way by a plain min (XLA:CPU runs a variadic argmax reduce element by element)
  ways = hit.shape[1]
  way = jnp.min(jnp.where(hit, jnp.arange(ways), ways), axis=1)
  bi = jnp.where(way < ways, b, buckets)
  ent = state.index_entry.at[bi, way].set(-1, mode="drop")
  idx = jnp.where(valid, ids, nb)
  return state.replace(
    index_entry=ent,
    block_group=state.block_group.at[idx].set(-1, mode="drop"),
    block_aux=state.block_aux.at[idx, 0].set(-1, mode="drop").at[idx, 2].set(-1, mode="drop"),
  )
