"""Set-associative block index: (hash lanes, group) -> block, duplicates kept, oldest wins.

`index_entry[b, w] = (block, seq)` (`IndexEntry` fields: `CacheState.index_block`, -1 = empty
way, and `index_seq`) and `index_hash[b, w]` = the key's two uint32 lanes; the
bucket is a mix of both lanes and the group. A hit needs equal lanes and equal group (the
block's `block_group`); among duplicates the smallest insertion sequence wins (vLLM returns
the first-inserted block). A full bucket drops the insertion and counts it in
`CacheState.index_overflows` (a miss later, never a wrong hit); pools are sized so this is rare.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_cache.core import access_history
from hybrid_cache.core.state import BIG
from hybrid_cache.core.state import BlockAux
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import Counters
from hybrid_cache.core.state import HashLanes
from hybrid_cache.core.state import IndexEntry
from hybrid_cache.core.xla_cpu import materialise
from hybrid_cache.core.xla_cpu import prefix_count
from hybrid_cache.core.xla_cpu import row_count

# the `block_aux` columns that describe a key in a chain-feature state (all but the pinned flag),
# and with the eviction clock's columns
_KEY_COLS = np.asarray(
  BlockAux.positions("key_step", "key_end", "key_hits", "chain_start"), np.int32
)
_KEY_COLS_CLOCK = np.asarray(
  BlockAux.positions(
    "key_step", "key_end", "key_hits", "chain_start", "evict_stamp", "evict_ranked"
  ),
  np.int32,
)
# with the access history: every column but the pinned flag (the chain and clock ones are idle
# at their no-key values unless the policy declares them too, eviction `tuned`)
_KEY_COLS_HISTORY = np.asarray([i for f, i in BlockAux.FIELDS.items() if f != "pinned"], np.int32)
_PAIRWISE_MAX = 128  # `insert`: up to this many keys, ranks from one [k, k] compare


def bucket_of(h: jax.Array, group: jax.Array, buckets: int) -> jax.Array:
  """Bucket of keys `h` (u32[..., 2]) in `group` (i32[...])."""
  lanes = HashLanes(h)
  x = (
    lanes.lo
    ^ (lanes.hi * jnp.uint32(0x9E3779B1))
    ^ ((group.astype(jnp.uint32) + jnp.uint32(1)) * jnp.uint32(0x85EBCA77))
  )
  x = x ^ (x >> jnp.uint32(15))
  return (x & jnp.uint32(buckets - 1)).astype(jnp.int32)


def _entry_groups(state: CacheState) -> jax.Array:
  """i32[BK, W]: group of each index entry's block (-2 = empty way), in its own buffer."""
  blk = state.index_block
  grp = jnp.where(blk >= 0, state.block_group[jnp.maximum(blk, 0)], -2)
  return materialise(grp.reshape(-1)).reshape(blk.shape)


def probe(state: CacheState, h: jax.Array, group: jax.Array, b: jax.Array | None = None):
  """Block carrying key (h, group) for every query (u32[..., 2], i32[...]) or -1.

  `b` (optional, i32[...]): the queries' buckets (`bucket_of(h, group, buckets)`), computed
  by the caller once for several uses.
  """
  buckets = state.index_entry.shape[0]
  if b is None:
    b = bucket_of(h, group, buckets)
    b = materialise(b.reshape(-1)).reshape(b.shape)  # one hash per query, not one per way
  ent = IndexEntry(state.index_entry[b])  # [..., W, 2]
  hh = state.index_hash[b]  # [..., W, 2]
  blk = ent.block
  if b.size < buckets:
    # fewer queries than buckets (static): the groups of the gathered ways only (Q * W
    # gathers instead of BK * W for every index slot), fused into the one `same` mask below
    grp = jnp.where(blk >= 0, state.block_group[jnp.maximum(blk, 0)], -2)
  else:
    grp = _entry_groups(state)[b]
  same = jnp.all(hh == h[..., None, :], axis=-1) & (grp == group[..., None])
  seq = jnp.where(same, ent.seq, BIG)
  # single-output reductions (XLA:CPU runs a variadic argmin reduce element by element);
  # sequence numbers are unique, so the oldest matching way is the one at the minimum
  oldest = same & (seq == jnp.min(seq, axis=-1, keepdims=True))
  return jnp.max(jnp.where(oldest, blk, -1), axis=-1)


def contains(state: CacheState, h: jax.Array, group: int) -> jax.Array:
  """bool[N]: some block carries key (h[i], group) (`probe(...) >= 0` for one static group,
  without picking the oldest duplicate). h: u32[N, 2]."""
  buckets = state.index_entry.shape[0]
  mine = _entry_groups(state) == group  # [BK, W], once per index slot
  b = materialise(bucket_of(h, jnp.full(h.shape[:-1], group, jnp.int32), buckets))
  same = jnp.all(state.index_hash[b] == h[:, None, :], axis=-1) & mine[b]
  return jnp.any(same, axis=-1)


