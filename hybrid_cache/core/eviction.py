"""Victim selection: one routine for every eviction policy, driven by a per-block int32 key.

`lru` reproduces vLLM's free queue exactly: the key is the block's position in the doubly linked
free list (head insertions below every key, tail insertions above), the victim is the smallest
key; `prepare` leaves it alone.

Every other registered policy (`hybrid_cache.policies`; `core/policies/<name>.py`) re-keys the
normal free queue in `prepare`, at the start of every scheduler step, so that the unchanged pop
(smallest key first) follows it: free blocks without a key first, in their current order
(scratch first); then dead recurrent states (`dead_states`: their KV prefix is gone, they can
never be hit), least recently freed first; then the other keyed free blocks ("candidates") by
increasing `policy.priority(lay, state, FreeBlocks)`, ties least recently freed first: the
primary key (dead -1, candidates their priority) then the recency.
A policy may define `active(state)`: when it is false the queue is left as it is (flop_aware:
alpha = 0 is exactly LRU). The twin (`hybrid_cache.twin.eviction`) orders the
Python free list by the same rule, so both cores agree exactly.

Recency survives re-keying in its own row: `CacheState.free_recency` holds each queued block's
key as vLLM's free queue (`lru`) would give it (written with the queue key at every free), so
"least recently freed first" is "smallest recency first", exact at any pool size. Key-less
free blocks keep their keys (so they stay first, in their current order); the keyed ones are
keyed from W0 = the tail counter up (above every key in use), and the tail counter is lifted
past them, so blocks freed later go after them. Each step thus uses about one pool size of
keys (NB, plus the ordered window); `block_pool.maybe_renormalise` re-packs the keys every
~2^29 / NB steps (one argsort per row).

Lazy order (`lazy`: policies that do not read the recency rank, `Layout.ranks_all` false: all
but flop_aware, on pools of more than `LAZY_FROM` blocks). Sorting the whole pool every step
cost ~6 of ~10 ms per step at 2^16 blocks (Mooncake, 64-token pages), yet a step pops a few
hundred blocks at most. So `prepare` only
selects each pool's first M = `order_window` keyed blocks (radix selection on the primary key
and then the recency, `_kth_smallest`; about 0.3 ms), sorts those (M log M) and keys them
[W0, R0) in the merged order; the pool's other keyed blocks get keys R0 + block id (the lazy
region [R0, W_END), `lazy_region`), their primary key kept in `CacheState.free_rank`. The
queue below `CacheState.order_exact` is then the exact order (with one pool all of [W0, R0);
with two, up to the last selected block of a pool that has a lazy part). Whatever would read
the order further first completes it (`complete_order`: the old two sorts, on the lazy part
only): a pop of more blocks of a pool than lie below R0 (`order_for_pop`), a byte-budget
eviction that would walk past `order_exact` (`byte_budget.enforce`), `reset_prefix_cache`, and
tests that read the whole queue (`scheduler.free_queue_keys`). Nothing else can reorder the
lazy part within a step: a hit takes a block out, frees go to the head or the tail, and a free
block loses its key in place only by the byte budget. So every pop equals the full order's, and
the twin (which sorts its whole list) agrees exactly. Measured in BENCHMARKS.md section 5.

Eviction clock (a policy registered with `Reads(clock=True)`, `Layout.eviction_clock`; the
GreedyDual family, `policies/greedy_dual.py`): the state keeps `CacheState.evict_clock` (L) and
per block `evict_stamp` (L when its key was registered or last hit, `FreeBlocks.stamp`) and
`evict_ranked`. `prepare` first rebases (`rebase_clock`), then records each candidate's priority
in `evict_ranked` (0 elsewhere; a hit resets it to 0); evicting a block (a pop, the byte budget:
`block_index.evict`, `evict_ids`) raises L to its `evict_ranked` (`block_index.advance_clock`).
So L is the largest priority evicted so far, as ranked at the step's start; blocks freed after
it are not ranked and do not move L. Stateless policies' programs have none of this.

Known limitation of flop_aware: its utility is per block and blind to prefix chains (a free
block does not know which blocks its prefix needs). In a hybrid model a recurrent state saves
far more FLOPs per page than one KV block, so at alpha > 0 KV blocks go before the states that
need them; `dead_states` frees a state once the KV block at its own end is gone, but a KV chain
broken further up is not detected, and KV blocks of a long prefix rank like those of a short
one. Marconi evicts tree nodes (edge KV + state) together; the block-level analogue is a
per-block chain value: `FreeBlocks.chain_start` and `FreeBlocks.hits` (recorded with the key and
at each hit) give a policy the KV span back to the previous kept state and the block's use
(example: `policies/chain_value.py`).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from hybrid_cache import policies
from hybrid_cache.core import block_index
from hybrid_cache.core import xla_cpu
from hybrid_cache.core.eviction_costs import CLOCK_LIMIT
from hybrid_cache.core.eviction_costs import CLOCK_REBASE
from hybrid_cache.core.state import BIG
from hybrid_cache.core.state import BlockAux
from hybrid_cache.core.state import Counters
from hybrid_cache.core.state import QueueKeys
from hybrid_cache.core.state import QueueOrder

NORM_BITS = 14
NORM = 1 << NORM_BITS
# blocks per pool that `prepare` orders exactly at every step (lazy order: the rest only when a
# step reaches them). A step pops at most a few hundred pages on real traces, so the rest is
# rarely ordered; the selection costs about the same for any window (radix passes over the
# pool), the sort of the window grows with it. Measured (Mooncake, 2^16 blocks): see
# BENCHMARKS.md section 5, "Lazy order".
ORDER_WINDOW = 512
# radix passes (shift, bits) of `_kth_smallest` over 32-bit keys
_PASSES = ((21, 11), (10, 11), (0, 10))


# pools of at most this many (padded) blocks are ordered whole at every step: there the two
# sorts are cheap, and the lazy order's selection and completions only add program size (the
# test suite's small pools compiled and ran ~2x slower with it); tests of the lazy order
# lower this (`tests/hybrid_cache/lazy_order_test.py`)
LAZY_FROM = 4096


def lazy(lay) -> bool:
  """Whether `prepare` orders lazily (static): a re-keying policy that does not read the
  recency rank (`Layout.rekeys`, not `Layout.ranks_all`) on a pool of more than `LAZY_FROM`
  blocks."""
  return lay.rekeys and not lay.ranks_all and lay.num_blocks > LAZY_FROM


def order_window(lay) -> int:
  """M, the blocks per pool `prepare` orders exactly under the lazy order (static):
  `ORDER_WINDOW`, at most an eighth of the padded pool (at least 8)."""
  return int(min(ORDER_WINDOW, max(8, lay.num_blocks // 8)))


def lazy_region(lay, state) -> tuple[jax.Array, jax.Array]:
  """[R0, W_END): the lazy region the last `prepare` left (traced; W_END = R0 + the padded
  pool); tail insertions since then are at or above W_END."""
  r0 = state.order_lazy
  return r0, r0 + lay.num_blocks


def scaled_ratio(a: jax.Array, d: jax.Array) -> jax.Array:
  """floor(a * 2^NORM_BITS / d) for int32 0 <= a <= d, 1 <= d <= 2^30, without overflow."""
  q = a // d
  rem = a - q * d
  for _ in range(NORM_BITS):
    rem = rem * 2
    bit = rem >= d
    q = q * 2 + bit.astype(jnp.int32)
    rem = jnp.where(bit, rem - d, rem)
  return q


def _rank(order: jax.Array, values: jax.Array | None = None) -> jax.Array:
  """i32[N]: out[order[i]] = values[i] (default i: the inverse permutation)."""
  n = order.shape[0]
  values = jnp.arange(n, dtype=jnp.int32) if values is None else values
  return jnp.zeros((n,), jnp.int32).at[order].set(values, unique_indices=True)


def dead_states(lay, state) -> jax.Array:
  """bool[NB]: keyed blocks of recurrent groups whose prefix cannot be hit any more.

  A state at token end E is dead when the first full-attention group has a block ending at E
  (E % its block size == 0) but no block carries that key (same fine hash, that group): its KV
  prefix was evicted, so the state can never be the boundary of a hit. No full group: none.
  """
  full = lay.prefix_groups  # full attention (`KEEPS_PREFIX`)
  nb = lay.num_blocks
  if not full or not lay.recurrent_groups:
    return jnp.zeros((nb,), bool)
  fg = full[0]
  rec = jnp.isin(state.block_group, jnp.asarray(lay.recurrent_groups, jnp.int32))
  aligned = state.key_end % lay.groups[fg].block_size == 0
  found = block_index.contains(state, state.block_hash, fg)
  return rec & aligned & ~found


@flax.struct.dataclass
class FreeBlocks:
  """What an eviction policy sees of the pool at the start of a step (NB = pool blocks).

  Attributes:
    candidate: bool[NB], keyed free blocks that can still be hit (the blocks a policy orders;
      key-less free blocks go first and dead states right after them, whatever the policy).
    group: i32[NB], the group of the block's key (-1: no key).
    token_end: i32[NB], the token position where the block's key ends (its prefix length).
    recency: i32[NB], among the candidates, the rank by the time each was freed
      (0 = least recently freed); meaningless elsewhere. None unless the policy declares it
      reads it (`Reads(recency=True)`, `Layout.ranks_all`: it costs two sorts of the pool
      per step and rules out the lazy order).
    num_candidates: i32[], the number of candidates.
    hits: i32[NB], prefix-cache hits on the block since its key was registered
      (`CacheState.key_hits`: admitted allocations that touched it as a hit).
    chain_start: i32[NB], where the KV span of the block's key starts
      (`CacheState.chain_start`): in a recurrent group the token end of the previous state its
      registering request kept (0 = none), so `token_end - chain_start` tokens of KV lie back
      to that checkpoint; in other groups the block's first token.

    stamp: i32[NB], the eviction clock (`CacheState.evict_clock`, GreedyDual's L) when the
      block's key was registered or last hit (`CacheState.evict_stamp`), rebased with the clock
      (`rebase_clock`).

    penult: i32[NB], the scheduler step of the access before the latest to the block's key
      (`CacheState.key_penult`; an access is its registration or a hit; 0 = accessed once),
      raised by retirement to the superseded states' (`release.retire`).
    owner: i32[NB], per full-attention block the recurrent state block the last finished
      request through it needed it for (`CacheState.kv_owner`, `core.kv_owner`; -1 = none).

  `hits` and `chain_start` (the chain features) are None unless the policy declares it reads
  them (`Reads(chain=True)` in `hybrid_cache.policies.EVICTION`, `Layout.chain_features`):
  only then does the core maintain them (on every step they cost ~13%, issue 14). `stamp`
  likewise only with `Reads(clock=True)` (`Layout.eviction_clock`), `penult` and `owner` only
  with `Reads(history=True)` (`Layout.access_history`).
  """

  candidate: jax.Array
  group: jax.Array
  token_end: jax.Array
  recency: jax.Array | None
  num_candidates: jax.Array
  hits: jax.Array | None = None
  chain_start: jax.Array | None = None
  stamp: jax.Array | None = None
  penult: jax.Array | None = None
  owner: jax.Array | None = None


def rebase_clock(state):
  """The eviction clock and every stamp lowered by `CLOCK_REBASE` (stamps floored at 0) once
  the clock exceeds `CLOCK_LIMIT`, so that stamp + weight stays in int32: GreedyDual's order
  is unchanged by a common shift except among stamps more than `CLOCK_REBASE` below the clock
  (they tie at 0). Run by `prepare` (clock policies only); the twin does the same."""
  due = state.evict_clock > CLOCK_LIMIT
  shift = jnp.where(due, CLOCK_REBASE, 0)
  stamp = jnp.maximum(state.evict_stamp - shift, 0)
  aux = BlockAux(state.block_aux).set(evict_stamp=stamp)
  counters = Counters(state.counters).set(evict_clock=state.evict_clock - shift)
  return state.replace(block_aux=aux, counters=counters)


def _primary(lay, state, policy):
  """(rank, keyed, ranked, perm): each queued keyed block's primary key (dead states -1,
  candidates `policy.priority`; BIG elsewhere), the queued keyed blocks (the ones the frame
  orders), the candidates' priorities (0 elsewhere), and with `Layout.ranks_all` the keyed
  blocks' permutation by recency (else None)."""
  grp = state.block_group
  keyed = (state.free_key < BIG) & (grp >= 0)
  dead = keyed & dead_states(lay, state)
  alive = keyed & ~dead
  perm = recency = None
  if lay.ranks_all:  # the candidates' recency rank, for a policy that reads it
    perm = xla_cpu.stable_argsort(jnp.where(keyed, state.free_recency, BIG))
    recency = _rank(perm, xla_cpu.prefix_count(alive[perm]) - 1)
  blocks = FreeBlocks(
    candidate=alive,
    group=grp,
    token_end=state.key_end,
    recency=recency,
    num_candidates=jnp.sum(alive).astype(jnp.int32),
    hits=state.key_hits if lay.chain_features else None,
    chain_start=state.chain_start if lay.chain_features else None,
    stamp=state.evict_stamp if lay.eviction_clock else None,
    penult=state.key_penult if lay.access_history else None,
    owner=state.kv_owner if lay.access_history else None,
  )
  util = policy.priority(lay, state, blocks)
  rank = jnp.where(dead, -1, jnp.where(alive, util, BIG))
  return rank, keyed, jnp.where(alive, util, 0), perm


