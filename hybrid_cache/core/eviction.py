"""Victim selection: one routine for every eviction policy, driven by a per-block int32 key.

`lru` reproduces vLLM's free queue exactly: the key is the block's position in the doubly linked
free list (head insertions below every key, tail insertions above), the victim is the smallest
key; `prepare` leaves it alone.

Every other registered policy (`hybrid_cache.policies`; `core/policies/<name>.py`) re-keys the
normal free queue in `prepare`, at the start of every scheduler step, so that the unchanged pop
(smallest key first) follows it: free blocks without a key first, in their current order
(scratch first); then dead recurrent states (`dead_states`: their KV prefix is gone, they can
never be hit), least recently freed first; then the other keyed free blocks ("candidates") by
increasing `policy.priority(lay, state, FreeBlocks)`, ties least recently freed first.
A policy may define `active(state)`: when it is false the queue is left as it is (flop_aware:
alpha = 0 is exactly LRU). The twin (`hybrid_cache.twin.eviction`) orders the
Python free list by the same rule, so both cores agree exactly.

Recency survives re-keying: candidates get keys `W0 + slot * K + l` in a fixed window
[W0, W_END) above every key-less block (W0 = num_blocks), where slot is the new queue position
and l the block's LRU rank (`r >> SHIFT`: exact while num_blocks <= 2^14; beyond, K levels,
equal levels tie in block-id order, which the twin does not model);
blocks freed to the tail later get keys >= W_END (`prepare` lifts the tail counter there), so
the next `prepare` recovers the LRU order as (window blocks by l, then later frees by key).
The window ends below 2^28 + num_blocks, under the renormalisation limit (2^29); a rare
renormalisation (2^28 tail frees later) turns the current utility order into the recency order
once.

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

NORM_BITS = 14
NORM = 1 << NORM_BITS
WINDOW_LIMIT = 1 << 28


def window(num_blocks: int) -> tuple[int, int, int, int]:
  """(W0, K, SHIFT, W_END) of the re-keying window for a pool of `num_blocks` blocks."""
  p = 1 << max(0, (num_blocks - 1).bit_length())  # next power of two >= num_blocks
  k = min(p, max(1, WINDOW_LIMIT // p))
  shift = (p // k).bit_length() - 1
  w0 = num_blocks
  return w0, k, shift, w0 + num_blocks * k


def state_window(lay, state):
  """`window` of the real pool (`CacheState.num_real_blocks`, traced): K and SHIFT only
  depend on its next power of two, the (padded) pool arrays' length `lay.num_blocks`."""
  _, k, shift, _ = window(lay.num_blocks)
  w0 = state.num_real_blocks
  return w0, k, shift, w0 + w0 * k


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
      (0 = least recently freed); meaningless elsewhere.
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
  recency: jax.Array
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


