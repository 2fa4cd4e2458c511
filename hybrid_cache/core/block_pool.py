"""The shared block pool: ref counts, vLLM's free queue as int32 keys, the pinned tier.

Free queue (vLLM §1.6): a block is free iff `free_key[b] < BIG` (normal queue, row `free` of
`queue_key`) or `pinned_key[b] < BIG` (pinned tier, row `pinned`, SPEC B1). Popping takes the
smallest normal key; when the normal queue is empty the oldest pinned block is demoted
(equivalently popped). Freeing puts unhashed blocks at the head (a batch keeps its order;
`free_order="all_tail"`: at the tail too), hashed blocks at the tail, pinned blocks at the pinned
tail. Touching unlinks a free block.
Two pools (`Layout.state_pool`, `CacheConfig.state_slots`): the state slots are the ids
`>= CacheState.first_slot`. They share the key order, so each pool's free queue (and pinned
tier) is that order restricted to its ids: freeing and touching need no pool; popping, the free
counts and the admission checks are per pool (`free_counts`, `pop_many(..., pool=...)`).
All functions are pure and jittable.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.core import block_index
from hybrid_cache.core import eviction
from hybrid_cache.core import xla_cpu
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.state import BIG
from hybrid_cache.core.state import BlockAux
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import Counters
from hybrid_cache.core.state import QueueKeys
from hybrid_cache.core.state import QueueOrder


def num_free(state: CacheState) -> jax.Array:
  """Free capacity: normal queue + pinned tier (int32 scalar)."""
  return jnp.sum(state.queue_key < BIG).astype(jnp.int32)


def _drop_idx(ids: jax.Array, nb: int) -> jax.Array:
  """Null (0) ids become out-of-bounds so masked scatters drop them."""
  return jnp.where(ids > 0, ids, nb)


def touch(state: CacheState, ids: jax.Array) -> CacheState:
  """ref += 1 for the non-null `ids` (unique), unlinking free ones from their queue."""
  nb = state.ref_cnt.shape[0]
  idx = _drop_idx(ids, nb)
  ref = state.ref_cnt.at[idx].add(1, mode="drop")
  qk = state.queue_key.at[:, idx].set(BIG, mode="drop")
  return state.replace(ref_cnt=ref, queue_key=qk)


def free_ordered(state: CacheState, ids: jax.Array, batch: jax.Array) -> CacheState:
  """Frees `ids` (unique, 0 = skip) in list order (vLLM `free_blocks`, one call per batch).

  `batch` (same shape, non-decreasing) numbers the `free_blocks` calls: blocks reaching ref 0
  without a key go to the head, a later batch in front of an earlier one, each batch keeping its
  order; keyed blocks go to the tail in list order; pinned ones to the pinned tier's tail.
  With `free_order="all_tail"` (`CacheState.free_all_tail`, vLLM before #43447) blocks without a key
  go to the tail too, in list order among the keyed ones.
  """
  nb = state.ref_cnt.shape[0]
  valid = ids > 0
  idx = _drop_idx(ids, nb)
  ref = state.ref_cnt.at[idx].add(-1, mode="drop")
  new_ref = jnp.where(valid, ref[jnp.where(valid, ids, 0)], 1)
  freed = valid & (new_ref == 0)
  safe = jnp.where(valid, ids, 0)
  pinned = freed & (BlockAux(state.block_aux)[safe].pinned > 0)
  hashed = freed & ~pinned & ((state.block_group[safe] >= 0) | (state.free_all_tail != 0))
  head = freed & ~pinned & ~hashed
  c = state.counters
  # tail and pinned tail: increasing keys in list order
  tail_rank = jnp.cumsum(hashed) - 1
  pin_rank = jnp.cumsum(pinned) - 1
  # head: batch b lands in front of batches < b; inside a batch the order is kept
  nbatch = ids.shape[0]
  tot = jnp.zeros((nbatch + 1,), jnp.int32).at[batch].add(head.astype(jnp.int32))
  cum_le = jnp.cumsum(tot)
  cum_lt = cum_le - tot
  excl = jnp.cumsum(head) - head
  head_key = state.head_key - cum_le[batch] + (excl - cum_lt[batch])
  k0 = jnp.where(hashed, state.tail_key + tail_rank, jnp.where(head, head_key, BIG))
  k1 = jnp.where(pinned, state.pin_key + pin_rank, BIG)
  fidx = jnp.where(freed, ids, nb)
  qk = QueueKeys(state.queue_key)[fidx].set(free=k0, pinned=k1, mode="drop")
  c = Counters(c).add(head_key=-jnp.sum(head).astype(jnp.int32))
  c = Counters(c).add(tail_key=jnp.sum(hashed).astype(jnp.int32))
  c = Counters(c).add(pin_key=jnp.sum(pinned).astype(jnp.int32))
  return state.replace(ref_cnt=ref, queue_key=qk, counters=c, queue_order=_recency(state, fidx, k0))


def _recency(state: CacheState, idx: jax.Array, keys: jax.Array) -> jax.Array:
  """`queue_order` with the recency of blocks `idx` (out of bounds: skipped) set to their new
  free-queue keys (a re-keying policy's state only; else the empty leaf as it is)."""
  if state.queue_order.shape[0] == 0:
    return state.queue_order
  return QueueOrder(state.queue_order)[idx].set(recency=keys, mode="drop")


def to_head(state: CacheState, ids: jax.Array) -> CacheState:
  """Moves the free blocks `ids` (unique, 0 = skip; each in the normal free queue or the
  pinned tier, unpinned by the caller) to the normal queue's head in list order (the first in
  front), where vLLM frees an unkeyed block: the retirement seam (`release.retire`) after
  dropping their keys."""
  nb = state.ref_cnt.shape[0]
  valid = ids > 0
  n = jnp.sum(valid).astype(jnp.int32)
  keys = state.head_key - n + jnp.cumsum(valid).astype(jnp.int32) - 1
  idx = _drop_idx(ids, nb)
  qk = QueueKeys(state.queue_key)[idx].set(free=keys, pinned=BIG, mode="drop")
  return state.replace(
    queue_key=qk,
    counters=Counters(state.counters).add(head_key=-n),
    queue_order=_recency(state, idx, keys),
  )


def pop_into(state: CacheState, row: jax.Array, start: jax.Array, count: jax.Array):
  """Pops `count` blocks from the head into `row[start:start+count]` and evicts their keys.

  Returns (state, row). The caller has checked capacity. When the normal queue is empty the
  oldest pinned block is taken (demotion then pop).
  """
  nb = state.ref_cnt.shape[0]

  def body(carry):
    i, qk, row, popped = carry
    b = eviction.select_victim(qk)
    qk = qk.at[:, b].set(BIG)
    row = row.at[start + i].set(b)
    popped = popped.at[b].set(True)
    return i + 1, qk, row, popped

  _, qk, row, popped = jax.lax.while_loop(
    lambda c: c[0] < count,
    body,
    (jnp.int32(0), state.queue_key, row, jnp.zeros((nb,), bool)),
  )
  state = state.replace(
    queue_key=qk,
    ref_cnt=jnp.where(popped, 1, state.ref_cnt),
    block_aux=BlockAux(state.block_aux).set(pinned=jnp.where(popped, 0, state.pinned)),
  )
  state = block_index.evict(state, popped)
  return state, row


def pin(state: CacheState, ids: jax.Array) -> CacheState:
  """Marks the non-null `ids` pinned (they go to the pinned tier when freed)."""
  nb = state.ref_cnt.shape[0]
  aux = BlockAux(state.block_aux)[_drop_idx(ids, nb)].set(pinned=1, mode="drop")
  return state.replace(block_aux=aux)


def _smallest(keys: jax.Array, k: jax.Array, pivots: int = 3):
  """(mask, min, hi): bool mask of the `k` smallest keys (< BIG, unique), the smallest valid
  key and the largest selected key.

  A (pivots+1)-ary search on the key value: each round counts keys below `pivots` thresholds
  at once (one [pivots, NB] compare), so a key range R takes about log_{pivots+1}(R) rounds.
  Keys are unique, so the search stops as soon as a threshold has exactly `k` keys at or below
  it; the first round tries `min + k - 1` (exact when the queue head has no gaps).
  """
  valid = keys < BIG
  # two plain reductions (XLA:CPU runs one min over a stacked [2, N] about 2x slower)
  mn = jnp.min(jnp.where(valid, keys, BIG))
  lo = mn - 1  # count(<= lo) = 0 < k
  hi = jnp.max(jnp.where(valid, keys, -BIG))  # max valid key, -BIG if none: count(<= hi) >= k
  guess = jnp.minimum(mn + k - 1, hi)
  c_guess = jnp.sum(valid & (keys <= guess))
  lo = jnp.where(c_guess >= k, lo, guess)
  hi = jnp.where(c_guess >= k, guess, hi)
  done = (c_guess == k) | (k <= 0)
  j = jnp.arange(1, pivots + 1, dtype=jnp.int32)

  def body(c):
    lo, hi, _ = c
    step = jnp.maximum((hi - lo) // (pivots + 1), 1)
    mids = jnp.minimum(lo + step * j, hi)
    counts = jnp.sum(valid[None, :] & (keys[None, :] <= mids[:, None]), axis=1)
    enough = counts >= k
    new_hi = jnp.min(jnp.where(enough, mids, hi))
    new_lo = jnp.max(jnp.where(enough, lo, mids))
    return new_lo, new_hi, jnp.any(counts == k)

  _, hi, _ = jax.lax.while_loop(lambda c: (c[1] - c[0] > 1) & ~c[2], body, (lo, hi, done))
  return valid & (keys <= hi) & (k > 0), mn, hi


def _smallest_mask(keys: jax.Array, k: jax.Array, pivots: int = 3) -> jax.Array:
  """bool mask of the `k` smallest keys (< BIG, unique); see `_smallest`."""
  return _smallest(keys, k, pivots)[0]


def _by_key_offset(keys: jax.Array, size: int) -> jax.Array:
  """i32[size]: each normal-queue block (`keys` i32[NB], BIG = not queued) at its key's offset
  from the smallest key, for offsets < size; 0 marks a hole (keys are unique and block 0 is
  never free). The entries are in pop order."""
  valid = keys < BIG
  mn = jnp.min(jnp.where(valid, keys, BIG))
  off = keys - mn  # >= 0 where valid (keys lie inside (-2^30, 2^30))
  slot = jnp.where(valid & (off < size), off, size)
  ids = jnp.arange(keys.shape[0], dtype=jnp.int32)
  return jnp.zeros((size,), jnp.int32).at[slot].set(ids, mode="drop")


def is_slot(state: CacheState, ids: jax.Array) -> jax.Array:
  """bool[...]: which of `ids` are state slots (second pool: ids >= `first_slot`)."""
  return ids >= state.first_slot


def pop_many(
  state: CacheState,
  count: jax.Array,
  kmax: int,
  count_groups: tuple[int, ...] = (),
  n_norm: jax.Array | None = None,
  scan_all: bool = False,
  pool: int | None = None,
):
  """Pops `count` (<= kmax, <= free) blocks in free-queue order without a per-block loop.

  `n_norm` (optional i32): the caller's count of normal-queue blocks (`free_key < BIG`),
  saving one reduction over the pool. `pool` (static, two pools only): pop from the pages
  (0) or the state slots (1), in that pool's order; `n_norm` and `count` are then the pool's.

  Returns (state, ids i32[kmax]): ids[:count] in pop order (normal queue head first, then the
  pinned tier oldest first, i.e. demotion), 0 beyond. Popped blocks get ref 1, lose their keys
  and their pinned flag. Keyed blocks of the groups in `count_groups` (static) that are popped
  add to `CacheState.states_evicted`. `scan_all` (static): see `block_index.evict_ids`.
  """
  nb = state.ref_cnt.shape[0]
  qk = state.queue_key
  if pool is not None:  # the other pool's blocks are not candidates
    mine = is_slot(state, jnp.arange(nb, dtype=jnp.int32)) == bool(pool)
    qk = jnp.where(mine[None, :], qk, BIG)
  if n_norm is None:
    n_norm = jnp.sum(QueueKeys(qk).free < BIG).astype(jnp.int32)
  k1 = jnp.minimum(count, n_norm)
  k2 = count - k1
  win = 2 * kmax

  def by_rank():
    sel1 = _smallest_mask(QueueKeys(qk).free, k1)
    sel2 = jax.lax.cond(
      k2 > 0, lambda: _smallest_mask(QueueKeys(qk).pinned, k2), lambda: jnp.zeros((nb,), bool)
    )
    sel = sel1 | sel2
    ids = xla_cpu.compact(sel, kmax)
    cls = jnp.where(sel1[ids], 0, jnp.where(sel2[ids], 1, 2))
    cls = jnp.where(jnp.arange(kmax) < jnp.sum(sel), cls, 2)
    # pop order = rank by (class, key) packed into one uint32 (normal keys stay inside
    # (-2^30, 2^30) and pinned keys inside [0, 2^30) thanks to `maybe_renormalise`), ranked
    # with one [kmax, kmax] compare instead of a sort; padding ties at the end and is dropped
    u = jnp.uint32
    key_n = (QueueKeys(qk).free[ids] + jnp.int32(1 << 30)).astype(u)
    key_p = QueueKeys(qk).pinned[ids].astype(u) + u(1 << 31)
    ck = jnp.where(cls == 0, key_n, jnp.where(cls == 1, key_p, u(0xFFFFFFFF)))
    ids, ck = jax.lax.optimization_barrier((ids, ck))
    rank = jnp.sum(ck[None, :] < ck[:, None], axis=1)
    return jnp.zeros((kmax,), jnp.int32).at[rank].set(ids)

  def squeeze(w, p):
    # the window's live blocks (non-zero) in order, holes squeezed out (p: inclusive count)
    dest = jnp.where(w > 0, p - 1, kmax)
    return jnp.zeros((kmax,), jnp.int32).at[dest].set(w, mode="drop")

  if not xla_cpu.enabled("pop_window"):
    ordered = by_rank()  # the plain twin: rank selection over the whole pool
  else:
    # common case: only normal-queue blocks, and at least k1 normal keys lie in the window
    # [min, min + win): each such block's id is scattered to its key offset (already in pop
    # order; keys are unique and block 0 is never free, so 0 marks a hole); the k1 smallest
    # keys are then the window's first k1 entries
    w = _by_key_offset(QueueKeys(qk).free, win)
    p = jnp.cumsum(w > 0)
    fast = (k2 == 0) & (p[win - 1] >= k1)
    ordered = jax.lax.cond(fast, lambda: squeeze(w, p), by_rank)
  ids = jnp.where(jnp.arange(kmax) < count, ordered, 0)
  sidx = jnp.where(ids > 0, ids, nb)
  # the pinned flag (`CacheState.pinned`) is cleared by `evict_ids` in its row write
  state = state.replace(
    queue_key=state.queue_key.at[:, sidx].set(BIG, mode="drop"),
    ref_cnt=state.ref_cnt.at[sidx].set(1, mode="drop"),
  )
  grp = state.block_group[ids]  # ids >= 0; read once for the counter and the index eviction
  if count_groups:
    hit = (ids > 0) & jnp.isin(grp, jnp.asarray(count_groups, jnp.int32))
    n_ev = jnp.sum(hit).astype(jnp.int32)
    state = state.replace(counters=Counters(state.counters).add(states_evicted=n_ev))
  state = block_index.evict_ids(state, ids, grp, clear_pinned=True, scan_all=scan_all)
  return state, ids


RENORM_LIMIT = 1 << 29


def maybe_renormalise(state: CacheState) -> CacheState:
  """Re-packs queue keys as ranks when the head/tail counters drift near the int32 range.

  Order-preserving, so the free queue and pinned tier are unchanged; runs (one argsort) only
  after ~2^29 head or tail insertions.
  """
  due = (
    (state.tail_key > RENORM_LIMIT)
    | (state.head_key < -RENORM_LIMIT)
    | (state.pin_key > RENORM_LIMIT)
  )

  def as_ranks(keys):  # 1 + each key's rank among the keys < BIG (BIG stays BIG)
    nb = keys.shape[0]
    rank = jnp.zeros((nb,), jnp.int32).at[jnp.argsort(keys)].set(jnp.arange(nb, dtype=jnp.int32))
    return jnp.where(keys < BIG, rank + 1, BIG)

  def renorm(state):
    qk = state.queue_key
    out = [as_ranks(qk[row]) for row in range(QueueKeys.width())]  # every queue's keys
    n0 = jnp.sum(QueueKeys(qk).free < BIG).astype(jnp.int32)
    n1 = jnp.sum(QueueKeys(qk).pinned < BIG).astype(jnp.int32)
    c = Counters(state.counters).set(head_key=1)
    c = Counters(c).set(tail_key=n0 + 1)
    c = Counters(c).set(pin_key=n1 + 1)
    order = state.queue_order
    if order.shape[0]:  # the recency of the queued blocks, as ranks in the same range
      rec = jnp.where(QueueKeys(qk).free < BIG, state.free_recency, BIG)
      order = QueueOrder(order).set(recency=as_ranks(rec))
    return state.replace(queue_key=jnp.stack(out), counters=c, queue_order=order)

  return jax.lax.cond(due, renorm, lambda s: s, state)


def free_counts(lay: Layout, state: CacheState) -> jax.Array:
  """Free blocks in the normal queue and in the pinned tier (`QueueCounts`; one pool
  reduction): i32[2] with one pool, i32[2, 2] (pages, state slots) with
  two (`Layout.state_pool`)."""
  queued = state.queue_key < BIG
  total = jnp.sum(queued, axis=1).astype(jnp.int32)
  if not lay.state_pool:
    return total
  slot = is_slot(state, jnp.arange(queued.shape[1], dtype=jnp.int32))
  slots = jnp.sum(queued & slot[None, :], axis=1).astype(jnp.int32)
  return jnp.stack([total - slots, slots])