def _order_all(state, rank, moved, base, perm=None) -> jax.Array:
  """i32[NB]: the `moved` blocks keyed `base` + their position by (rank, recency), the other
  blocks' free-queue keys unchanged (two stable sorts of the pool; `perm`, the moved blocks
  by recency, if the caller has it)."""
  if perm is None:
    perm = xla_cpu.stable_argsort(jnp.where(moved, state.free_recency, BIG))
  slot = _rank(perm[xla_cpu.stable_argsort(jnp.where(moved, rank, BIG)[perm])])
  return jnp.where(moved, base + slot, state.free_key)


def _kth_smallest(u: jax.Array, pool: jax.Array, k: jax.Array, pools: int):
  """Per pool p: (the k[p]-th smallest (1-based) of `u` (u32[N]) among the entries with
  pool == p (i32[N], -1 = none), the number of them strictly smaller): (u32[P], i32[P]).
  Radix selection, one histogram over the pools per pass (`_PASSES`); meaningless for a
  pool with fewer than k[p] entries."""
  match = pool >= 0
  g = jnp.clip(pool, 0, pools - 1)
  need = k
  val = jnp.zeros((pools,), jnp.uint32)
  below = jnp.zeros((pools,), jnp.int32)
  for shift, bits in _PASSES:
    n = 1 << bits
    d = ((u >> jnp.uint32(shift)) & jnp.uint32(n - 1)).astype(jnp.int32)
    hist = jnp.zeros((pools * n + 1,), jnp.int32).at[jnp.where(match, g * n + d, pools * n)]
    hist = hist.add(1)[: pools * n].reshape(pools, n)
    cum = jnp.cumsum(hist, axis=1)
    digit = jnp.sum(cum < need[:, None], axis=1).astype(jnp.int32)  # per pool
    prev = jnp.take_along_axis(cum, jnp.clip(digit - 1, 0, n - 1)[:, None], axis=1)[:, 0]
    prev = jnp.where(digit > 0, prev, 0)
    below = below + prev
    need = need - prev
    match = match & (d == digit[g])
    val = val | (jnp.clip(digit, 0, n - 1).astype(jnp.uint32) << jnp.uint32(shift))
  return val, below