def _rank_in_bucket(bks: jax.Array, buckets: int) -> jax.Array:
  """i32[k]: for each i, the number of j < i with bks[j] == bks[i] (bks in [0, buckets]).

  One sort of a packed u32 (bucket above the log2(k) position bits: unique keys, so the order
  is stable), each key's rank = its sorted position minus its bucket's first sorted position
  (a binary search on the sorted buckets), scattered back to list order.
  Replaces: a blocked [32, 32] compare plus a per-chunk bucket histogram and its exclusive
  prefix by a [k/32, k/32] x [k/32, buckets] matmul. In the scan's while loop that matmul
  took ~3 ms a step (`ynn_fusion`, k = 256, 16,384 buckets; 20% of a Mooncake step at U = 64);
  standalone (jit, 2-core CPU) k = 256: 117 -> 12 us, k = 2,048: 1,366 -> 122 us.
  """
  k = bks.shape[0]
  bits = max(1, (k - 1).bit_length())
  if (buckets + 1) << bits > 1 << 32:
    raise ValueError(f"_rank_in_bucket: {buckets} buckets x {k} keys exceed a u32 packing")
  packed = (bks.astype(jnp.uint32) << jnp.uint32(bits)) | jnp.arange(k, dtype=jnp.uint32)
  s = jnp.sort(packed)
  sorted_bks = (s >> jnp.uint32(bits)).astype(jnp.int32)
  first = jnp.searchsorted(sorted_bks, sorted_bks, side="left", method="scan_unrolled")
  where = (s & jnp.uint32((1 << bits) - 1)).astype(jnp.int32)
  rank = jnp.arange(k, dtype=jnp.int32) - first.astype(jnp.int32)
  return jnp.zeros((k,), jnp.int32).at[where].set(rank, unique_indices=True)


def _nth_empty_way(empty: jax.Array, bks: jax.Array, rank: jax.Array):
  """(way, ok) i32[k], bool[k]: the `rank[i]`-th (0-based) empty way of bucket `bks[i]`.

  `empty` bool[BK, W] (W <= 32); `bks` may be BK (no bucket: ok False). Each bucket's empty
  ways become one uint32 bit mask; the rank-th set bit is found by a binary search on
  population counts (log2 W elementwise rounds, no [k, W] gather or prefix count).
  """
  buckets, ways = empty.shape
  if ways > 32:
    raise ValueError(f"index ways must be <= 32, got {ways}")
  u = jnp.uint32
  shift = u(1) << jnp.arange(ways, dtype=u)
  if bks.shape[0] < buckets:
    # fewer keys than buckets (static): the masks of the gathered buckets only (k * W reads
    # instead of BK * W)
    e = empty[jnp.minimum(bks, buckets - 1)]
    m = jnp.sum(jnp.where(e, shift, u(0)), axis=1, dtype=u)
  else:
    bits = jnp.sum(jnp.where(empty, shift, u(0)), axis=1, dtype=u)
    bits = materialise(bits)  # else the per-bucket reduction is redone per gathered key
    m = bits[jnp.minimum(bks, buckets - 1)]
  m = jnp.where(bks < buckets, m, u(0))
  ok = rank < jax.lax.population_count(m).astype(jnp.int32)
  r = rank
  way = jnp.zeros_like(rank)
  width = 1 << max(0, (ways - 1).bit_length() - 1)
  while width >= 1:
    low = m & u((1 << width) - 1)
    cnt = jax.lax.population_count(low).astype(jnp.int32)
    up = r >= cnt
    r = jnp.where(up, r - cnt, r)
    m = jnp.where(up, m >> u(width), low)
    way = way + jnp.where(up, width, 0)
    width //= 2
  return way, ok


