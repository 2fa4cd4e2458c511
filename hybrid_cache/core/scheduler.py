"""The jitted entry points of the core: one function per host action, state donated.

`schedule_step` runs one scheduler step over a padded batch of entries, in list order, in ONE jitted
call: entries run sequentially (a `lax.fori_loop` over `step.schedule_entry`), so a later entry sees
the keys an earlier one registered in the same step (same-step rule, vLLM §2.4.6). The rules live in
the modules named after them:

  lookup        `coordinator` (per-kind finders in `groups/`)
  chunk split   `split` (§4.3)
  allocation    `allocate` (skipped blocks, allocate_slots, copy-on-write; §2.1-§2.5)
  key caching   `cache_keys` (§1.7, retention §2.3.4 / §2.4.7)
  admission     `admission` (blocks needed, skipped blocks)
  release       `release` (free / preempt, pinning SPEC B1)
  results       `outputs` (one packed int32 array per call)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.config import CacheConfig
from hybrid_cache.core import block_index
from hybrid_cache.core import block_pool
from hybrid_cache.core import compile_cache
from hybrid_cache.core import coordinator
from hybrid_cache.core import eviction
from hybrid_cache.core import release as release_lib
from hybrid_cache.core.allocate import release_cows
from hybrid_cache.core.block_pool import free_counts
from hybrid_cache.core.layout import layout
from hybrid_cache.core.outputs import entry_columns
from hybrid_cache.core.outputs import pack_entry
from hybrid_cache.core.outputs import pack_lookup
from hybrid_cache.core.outputs import pack_stats
from hybrid_cache.core.outputs import pack_step
from hybrid_cache.core.outputs import stats
from hybrid_cache.core.state import BIG
from hybrid_cache.core.state import STATUS_EMPTY
from hybrid_cache.core.state import STATUS_WAITING
from hybrid_cache.core.state import BlockAux
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import Counters
from hybrid_cache.core.state import QueueKeys
from hybrid_cache.core.state import QueueOrder
from hybrid_cache.core.state import ReqInfo
from hybrid_cache.core.step import StepCarry
from hybrid_cache.core.step import StepInput
from hybrid_cache.core.step import schedule_entry


@compile_cache.entry_point(donate_argnums=(0,))
def schedule_step(config: CacheConfig, state: CacheState, slots, max_tokens, valid):
  """One scheduler step over padded entries (i32[E], i32[E] (-1 = no cap), bool[E]).

  The entries run in order up to the last valid one (padding after it costs no step time);
  an invalid entry before it is a no-op.

  Returns (state, packed i32[E + 1, K]); decode with `outputs.unpack_step`.
  """
  lay = layout(config)
  state = block_pool.maybe_renormalise(state)
  state = state.replace(counters=Counters(state.counters).add(clock=1))
  state = eviction.prepare(lay, state)

  # the entries run in a while loop up to the last valid one, so padding entries cost nothing
  # and one padded size serves every batch up to it (`step_entries`: one program per compile
  # key for most callers); each entry's outputs are packed into one row of `rows`
  count = jnp.max(jnp.where(valid, jnp.arange(valid.shape[0]) + 1, 0))
  rows0 = jnp.zeros((valid.shape[0], entry_columns(lay).width), jnp.int32)

  def body(i, carry_rows):
    carry, rows = carry_rows
    keys = None
    if lay.caching:  # the entry's query keys and their buckets: shared by lookup and insert
      qk, grp = coordinator.query_keys(lay, carry.state.req_hashes[slots[i]])
      keys = (qk, block_index.bucket_of(qk, grp, lay.buckets))
    x = StepInput(slots[i], max_tokens[i], valid[i], keys)
    carry, out = schedule_entry(lay, carry, x)
    return carry, rows.at[i].set(pack_entry(lay, out))

  # the free counts are computed once and carried from entry to entry (updated by touches,
  # pops and releases) instead of one pool reduction per entry
  carry = StepCarry(state, state.max_batched_tokens, free_counts(lay, state))
  carry, rows = jax.lax.fori_loop(0, count, body, (carry, rows0))
  state = carry.state
  if lay.partial:  # every entry's copy-on-write pairs (`outputs.EntryColumns.cows`)
    cows = rows[:, entry_columns(lay).cows].reshape(rows.shape[0], lay.num_groups, 2)
    state = release_cows(lay, state, cows)
  return state, pack_step(lay, rows, stats(lay, state))


@compile_cache.entry_point()
def lookup_only(config: CacheConfig, state: CacheState, hashes, num_tokens):
  """Read-only lookup for a fresh request (hashes u32[MH, 2]).

  Returns i32[2 + 2G] (`outputs.pack_lookup`; host side `outputs.unpack_lookup`).
  """
  lay = layout(config)
  lk = coordinator.lookup(lay, state, hashes, num_tokens)
  return pack_lookup(lk).astype(jnp.int32)


@compile_cache.entry_point(donate_argnums=(0,))
def write_request(config: CacheConfig, state: CacheState, slot, hashes, num_tokens, num_prompt):
  """Jitted `register_request` plus the pool counters."""
  state = register_request(state, slot, hashes, num_tokens, num_prompt)
  return state, pack_stats(layout(config), stats(layout(config), state))


@compile_cache.entry_point(donate_argnums=(0,))
def write_requests_only(
  config: CacheConfig, state: CacheState, slots, hashes, num_tokens, num_prompt
) -> CacheState:
  """Jitted `register_requests` alone: the rows of several requests in one call (the host
  manager's write, `JaxCacheManager._flush`). It changes no pool counter (only `req_info` and
  `req_hashes`), so the host keeps its counters and needs no device read."""
  del config  # only the compile key: one jitted function per state layout
  return register_requests(state, slots, hashes, num_tokens, num_prompt)


def register_requests(state: CacheState, slots, hashes, num_tokens, num_prompt) -> CacheState:
  """`register_request` for K distinct slots at once; pure.

  slots i32[K] (-1 = an unused entry: nothing written), hashes u32[K, MH, 2], num_tokens and
  num_prompt i32[K]. Equal to K calls of `register_request` in any order (the slots differ)."""
  r = state.req_info.shape[0]
  idx = jnp.where(slots >= 0, slots, r)  # out of range: the write is dropped
  info = ReqInfo(state.req_info[jnp.clip(slots, 0, r - 1)])
  status = jnp.where(info.status == STATUS_EMPTY, STATUS_WAITING, info.status)
  rows = info.set(status=status, tokens=num_tokens, prompt=num_prompt)
  return state.replace(
    req_info=state.req_info.at[idx].set(rows, mode="drop"),
    req_hashes=state.req_hashes.at[idx].set(hashes, mode="drop"),
  )


def register_request(state: CacheState, slot, hashes, num_tokens, num_prompt) -> CacheState:
  """Registers a waiting request in `slot` (or updates tokens of an existing one); pure."""
  info = ReqInfo(state.req_info[slot])
  status = jnp.where(info.status == STATUS_EMPTY, STATUS_WAITING, info.status)
  info = info.set(status=status, tokens=num_tokens, prompt=num_prompt)
  return state.replace(
    req_info=state.req_info.at[slot].set(info), req_hashes=state.req_hashes.at[slot].set(hashes)
  )


def admit_one(config: CacheConfig, state: CacheState, slot, max_tokens):
  """One scheduler step with a single entry (no padding): the unit of a trace scan."""
  lay = layout(config)
  state = state.replace(counters=Counters(state.counters).add(clock=1))
  state = eviction.prepare(lay, state)
  carry, out = schedule_entry(
    lay,
    StepCarry(state, state.max_batched_tokens, free_counts(lay, state)),
    StepInput(slot, max_tokens, jnp.bool_(True)),
  )
  state = carry.state
  if lay.partial:
    state = release_cows(lay, state, out["cows"][None])
  return state, out


@compile_cache.entry_point(donate_argnums=(0,))
def release_request(config: CacheConfig, state: CacheState, slot, preempt):
  """Jitted `release` plus the pool counters after it (`preempt` a traced bool: one program
  for finishing and preempting)."""
  lay = layout(config)
  state = release_lib.release(lay, state, slot, preempt)
  return state, pack_stats(lay, stats(lay, state))


@compile_cache.entry_point(donate_argnums=(0,))
def reset_prefix_cache(config: CacheConfig, state: CacheState):
  """Drops every key if no block is held; pinned-tier blocks return to the normal tail."""
  lay = layout(config)
  nb = lay.num_blocks
  # the key-less blocks keep their queue order: the lazy part ordered first (`eviction`)
  state = eviction.complete_order(lay, state)
  ok = block_pool.num_free(state) == state.num_real_blocks - 1  # the real pool
  pinned = state.pinned_key < BIG
  order = jnp.argsort(jnp.where(pinned, state.pinned_key, BIG))
  rank = jnp.zeros((nb,), jnp.int32).at[order].set(jnp.arange(nb, dtype=jnp.int32))
  k0 = jnp.where(pinned, state.tail_key + rank, state.free_key)
  new = state.replace(
    queue_key=QueueKeys.stack(free=k0, pinned=jnp.full((nb,), BIG, jnp.int32)),
    block_group=jnp.full_like(state.block_group, -1),
    # every column of the layout at its no-key value, as `init_state` (the clock itself stays)
    block_aux=jnp.broadcast_to(
      jnp.asarray(BlockAux.no_key(lay.chain_features, lay.eviction_clock, lay.access_history)),
      state.block_aux.shape,
    ),
    index_entry=jnp.full_like(state.index_entry, -1),
    queue_order=(
      QueueOrder(state.queue_order).set(recency=jnp.where(pinned, k0, state.free_recency))
      if lay.rekeys
      else state.queue_order
    ),
    counters=Counters(state.counters).add(tail_key=jnp.sum(pinned).astype(jnp.int32)),
  )
  state = jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, state)
  return state, ok, pack_stats(lay, stats(lay, state))


@compile_cache.entry_point()
def free_queue_keys(config: CacheConfig, state: CacheState):
  """i32[NB]: the normal free queue's keys in its exact order (`free_key` with a re-keyed
  queue's lazy part ordered, `eviction.complete_order`; BIG = not queued). Read-only."""
  return eviction.complete_order(layout(config), state).free_key


@compile_cache.entry_point()
def pool_stats(config: CacheConfig, state: CacheState):
  lay = layout(config)
  return pack_stats(lay, stats(lay, state))