def _u32(x: jax.Array) -> jax.Array:
  """Order-preserving int32 -> uint32."""
  return x.astype(jnp.uint32) ^ jnp.uint32(1 << 31)


def _order_window(lay, state, rank, moved, w0):
  """(free row i32[NB], exact bound i32): each pool's first `order_window` moved blocks by
  (rank, recency) keyed `w0` + their position in the merged order, the other moved blocks
  R0 + block id (the lazy region, R0 = w0 + M * pools); the bound below which the keys are
  the whole queue's exact order (BIG when no pool has more than the window). Module
  docstring, "Lazy order"."""
  m, pools, nb = order_window(lay), lay.num_pools, lay.num_blocks
  r0 = w0 + m * pools
  ids = jnp.arange(nb, dtype=jnp.int32)
  pool = (ids >= state.first_slot).astype(jnp.int32) if pools > 1 else jnp.zeros_like(ids)
  gid = jnp.where(moved, pool, -1)
  count = jnp.stack([jnp.sum(gid == p) for p in range(pools)]).astype(jnp.int32)
  u, ur = _u32(rank), _u32(state.free_recency)
  v, below = _kth_smallest(u, gid, jnp.full((pools,), m, jnp.int32), pools)
  tie = moved & (u == v[pool])
  vr, _ = _kth_smallest(ur, jnp.where(tie, pool, -1), m - below, pools)
  sel = moved & ((u < v[pool]) | (tie & (ur <= vr[pool])))
  sel = jnp.where(count[pool] <= m, moved, sel)
  # the selected blocks (at most m per pool) in (rank, recency) order
  ms = m * pools
  n_sel = jnp.sum(sel).astype(jnp.int32)
  pos = jnp.arange(ms, dtype=jnp.int32)
  picked = xla_cpu.compact(sel, ms)
  valid = pos < n_sel
  _, _, order = jax.lax.sort(
    (
      jnp.where(valid, rank[picked], BIG),
      jnp.where(valid, state.free_recency[picked], BIG),
      picked,
    ),
    num_keys=2,
  )
  keys = jnp.where(moved & ~sel, r0 + ids, state.free_key)
  keys = keys.at[jnp.where(valid, order, nb)].set(w0 + pos, mode="drop")
  # exact prefix: up to the last selected block of each pool with a lazy part
  over = count > m
  last = jnp.stack([jnp.max(jnp.where(valid & (pool[order] == p), pos, -1)) for p in range(pools)])
  n_exact = jnp.min(jnp.where(over, last + 1, n_sel))
  return keys, jnp.where(jnp.any(over), w0 + n_exact, BIG)