def _rekey_queue(lay, state, priority, ranked: bool = False):
  """The re-keyed normal free-queue row (i32[NB]); see the module docstring. With `ranked`
  (static), the pair (row, the candidates' priorities i32[NB], 0 for the other blocks).

  `priority(blocks: FreeBlocks) -> i32[NB]`: the policy's priority of each candidate, in
  [0, 2^30] (lower first; ties keep recency order)."""
  w0, k, shift, w_end = state_window(lay, state)
  qk0 = state.free_key
  grp = state.block_group
  free = qk0 < BIG
  keyed = free & (grp >= 0)
  dead = keyed & dead_states(lay, state)
  alive = keyed & ~dead
  stray = free & ~keyed & (qk0 >= w0)  # key-less blocks inside the window / tail range
  n = jnp.sum(alive).astype(jnp.int32)
  # recency: window blocks by their stored LRU rank, then later tail frees by key (unique
  # among keyed blocks while num_blocks <= 2^14; beyond, equal ranks tie in block-id order)
  t = jnp.where(qk0 >= w_end, qk0, jnp.where(qk0 >= w0, (qk0 - w0) & (k - 1), qk0 - w0 - k))
  # one order: keyed blocks by recency, strays by key (classes are separated by the final one)
  rec_key = jnp.where(keyed, t, jnp.where(stray, qk0, BIG))
  perm = xla_cpu.stable_argsort(rec_key)
  r_all = _rank(perm, xla_cpu.prefix_count(keyed[perm]) - 1)
  r = _rank(perm, xla_cpu.prefix_count(alive[perm]) - 1)
  blocks = FreeBlocks(
    candidate=alive,
    group=grp,
    token_end=state.key_end,
    recency=r,
    num_candidates=n,
    hits=state.key_hits if lay.chain_features else None,
    chain_start=state.chain_start if lay.chain_features else None,
    stamp=state.evict_stamp if lay.eviction_clock else None,
    penult=state.key_penult if lay.access_history else None,
    owner=state.kv_owner if lay.access_history else None,
  )
  util = priority(blocks)
  primary = jnp.where(stray, -2, jnp.where(dead, -1, jnp.where(alive, util, BIG)))
  # stable order of the recency-ordered list by primary: ties keep recency order
  slot = _rank(perm[xla_cpu.stable_argsort(primary[perm])])
  moved = stray | keyed
  l_digit = jnp.clip(r_all, 0, w0) >> shift
  new_key = w0 + slot * k + jnp.where(keyed, l_digit, 0)
  qk = jnp.where(moved, new_key, qk0)
  return (qk, jnp.where(alive, util, 0)) if ranked else qk


def prepare(lay, state):
  """Hook run at the start of every scheduler step, before any allocation.

  `lru`: the state unchanged. Any other policy (`policies.core_eviction`): lifts the tail
  counter above the re-keying window and, when the policy is `active` (flop_aware: alpha > 0;
  default: always), re-keys the normal free queue by the policy's `priority` (module
  docstring). With an eviction clock (`Layout.eviction_clock`): first `rebase_clock`, then each
  block's `evict_ranked` is set to the priority it was ranked with (0: not a candidate), or to
  the policy's `clock_priority(state, ranked)` if it defines one.
  Pinned tier untouched.
  """
  policy = policies.core_eviction(lay.config.eviction)
  if policy is None:
    return state
  _, _, _, w_end = state_window(lay, state)
  c = state.counters
  state = state.replace(counters=Counters(c).set(tail_key=jnp.maximum(state.tail_key, w_end)))
  if lay.eviction_clock:
    state = rebase_clock(state)

  def rekey(ranked=False):
    return _rekey_queue(lay, state, lambda blocks: policy.priority(lay, state, blocks), ranked)

  active = getattr(policy, "active", None)
  if lay.eviction_clock:  # a clock policy is always active
    qk0, ranked = rekey(ranked=True)
    on_clock = getattr(policy, "clock_priority", None)  # what the clock may rise to (`tuned`)
    ranked = ranked if on_clock is None else on_clock(state, ranked)
    state = state.replace(block_aux=BlockAux(state.block_aux).set(evict_ranked=ranked))
  elif active is None:
    qk0 = rekey()
  else:  # the cond returns only the queue row (a cond over the whole state copies its leaves)
    qk0 = jax.lax.cond(active(state), rekey, lambda: state.free_key)
  return state.replace(queue_key=QueueKeys(state.queue_key).set(free=qk0))


def select_victim(queue_key: jax.Array) -> jax.Array:
  """Next block to reuse: smallest normal-queue key; else the oldest pinned block (demotion).
  `queue_key`: i32[2, NB] (`CacheState.queue_key`, rows `QueueKeys`)."""
  queues = QueueKeys(queue_key)
  has_normal = jnp.any(queues.free < BIG)
  free, pinned = jnp.argmin(queues.free), jnp.argmin(queues.pinned)
  return jnp.where(has_normal, free, pinned).astype(jnp.int32)