def insert(
  state: CacheState,
  ids: jax.Array,
  keys: jax.Array,
  group: jax.Array,
  buckets_of_keys: jax.Array | None = None,
) -> CacheState:
  """Registers block `ids[i]` (> 0 = insert, in list order) under (keys[i], group[i]).

  Sets the block's `block_group`/`block_hash` and adds index entries without a per-key loop:
  keys landing in one bucket are ranked in list order (`_rank_in_bucket`, no sort) and take
  that bucket's empty ways in order; insertion sequence numbers follow list order.
  `buckets_of_keys` (optional i32[k]): `bucket_of(keys, group, buckets)` from the caller.
  """
  nb = state.ref_cnt.shape[0]
  buckets, ways = state.index_entry.shape[:2]
  valid = ids > 0
  idx = jnp.where(valid, ids, nb)
  state = state.replace(
    block_group=state.block_group.at[idx].set(group, mode="drop"),
    block_hash=state.block_hash.at[idx].set(keys, mode="drop"),
  )
  c = state.counters
  if buckets_of_keys is None:
    bks = jnp.where(valid, bucket_of(keys, group, buckets), buckets)
    bks = materialise(bks)  # else XLA recomputes the bucket hash inside every pairwise compare
  else:
    bks = jnp.where(valid, buckets_of_keys, buckets)
  k = ids.shape[0]
  if k <= _PAIRWISE_MAX:
    # few keys (static): rank in bucket and insertion order from one [k, k] "earlier" mask
    # (two row counts, one fusion) instead of the blocked rank and a prefix-count matmul
    i = np.arange(k)
    earlier = jnp.asarray(i[None, :] < i[:, None])
    both = jnp.stack([(bks[None, :] == bks[:, None]) & earlier, valid[None, :] & earlier])
    rank, before = row_count(both.reshape(2 * k, k)).reshape(2, k)
    # before = prefix_count(valid) - 1 where valid
  else:
    rank = _rank_in_bucket(bks, buckets)
    before = prefix_count(valid) - 1
  way, ok = _nth_empty_way(state.index_block < 0, bks, rank)
  ok &= valid
  seq = Counters(c).next_seq + before
  bi = jnp.where(ok, bks, buckets)
  ent = state.index_entry.at[bi, way].set(IndexEntry.stack(block=ids, seq=seq), mode="drop")
  hsh = state.index_hash.at[bi, way].set(keys, mode="drop")
  nvalid = jnp.sum(valid).astype(jnp.int32)
  novf = jnp.sum(valid & ~ok).astype(jnp.int32)
  counters = Counters(c).add(next_seq=nvalid, index_overflows=novf)
  return state.replace(index_entry=ent, index_hash=hsh, counters=counters)


def has_entry(state: CacheState, h: jax.Array, group: jax.Array, ids: jax.Array) -> jax.Array:
  """bool[k]: the index holds key (h[i], group[i]) for block ids[i] (u32[k, 2], i32[k], i32[k])."""
  b = bucket_of(h, group, state.index_entry.shape[0])
  ent = IndexEntry(state.index_entry[b])  # [k, W, 2]
  same = jnp.all(state.index_hash[b] == h[:, None, :], axis=-1) & (ent.block == ids[:, None])
  return jnp.any(same, axis=-1) & (ids > 0)


def insert_extra(state: CacheState, ids: jax.Array, keys: jax.Array, group: jax.Array):
  """Index entries for extra keys of already keyed blocks `ids` (> 0 = insert; vLLM
  `cached_block_hashes_by_block`): the blocks' own key, group and aux are left as they are."""
  bg, bh = state.block_group, state.block_hash
  state = insert(state, ids, keys, group)
  return state.replace(block_group=bg, block_hash=bh)


def advance_clock(state: CacheState, ranked: jax.Array) -> CacheState:
  """An eviction policy's clock (`CacheState.evict_clock`, GreedyDual's L) raised to the largest
  of `ranked` (i32[...], the evicted blocks' `evict_ranked`; 0 = not ranked, no effect). The
  state unchanged without the clock's columns (static `has_clock`)."""
  if not state.has_clock:
    return state
  top = jnp.max(ranked, initial=0)
  clock = jnp.maximum(state.evict_clock, top)
  return state.replace(counters=Counters(state.counters).set(evict_clock=clock))


def evict(state: CacheState, mask: jax.Array) -> CacheState:
  """Removes every key of the blocks where `mask` (bool[NB]) is set (and raises an eviction
  clock to their ranked priorities, `advance_clock`); with the access history their ghosts are
  kept first (`access_history.record`)."""
  state = advance_clock(state, jnp.where(mask, state.evict_ranked, 0) if state.has_clock else 0)
  if state.has_history:
    ids = jnp.arange(mask.shape[0], dtype=jnp.int32)
    state = access_history.record(state, jnp.where(mask, ids, 0))
  blk = state.index_block
  hit = (blk >= 0) & mask[jnp.maximum(blk, 0)]
  ent = jnp.where(hit[..., None], -1, state.index_entry)
  group = jnp.where(mask, -1, state.block_group)
  if state.has_chain:  # every column but the pinned flag takes its no-key value
    width = state.block_aux.shape[-1]
    keep = jnp.arange(width) == BlockAux.FIELDS["pinned"]
    no_key = jnp.asarray(BlockAux.NO_KEY[:width])
    aux = jnp.where(mask[:, None] & ~keep, no_key, state.block_aux)
  else:
    aux = BlockAux(state.block_aux).set(key_step=jnp.where(mask, -1, state.key_step))
    aux = BlockAux(aux).set(key_end=jnp.where(mask, -1, state.key_end))
  return state.replace(index_entry=ent, block_group=group, block_aux=aux)