def _completed(lay, state):
  """(free row, counters): the lazy part of the normal queue (keys in [`order_exact`, W_END))
  keyed `order_exact` + its position by (rank, recency): the whole queue in exact order."""
  _, w_end = lazy_region(lay, state)
  lo = state.order_exact
  qk = state.free_key
  lazy_part = (qk >= lo) & (qk < w_end)
  keys = _order_all(state, state.free_rank, lazy_part, lo)
  return keys, Counters(state.counters).set(order_exact=BIG)


def complete_order(lay, state, when=True):
  """`state` with its whole normal queue in exact order (`when`, a traced bool: only then; the
  state unchanged without a lazy part). Run before anything reads the queue past the ordered
  window (`order_for_pop`, `byte_budget.enforce`, `reset_prefix_cache`) and by tests that
  read the whole queue. No-op without the lazy order (`lazy`)."""
  if not lazy(lay):
    return state
  due = when & (state.order_exact < BIG)
  keys, counters = jax.lax.cond(
    due, lambda: _completed(lay, state), lambda: (state.free_key, state.counters)
  )
  return state.replace(queue_key=QueueKeys(state.queue_key).set(free=keys), counters=counters)


def order_for_pop(lay, state, count, pool: int | None = None):
  """`state` with the first `count` blocks (i32) of the normal queue (of pool `pool`, static,
  with two pools) in exact order: the queue is completed only when fewer than `count` of its
  blocks lie below the lazy region."""
  if not lazy(lay):
    return state
  r0, _ = lazy_region(lay, state)
  qk = state.free_key
  ahead = qk < r0
  if pool is not None:
    ahead &= (jnp.arange(qk.shape[0], dtype=jnp.int32) >= state.first_slot) == bool(pool)
  return complete_order(lay, state, jnp.sum(ahead) < count)


