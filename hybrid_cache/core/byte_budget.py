"""One byte budget shared by the two pools (`CacheConfig.byte_budget`; beyond vLLM).

With `state_slots` the KV pages and the recurrent-state slots are two id ranges (`block_pool`);
without a budget each is limited by its ids, a fixed split of the bytes
(`pools.split_byte_budget`). With `byte_budget` both draw on one budget, as KV and checkpoints
do in the simulator's `UnitCache`, so that neither a state is padded to a page nor a split has
to be guessed:

* A block *occupies* `page_bytes` (ids [1, first_slot)) or `slot_bytes` (ids [first_slot,
  num_real_blocks)) while it is held (ref > 0) or carries a key (cached); a free block without
  a key, the null block and the padding ids occupy nothing. Invariant: the occupied bytes never
  exceed the budget after a call.
* Admission (`fits`): an entry's blocks per pool (hit blocks with ref 0 included, as vLLM
  counts them, §4.2), at their costs, plus the watermark's pages, fit the budget less what the
  held blocks occupy (cached free blocks can always be evicted). The per-pool id checks of
  `step.schedule_entry` still apply; size the ids so that they never bind first
  (`pools.shared_byte_budget`).
* Eviction (`enforce`, after an entry's pops): while the occupied bytes exceed the budget, the
  first cached free block in free-queue order loses its keys (`block_index.evict`): the normal
  queue first, then the pinned tier oldest first, both pools in their shared key order (so an
  eviction policy's re-keyed order, `eviction.prepare`, applies too). The block keeps its place
  in its queue. Popping itself evicts as vLLM does (a popped cached block loses its key), so
  this only adds the evictions that bytes, not ids, require.

Twin: `twin/byte_budget.py` (`fits`: the byte check, `enforce`).
All functions are pure and jittable; they are traced only when `Layout.byte_budget`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.core import block_index
from hybrid_cache.core import eviction
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.state import BIG
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import Counters
from hybrid_cache.core.state import QueueKeys

_SEARCH_STEPS = 32  # bisection steps over int32 queue keys


def costs(state: CacheState) -> jax.Array:
  """i32[NB]: what each id occupies when held or cached (0: null block, padding)."""
  ids = jnp.arange(state.ref_cnt.shape[0], dtype=jnp.int32)
  real = (ids > 0) & (ids < state.num_real_blocks)
  return jnp.where(real, jnp.where(ids >= state.first_slot, state.slot_bytes, state.page_bytes), 0)


def held_bytes(state: CacheState) -> jax.Array:
  """i32: bytes the held blocks (ref > 0) occupy."""
  return jnp.sum(jnp.where(state.ref_cnt > 0, costs(state), 0)).astype(jnp.int32)


def occupied_bytes(state: CacheState) -> jax.Array:
  """i32: bytes the held and the cached blocks occupy."""
  on = (state.ref_cnt > 0) | (state.block_group >= 0)
  return jnp.sum(jnp.where(on, costs(state), 0)).astype(jnp.int32)


def fits(state: CacheState, held: jax.Array, need: jax.Array, watermark) -> jax.Array:
  """bool: `need` (i32[2]: pages, state slots) plus `watermark` pages fit the budget beside
  `held` (`held_bytes(state)`)."""
  want = (need[0] + watermark) * state.page_bytes + need[1] * state.slot_bytes
  return held + want <= state.byte_budget


def _first_covering(keys: jax.Array, cand: jax.Array, cost: jax.Array, need) -> jax.Array:
  """bool[NB]: the candidates with the smallest keys whose costs first sum to >= `need` (all
  candidates if they sum to less; none if need <= 0). Keys of candidates are unique int32
  values below BIG, so the prefix is {key <= t} for the smallest such t (bisection)."""
  lo = jnp.min(jnp.where(cand, keys, BIG))
  hi = jnp.max(jnp.where(cand, keys, -BIG))

  def covered(t):
    return jnp.sum(jnp.where(cand & (keys <= t), cost, 0)) >= need

  def step(_, bounds):
    lo, hi = bounds
    mid = lo + (hi - lo) // 2
    ok = covered(mid)
    return jnp.where(ok, lo, mid + 1), jnp.where(ok, mid, hi)

  t, _ = jax.lax.fori_loop(0, _SEARCH_STEPS, step, (lo, hi))
  return cand & (keys <= t) & (need > 0)


def enforce(lay: Layout, state: CacheState) -> CacheState:
  """Evicts cached free blocks in free-queue order until the occupied bytes fit the budget
  (module docstring); the state unchanged when they fit. Evicted recurrent states count in
  `CacheState.states_evicted`, as those evicted by a pop do."""

  over = occupied_bytes(state) - state.byte_budget

  def evict(state):
    cost = costs(state)
    cached_free = (state.ref_cnt == 0) & (state.block_group >= 0)
    if eviction.lazy(lay):  # the walk must not reach the lazy part of the queue unordered
      ahead = cached_free & (state.free_key < state.order_exact)
      short = jnp.sum(jnp.where(ahead, cost, 0)) < over
      state = eviction.complete_order(lay, state, short)
    qk = QueueKeys(state.queue_key)
    first = _first_covering(qk.free, cached_free & (qk.free < BIG), cost, over)
    left = over - jnp.sum(jnp.where(first, cost, 0))
    pinned = _first_covering(qk.pinned, cached_free & (qk.pinned < BIG), cost, left)
    gone = first | pinned
    rec = jnp.isin(state.block_group, jnp.asarray(lay.recurrent_groups, jnp.int32))
    n_rec = jnp.sum(gone & rec).astype(jnp.int32)
    state = state.replace(counters=Counters(state.counters).add(states_evicted=n_rec))
    return block_index.evict(state, gone)

  return jax.lax.cond(over > 0, evict, lambda s: s, state)
