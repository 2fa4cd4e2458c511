"""Releasing a request's blocks when it finishes or is preempted (vLLM §1.6, SPEC B1).

Pure and jittable; `scheduler.release_request` is the jitted entry point.

Pinning on finish (SPEC B1, `lay.config.pinning`): before a *finished* request's blocks are freed,
the blocks that keep its prefix hittable are flagged pinned, so they join the pinned tier
instead of the normal free tail: every keyed full-attention block, the keyed blocks of each
sliding-window group's last window (the `swa_need` positions ending at its deepest keyed
block) and each recurrent group's deepest keyed state
(`hybrid_cache.twin.rules.finish_pin_indices`).
A *preempted* request pins nothing: it was preempted because allocation failed, it is
re-admitted soon and finds its own blocks at the fresh end of the LRU tail anyway, and pinning
is for cross-request retention (reference §6.1: PR #40676 pins only to keep prefixes for later
requests). Blocks pinned earlier by window drops stay pinned either way.

Retirement on finish (beyond vLLM, seam `retirement` of `hybrid_cache.policies`; default
`none`: nothing, as vLLM 0.33): after a *finished* request's blocks are freed, the policy picks
recurrent state blocks its own deeper checkpoints supersede (`retire`); their keys are dropped
and they move to the free queue's head. At the finish, not at the registration of the deeper
state: the request then holds none of its blocks, so a picked block with ref 0 is held by no
running request (and the request no longer needs the state it hit), and the simulator's unit
cache retires at a request's finish too (`UnitCache.finish`).

History inheritance (an eviction policy with the access history, `Layout.access_history`,
LRU-2): the state that superseded the retired ones keeps their history, as the simulator's
unit cache hands the deepest new checkpoint the latest penultimate access of those it retires
(`UnitCache._retire`): per recurrent group g, the state at position h - 1 of the request's own
chain, h = the units of g a lookup of its own tokens hits (`coordinator.lookup`, as the
retirement policy `superseded` bounds its pick), gets `key_penult` = max(its own, the largest
of the blocks retired in g), if that block still carries that key (`inherit_history`).
"""

from __future__ import annotations

import jax.numpy as jnp

from hybrid_cache import policies
from hybrid_cache.core import access_history
from hybrid_cache.core import block_index
from hybrid_cache.core import block_pool
from hybrid_cache.core import coordinator
from hybrid_cache.core import groups
from hybrid_cache.core import kv_owner
from hybrid_cache.core.fresh_state import policy_columns
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.state import BIG
from hybrid_cache.core.state import STATUS_WAITING
from hybrid_cache.core.state import BlockAux
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import Counters
from hybrid_cache.core.state import ReqGroup
from hybrid_cache.core.state import ReqInfo


def pin_finished(lay: Layout, state: CacheState, slot, enabled=True) -> CacheState:
  """Flags the held blocks that keep request `slot`'s prefix hittable (see module doc), or
  those the retention policy picks (`hybrid_cache.policies`, seam `retention`); nothing where
  `enabled` (a bool, traced or not) is False."""
  pos = jnp.arange(lay.max_blocks)
  rows = [state.tables[slot, g] for g in range(lay.num_groups)]
  keyed = [(row > 0) & (state.block_group[row] >= 0) for row in rows]
  sel = [groups.rules(spec).finish_pin_mask(spec, k, pos) for spec, k in zip(lay.groups, keyed)]
  policy = policies.core_policy("retention", lay.config.retention)
  if policy is not None:
    sel = policy.pin(lay, state, slot, keyed, sel)
  ids = [jnp.where(s & enabled, row, 0) for s, row in zip(sel, rows)]
  return block_pool.pin(state, jnp.concatenate(ids))


def retire(lay: Layout, state: CacheState, slot, enabled=True) -> CacheState:
  """Retires what the retirement policy picks for finishing request `slot` (module doc):
  its blocks already freed, its hashes not yet cleared; nothing where `enabled` (a bool,
  traced or not) is False. Exactness guard, whatever the policy picks: only free blocks (ref
  0, in the normal queue or the pinned tier) whose key is in a recurrent group are retired
  (never a held or attention block); a pinned one is unpinned (superseded, it no longer
  keeps a prefix hittable)."""
  policy = policies.core_policy("retirement", lay.config.retirement)
  adm, place, ret, _ = policy_columns(lay.config, lay)
  off = adm + place
  old = state.policy_state[:, off : off + ret]
  ids, table = policy.pick(lay, state, slot, old)
  table = jnp.where(enabled, table, old)
  state = state.replace(policy_state=state.policy_state.at[:, off : off + ret].set(table))
  safe = jnp.maximum(ids, 0)
  rec = jnp.isin(state.block_group[safe], jnp.asarray(lay.recurrent_groups, jnp.int32))
  free = (state.free_key[safe] < BIG) | (state.pinned_key[safe] < BIG)
  ok = (ids > 0) & enabled & (state.ref_cnt[safe] == 0) & free & rec
  ids = jnp.where(ok, ids, 0)
  if lay.access_history:  # read before the retired keys are dropped
    heirs = _heirs(lay, state, slot, ids)
  state = block_index.evict_ids(state, ids, clear_pinned=True, scan_all=lay.partial)
  state = block_pool.to_head(state, ids)
  if lay.access_history:
    state = inherit_history(lay, state, *heirs)
  n = jnp.sum(ids > 0).astype(jnp.int32)
  return state.replace(counters=Counters(state.counters).add(states_retired=n))