def prepare(lay, state):
  """Hook run at the start of every scheduler step, before any allocation.

  `lru`: the state unchanged. Any other policy (`policies.core_eviction`): when the policy is
  `active` (flop_aware: alpha > 0; default: always), keys the normal free queue's keyed
  blocks above every key in use (W0 = the tail counter) in the order of the policy's
  `priority` (module docstring): each pool's first `order_window` blocks under the lazy order
  (`lazy`), else the whole queue; then lifts the tail counter above them. With an
  eviction clock (`Layout.eviction_clock`): first `rebase_clock`, then each block's
  `evict_ranked` is set to the priority it was ranked with (0: not a candidate), or to the
  policy's `clock_priority(state, ranked)` if it defines one. Pinned tier untouched.
  """
  policy = policies.core_eviction(lay.config.eviction)
  if policy is None:
    return state
  if lay.eviction_clock:
    state = rebase_clock(state)
  w0 = state.tail_key  # above every key in use
  r0 = w0 + (order_window(lay) * lay.num_pools if lazy(lay) else 0)
  nb = lay.num_blocks

  def order():
    rank, keyed, ranked, perm = _primary(lay, state, policy)
    if lazy(lay):
      keys, exact = _order_window(lay, state, rank, keyed, w0)
    else:
      keys, exact = _order_all(state, rank, keyed, w0, perm), BIG
    return keys, jnp.int32(exact), rank, ranked

  def unchanged():
    big = jnp.full((nb,), BIG, jnp.int32)
    return state.free_key, state.order_exact, big, jnp.zeros((nb,), jnp.int32)

  active = getattr(policy, "active", None)
  if active is None or lay.eviction_clock:  # a clock policy is always active
    keys, exact, rank, ranked = order()
  else:  # the cond returns only rows (a cond over the whole state copies its leaves)
    keys, exact, rank, ranked = jax.lax.cond(active(state), order, unchanged)
  if lay.eviction_clock:
    on_clock = getattr(policy, "clock_priority", None)  # what the clock may rise to (`tuned`)
    ranked = ranked if on_clock is None else on_clock(state, ranked)
    state = state.replace(block_aux=BlockAux(state.block_aux).set(evict_ranked=ranked))
  counters = Counters(state.counters).set(order_exact=exact, order_lazy=r0, tail_key=r0 + nb)
  return state.replace(
    queue_key=QueueKeys(state.queue_key).set(free=keys),
    queue_order=QueueOrder(state.queue_order).set(rank=rank),
    counters=counters,
  )


def select_victim(queue_key: jax.Array) -> jax.Array:
  """Next block to reuse: smallest normal-queue key; else the oldest pinned block (demotion).
  `queue_key`: i32[2, NB] (`CacheState.queue_key`, rows `QueueKeys`)."""
  queues = QueueKeys(queue_key)
  has_normal = jnp.any(queues.free < BIG)
  free, pinned = jnp.argmin(queues.free), jnp.argmin(queues.pinned)
  return jnp.where(has_normal, free, pinned).astype(jnp.int32)