def evict_ids(
  state: CacheState,
  ids: jax.Array,
  grp: jax.Array | None = None,
  clear_pinned: bool = False,
  scan_all: bool = False,
) -> CacheState:
  """`evict` for the blocks `ids` (i32[k], unique, 0 = skip).

  A block carries at most one key and its entry (if it was not dropped by a full bucket) lies
  in the bucket of its `block_hash`/`block_group`. With fewer buckets than ids (static) the
  whole index is scanned against a bool[NB] mask of the ids (BK * W gathers), else only the k
  buckets of the keyed ids are searched (k * W); both clear exactly those entries.
  `grp` (optional i32[k]): the caller's `block_group[ids]` (read once, not twice).
  `clear_pinned` (static): also clear the blocks' pinned flag (`CacheState.pinned`), in the same
  row write. `scan_all` (static): always scan the whole index (partial hits, vLLM §2.5: a block
  may also carry an extra partial key, indexed under another bucket). With the access
  history the keyed blocks' ghosts are kept first (`access_history.record`).
  """
  nb = state.ref_cnt.shape[0]
  if state.has_history:
    state = access_history.record(state, ids, grp)
  buckets, ways = state.index_entry.shape[:2]
  valid = ids > 0
  if state.has_clock:  # an unkeyed block's ranked priority is 0
    state = advance_clock(state, jnp.where(valid, state.evict_ranked[jnp.where(valid, ids, 0)], 0))
  idx = jnp.where(valid, ids, nb)
  if scan_all or buckets <= ids.shape[0]:
    mask = jnp.zeros((nb,), bool).at[idx].set(True, mode="drop")
    blk = state.index_block
    hit = (blk >= 0) & mask[jnp.maximum(blk, 0)]
    ent = jnp.where(hit[..., None], -1, state.index_entry)
  else:
    safe = jnp.where(valid, ids, 0)
    if grp is None:
      grp = state.block_group[safe]
    keyed = valid & (grp >= 0)
    b = bucket_of(state.block_hash[safe], grp, buckets)
    # the scatters below update block_group in place (and insert's later block_hash scatter
    # too) only if XLA sees the gathers above ordered before them: the indices depend on the
    # gathered values (block_group >= -1 and buckets >= 0 always, so this is the identity);
    # without it XLA copies block_group and block_hash twice per scheduled entry
    idx = jnp.where(valid & (grp >= -1) & (b >= 0), ids, nb)
    hit = (IndexEntry(state.index_entry)[b].block == ids[:, None]) & keyed[:, None]  # [k, W]
    # first hit way by a plain min (XLA:CPU runs a variadic argmax reduce element by element)
    way = jnp.min(jnp.where(hit, jnp.arange(ways), ways), axis=1)
    bi = jnp.where(way < ways, b, buckets)
    ent = state.index_entry.at[bi, way].set(-1, mode="drop")
  group = state.block_group.at[idx].set(-1, mode="drop")
  if clear_pinned:
    no_key = BlockAux.no_key(state.has_chain, state.has_clock, state.has_history)
    aux = state.block_aux.at[idx].set(jnp.asarray(no_key), mode="drop")
  else:
    aux = clear_key_columns(
      state.block_aux, idx, state.has_chain, state.has_clock, state.has_history
    )
  return state.replace(index_entry=ent, block_group=group, block_aux=aux)


def clear_key_columns(
  block_aux: jax.Array, idx: jax.Array, chain: bool, clock: bool = False, history: bool = False
) -> jax.Array:
  """`block_aux` with the key columns of blocks `idx` (out-of-range ids dropped) set to their
  no-key values, the pinned flag kept: registration step and token end, and with the chain
  features (`chain`, static) hits and chain start, in one [k, 4] scatter (with the eviction
  clock, `clock`, also stamp and ranked priority: [k, 6]; with the access history, `history`,
  every column: [k, 9])."""
  if history:
    cols = _KEY_COLS_HISTORY
    return block_aux.at[idx[:, None], cols[None, :]].set(
      jnp.asarray(BlockAux.NO_KEY[cols]), mode="drop"
    )
  if chain:
    cols = _KEY_COLS_CLOCK if clock else _KEY_COLS
    return block_aux.at[idx[:, None], cols[None, :]].set(
      jnp.asarray(BlockAux.NO_KEY[cols]), mode="drop"
    )
  return BlockAux(block_aux)[idx].set(key_step=-1, key_end=-1, mode="drop")