def _heirs(lay: Layout, state: CacheState, slot, ids):
  """(i32[R] blocks, u32[R, 2] keys, i32[R] penultimate accesses): per recurrent group g, the
  block a lookup finds for request `slot`'s own key at position h - 1 of g (h = the units a
  lookup of its own tokens hits; -1 = none), that key, and the largest `key_penult` of the
  blocks `ids` (i32[k], 0 = none) keyed in g (0 = none). Read before `ids` lose their keys."""
  hashes = state.req_hashes[slot]
  tokens = ReqInfo(state.req_info)[slot].tokens
  hit = coordinator.lookup(lay, state, hashes, tokens)["hit"]
  safe = jnp.maximum(ids, 0)
  grp = jnp.where(ids > 0, state.block_group[safe], -1)
  penult = state.key_penult[safe]
  heirs, heir_keys, inherited = [], [], []
  for g in lay.recurrent_groups:
    keys, valid = coordinator.group_hashes(lay, hashes, tokens, g)
    p = hit // lay.groups[g].block_size - 1
    at = jnp.clip(p, 0, lay.max_blocks - 1)
    blk = block_index.probe(state, keys[at], jnp.int32(g))
    heirs.append(jnp.where((p >= 0) & valid[at], blk, -1))
    heir_keys.append(keys[at])
    inherited.append(jnp.max(jnp.where(grp == g, penult, 0), initial=0))
  return (
    jnp.stack(heirs).astype(jnp.int32),
    jnp.stack(heir_keys),
    jnp.stack(inherited).astype(jnp.int32),
  )


def inherit_history(lay: Layout, state: CacheState, heirs, keys, inherited) -> CacheState:
  """Each heir (`_heirs`: i32[R] blocks, -1 = none, u32[R, 2] keys) whose own (primary) key
  is still that key in its recurrent group takes `key_penult` = max(its own, `inherited`
  i32[R]) (module doc)."""
  safe = jnp.maximum(heirs, 0)
  grp = jnp.asarray(lay.recurrent_groups, jnp.int32)
  own = (state.block_group[safe] == grp) & jnp.all(state.block_hash[safe] == keys, axis=-1)
  idx = jnp.where((heirs > 0) & own, safe, lay.num_blocks)
  new = jnp.maximum(state.key_penult[safe], inherited)
  aux = BlockAux(state.block_aux)[idx].set(key_penult=new, mode="drop")
  return state.replace(block_aux=aux)


def release(lay: Layout, state: CacheState, slot, preempt) -> CacheState:
  """Frees a request's blocks tail first (group by group); preempt keeps it waiting.

  With `lay.config.pinning`, a finishing (not preempted) request first pins its hittable prefix;
  with a retirement policy it retires what that picks once its blocks are freed (`retire`).
  `preempt` is a Python bool (the other case is left out of the program) or a traced bool
  (one program for both: `scheduler.release_request`, issue 29).
  """
  static = isinstance(preempt, bool)
  if lay.config.pinning and not (static and preempt):
    state = pin_finished(lay, state, slot, enabled=True if static else ~preempt)
  rows = state.tables[slot][:, ::-1]
  batch = jnp.repeat(jnp.arange(lay.num_groups, dtype=jnp.int32), lay.max_blocks)
  state = block_pool.free_ordered(state, rows.reshape(-1), batch)
  if lay.config.retirement != "none" and not (static and preempt):
    state = retire(lay, state, slot, enabled=True if static else ~preempt)
  if lay.access_history and not (static and preempt):  # after retirement (`core.kv_owner`)
    state = kv_owner.record(lay, state, slot, enabled=True if static else ~preempt)
  rg = ReqGroup(jnp.zeros_like(state.req_group[slot])).set(last=-1)
  info = state.req_info[slot]
  waiting = ReqInfo(info).set(status=STATUS_WAITING, computed=0, spb=0)
  info = jnp.where(preempt, waiting, jnp.zeros_like(info))
  state = state.replace(
    tables=state.tables.at[slot].set(0),
    req_group=state.req_group.at[slot].set(rg),
    req_info=state.req_info.at[slot].set(info),
  )
  if lay.partial:  # a pending recurrent partial entry is dropped with the request (§2.5)
    state = state.replace(req_partial=state.req_partial.at[slot].set(0))
  if lay.access_history:  # the slot inherits nothing until its next admission
    state = access_history.set_inherit(state, slot, 0)
  if not (static and preempt):
    hashes = state.req_hashes[slot]
    state = state.replace(
      req_hashes=state.req_hashes.at[slot].set(jnp.where(preempt, hashes, jnp.zeros_like(hashes)))
    )
  return state
