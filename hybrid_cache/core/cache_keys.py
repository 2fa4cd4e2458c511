"""Key registration after allocation (vLLM §1.7 `cache_blocks`, §2.3.4 / §2.4.7 retention).

`cache_blocks` registers the hashes of a request's blocks optimistically up to the scheduler-block
floor of its computed tokens, with the retention masks of the recurrent and window groups; in a
recurrent group the placement policy decides which state blocks are kept and the admission
policy which of those are registered, and a retirement policy observes the kept ones (seams of
`hybrid_cache.policies`);
`cache_partial_tail` registers the prompt-tail entry at floor(num_prompt / HBS) * HBS
(`_cache_partial_tail_block`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_cache import policies
from hybrid_cache.core import access_history
from hybrid_cache.core import block_index
from hybrid_cache.core import coordinator
from hybrid_cache.core import groups
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.state import BlockAux
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import Counters
from hybrid_cache.core.state import ReqGroup
from hybrid_cache.core.state import ReqInfo
from hybrid_cache.core.state import floor_to


class PlacementRequest(NamedTuple):
  """What a stateful placement policy (and a retirement policy's `observe`) reads of one
  request's registration call, one recurrent group (`hybrid_cache.policies`, seams `placement`
  and `retirement`; twin `twin.cache_keys.PlacementRequest`).

  Attributes:
    admitted: bool, this call admits the request (its first allocation, `ok`).
    hit: i32, the hit tokens of the admission (0 otherwise).
    spb: i32, the request's shared-prefix boundary (`req_spb`, 0 = none).
    prompt: i32, prompt tokens.
    tokens: i32, tokens known (prompt + output so far).
    computed: bool[MB], the group's blocks this call registers up to (positions from the
      group's `ncached` to the registration floor; masked by `ok`), before any mask.
    keys: u32[MB, 2], the group's block keys.
  """

  admitted: jax.Array
  hit: jax.Array
  spb: jax.Array
  prompt: jax.Array
  tokens: jax.Array
  computed: jax.Array
  keys: jax.Array


def cache_blocks(
  lay: Layout, state: CacheState, r, computed, ok=True, keys=None, info=None, is_new=False, hit=0
):
  """Registers keys of request `r`'s full blocks up to the scheduler-block floor (§1.7).

  Nothing is written when `ok` (bool) is False. `keys` (optional): the request's
  (`coordinator.query_keys`, their buckets), precomputed. `info` (optional): the request's
  `req_info` row (read from the state when not given). `is_new`, `hit`: the call admits the
  request with this hit (read only by a stateful placement policy, `PlacementRequest`).
  """
  if not lay.caching:
    return state
  if info is None:
    info = state.req_info[r]
  req = ReqInfo(info)
  raw = jnp.minimum(computed, req.tokens)
  # with partial hits (§1.7, §2.5) the cached tokens are not floored to the scheduler block
  nc = raw if lay.partial else floor_to(raw, lay.sbs)
  pos = jnp.arange(lay.max_blocks)
  hashes = state.req_hashes[r]
  boundaries = (req.prompt - 1, req.spb)
  if lay.fine_key_groups:  # beyond vLLM: also the scheduler-block states vLLM keeps there
    boundaries += tuple(floor_to(b, lay.sbs) for b in boundaries)
  all_ids, all_keys, all_groups, all_ends, all_prom, n_g = [], [], [], [], [], []
  all_chain = []
  rg = state.req_group[r]  # the request's `req_group` row, updated group by group
  placement = policies.core_policy("placement", lay.config.placement)
  admission = policies.core_policy("admission", lay.config.admission)
  # `policy_state`: the admission policy's columns, then a stateful placement's, then a
  # retirement policy's (`fresh_state.policy_columns`)
  table = state.policy_state
  if lay.access_history:  # the history's columns come last (`fresh_state.policy_columns`):
    # the other policies' part here, put back with the (updated) history's at the end
    hist = access_history.width(lay.max_requests, lay.num_groups)
    table = table[:, : table.shape[1] - hist]
  retirement = policies.core_policy("retirement", lay.config.retirement)
  if retirement is not None:  # its columns come last (`fresh_state.policy_columns`)
    width = retirement.state_size(lay)
    table, retired = table[:, : table.shape[1] - width], table[:, table.shape[1] - width :]
  stateful = placement is not None and hasattr(placement, "state_size")
  if stateful:
    split = admission.STATE_SIZE if admission is not None else 0
    table, placed = table[:, :split], table[:, split:]
  for g, spec in enumerate(lay.groups):
    bs = spec.block_size
    kind = groups.rules(spec)
    eagle = kind.eagle_lookahead(spec)
    upto = (jnp.minimum(raw, nc + bs) if eagle else nc) // bs
    row = state.tables[r, g]
    nca = ReqGroup(rg)[g].ncached
    unkeyed = state.block_group[row] < 0
    if g in lay.tail_groups:  # partial -> full promotion (§2.5): a shorter key is replaced
      promote = ~unkeyed & (BlockAux(state.block_aux)[row].key_end < (pos + 1) * bs)
      all_prom.append(jnp.where(promote & (pos >= nca) & (pos < upto) & (row > 0) & ok, row, 0))
      unkeyed = unkeyed | promote
    mask = kind.cache_mask(spec, pos, lay.hit_align, state.retention_interval, boundaries)
    mb = lay.max_blocks
    if keys is None:
      all_keys.append(coordinator.group_hashes(lay, hashes, req.tokens, g)[0])
    gkeys = all_keys[-1] if keys is None else keys[0][g * mb : (g + 1) * mb]
    if g in lay.recurrent_groups and (stateful or retirement is not None):
      preq = PlacementRequest(
        admitted=is_new & ok,
        hit=jnp.where(is_new, hit, 0),
        spb=req.spb,
        prompt=req.prompt,
        tokens=req.tokens,
        computed=(pos >= nca) & (pos < upto) & ok,
        keys=gkeys,
      )
    if g in lay.recurrent_groups and stateful:  # reads the group's keys, before its mask
      placed, mask = placement.keep(lay, r, g, pos, boundaries, mask, placed, preq)
    elif g in lay.recurrent_groups and placement is not None:
      mask = placement.keep(lay, r, g, pos, boundaries, mask)
    offered = (pos >= nca) & (pos < upto) & (row > 0) & ok & mask
    if g in lay.recurrent_groups and retirement is not None:  # the points this call keeps
      retired = retirement.observe(lay, r, g, pos, retired, preq, offered)
    sel = offered & unkeyed
    if g in lay.recurrent_groups and admission is not None:
      table, admitted = admission.admit(lay, table, g, gkeys, offered)
      sel &= admitted
    all_ids.append(jnp.where(sel, row, 0))
    all_groups.append(jnp.full((lay.max_blocks,), g, jnp.int32))
    all_ends.append((pos + 1) * bs)
    if lay.chain_features and g in lay.recurrent_groups:
      # chain start: the previous kept state, this call's or the request's
      chain, last = _state_chain(sel, (pos + 1) * bs, ReqGroup(rg)[g].chain)
      all_chain.append(chain)
      rg = ReqGroup(rg)[g].set(chain=last)
    elif lay.chain_features:  # chain start: the block's first token
      all_chain.append(pos * bs)
    rg = ReqGroup(rg)[g].set(ncached=jnp.where(ok, jnp.maximum(nca, upto), nca))
    if lay.tail_groups:
      n_g.append(jnp.minimum(raw, nc + bs) if eagle else nc)
  ids = jnp.concatenate(all_ids)
  if lay.access_history:  # a key's ghost, read before this call's promotions drop any key
    ghost = access_history.recall(
      state, jnp.concatenate(all_keys) if keys is None else keys[0], jnp.concatenate(all_groups)
    )
  if all_prom:  # every key of a promoted block goes (its extra partial key too)
    prom = jnp.concatenate(all_prom)
    state = block_index.evict_ids(state, prom, scan_all=True)
  if keys is None:
    state = block_index.insert(state, ids, jnp.concatenate(all_keys), jnp.concatenate(all_groups))
  else:  # the same keys, groups and buckets (group-major, `coordinator.query_keys`)
    state = block_index.insert(state, ids, keys[0], jnp.concatenate(all_groups), keys[1])
  for g in lay.fine_key_groups:
    state = fine_key_entries(lay, state, hashes, g, all_ids[g])
  nb = lay.num_blocks
  sidx = jnp.where(ids > 0, ids, nb)
  ends = jnp.concatenate(all_ends)
  # registration step and token end of each registered block, with the chain features hits (0)
  # and chain start, with the eviction clock stamp (the clock) and ranked priority (0), with the
  # access history last access (now), penultimate (the request's inherit or the key's ghost,
  # the later) and KV owner (none): ONE [k, 2..9] scatter
  penult = jnp.maximum(access_history.inherit(state, r), ghost) if lay.access_history else None
  cols, vals = _key_columns(
    lay, state, ends, jnp.concatenate(all_chain) if all_chain else None, penult
  )
  aux = state.block_aux.at[sidx[:, None], cols[None, :]].set(vals, mode="drop")
  counters = state.counters
  if lay.recurrent_groups:
    n_rec = sum(jnp.sum(all_ids[g] > 0) for g in lay.recurrent_groups).astype(jnp.int32)
    counters = Counters(counters).add(states_admitted=n_rec)
  state = state.replace(block_aux=aux, req_group=state.req_group.at[r].set(rg), counters=counters)
  if stateful:
    table = jnp.concatenate([table, placed], axis=1)
  if retirement is not None:
    table = jnp.concatenate([table, retired], axis=1)
  if lay.access_history:
    table = jnp.concatenate([table, state.policy_state[:, table.shape[1] :]], axis=1)
  if stateful or admission is not None or retirement is not None:
    state = state.replace(policy_state=table)
  if lay.tail_groups:
    state = cache_partial_tail(lay, state, r, n_g, ok, info)
  return state


def _key_columns(lay: Layout, state: CacheState, ends, chain, penult):
  """(i32[c] columns, i32[k, c] values) a registration writes for k blocks with token ends
  `ends`: step and end; with the chain features hits 0 and `chain`; with the eviction clock the
  clock as stamp and 0 ranked; with the access history last access now, `penult` and no KV
  owner (-1). The columns in `BlockAux` order (one scatter)."""
  zeros = jnp.zeros_like(ends)
  step = state.clock
  names, vals = ["key_step", "key_end"], [zeros + step, ends]
  if lay.chain_features:
    names += ["key_hits", "chain_start"]
    vals += [zeros, chain]
  if lay.eviction_clock:
    names += ["evict_stamp", "evict_ranked"]
    vals += [zeros + state.evict_clock, zeros]
  if lay.access_history:
    names += ["key_last", "key_penult", "kv_owner"]
    vals += [zeros + step, penult, zeros - 1]
  return jnp.asarray(BlockAux.positions(*names), jnp.int32), jnp.stack(vals, axis=1)


def fine_key_entries(lay: Layout, state: CacheState, hashes, g: int, ids) -> CacheState:
  """Beyond vLLM (`CacheConfig.fine_keys`): the full-attention blocks `ids` (i32[MB] by table
  position, 0 = none) of group `g`, just keyed full, get an extra index entry at every
  hash-block boundary inside them: block p (B = s * HBS tokens) under the request's chained
  hash at p * B + j * HBS for j = 1 .. s - 1 (`hashes[p * s + j - 1]`), in block then boundary
  order. A phase-2 lookup (`partial._full_find_fine`) then finds a hit ending inside any cached
  full block, not only at a prompt tail; the entries go with the block's key
  (`block_index.evict_ids(scan_all=True)`)."""
  bs = lay.groups[g].block_size
  s = bs // lay.hash_block_size
  # the table is as wide as the smallest group's block needs (a recurrent block of U: B / U
  # times this group's blocks); only this group's own positions can hold a block (Mooncake,
  # 120 requests, B 512, U 64: 115 s -> 10.5 s per replay, 2026-11-27)
  mb = min(ids.shape[0], lay.config.blocks_per_request(bs))
  ids, mh = ids[:mb], hashes.shape[0]
  k = np.arange(mb)[:, None] * s + np.arange(s - 1)[None, :]  # hash index of each boundary
  # `insert` has just given every id > 0 its key in group g
  ext = jnp.where((ids[:, None] > 0) & jnp.asarray(k < mh), ids[:, None], 0).reshape(-1)
  keys = hashes[np.minimum(k, mh - 1).reshape(-1)]
  return block_index.insert_extra(state, ext, keys, jnp.full(ext.shape, g, jnp.int32))


def _state_chain(sel, ends, prev):
  """(chain starts i32[MB], new `group_chain`) of a recurrent group's registration: each
  selected state's chain start is the end of the previous selected one, the first's `prev` (the
  request's latest kept state); the new `group_chain` is the last selected end (`prev` if none).
  Ends increase with the position, so a running max of the selected ends is the latest one."""
  kept = jnp.where(sel, ends, 0)
  # latest kept end at or before each position. `lax.cummax` (a reduce-window on XLA:CPU), not
  # `lax.associative_scan(jnp.maximum, ...)`: the scan is 2.3x cheaper only over a batch of
  # rows (vmapped over 64 rows, MB=256: 124 vs 289 us), but here one row is scanned per entry
  # inside the step's `lax.scan`, where it is not cheaper (one row in a loop of 2000, MB=64:
  # 0.26 vs 0.29 us, MB=256: 1.43 vs 1.08 us), and bench_scheduler's batch-64 admissions under
  # chain_value do not move (CPU us/request, 5 interleaved runs each, medians 97.2 vs 98.2, load
  # ~3.5; 2026-11-25, XLA:CPU, jax 0.10.2)
  upto = jnp.maximum(jax.lax.cummax(kept), prev)
  before = jnp.concatenate([prev[None], upto[:-1]])
  return before, upto[-1]


def cache_partial_tail(lay: Layout, state: CacheState, r, n_g, ok, info=None) -> CacheState:
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
  # the prompt-tail boundary of each kind (`tail_boundary`): full attention
  # floor((P-1)/HBS)*HBS, recurrent the prompt's checkpoint position
  eagle = any(g.eagle for g in lay.groups)
  bounds = groups.tail_boundaries(ReqInfo(info).prompt, hbs, eagle)
  hashes = state.req_hashes[r]
  ids, ts, chains = [], [], []
  if lay.chain_features:
    chain0 = ReqGroup(state.req_group)[r].chain
  for g in gs:
    spec = lay.groups[g]
    kind = groups.rules(spec)
    t = bounds[kind]
    ts.append(t)
    p, cond = kind.tail_block(spec, t, n_g[g])
    cond &= ok & (t > 0) & (p < ReqGroup(state.req_group)[r, g].length)
    blk = state.tables[r, g, jnp.clip(p, 0, lay.max_blocks - 1)]
    cond = kind.tail_needs_key(state, blk, t, cond)
    ids.append(jnp.where(cond, blk, 0))
    if lay.chain_features:
      # chain start of the entry (`state` docstring): recurrent, the request's latest kept
      # state (which becomes t); else the first token of the block holding t
      recurrent = g in lay.recurrent_groups
      chains.append(chain0[g] if recurrent else p * spec.block_size)
  ids = jnp.stack(ids)
  t = jnp.stack(ts)  # i32[len(gs)]: each group's boundary
  grp = jnp.asarray(gs, jnp.int32)
  keys = hashes[jnp.clip(t // hbs - 1, 0, hashes.shape[0] - 1)]  # u32[len(gs), 2]
  bg = state.block_group[ids]
  primary_same = (bg == grp) & jnp.all(state.block_hash[ids] == keys, axis=-1)
  already = (ids > 0) & (primary_same | block_index.has_entry(state, keys, grp, ids))
  shorter = (ids > 0) & ~already & (bg >= 0) & (BlockAux(state.block_aux)[ids].key_end < t)
  state = block_index.evict_ids(state, jnp.where(shorter, ids, 0), scan_all=True)
  keyed = state.block_group[ids] >= 0
  prim = jnp.where((ids > 0) & ~already & ~keyed, ids, 0)
  extra = jnp.where((ids > 0) & ~already & keyed, ids, 0)
  state = block_index.insert(state, prim, keys, grp)
  state = block_index.insert_extra(state, extra, keys, grp)
  nb = lay.num_blocks
  sidx = jnp.where(prim > 0, prim, nb)
  step = state.clock
  penult = None
  if lay.access_history:  # last = now, penultimate as inherited
    penult = jnp.maximum(access_history.inherit(state, r), access_history.recall(state, keys, grp))
  chain = jnp.stack(chains) if lay.chain_features else None
  cols, vals = _key_columns(lay, state, jnp.zeros_like(prim) + t, chain, penult)
  aux = state.block_aux.at[sidx[:, None], cols[None, :]].set(vals, mode="drop")
  ncached = ReqGroup(state.req_group)[r].ncached
  pend = state.req_partial[r]
  acc = (aux, ncached, pend, jnp.int32(0))
  for i, g in enumerate(gs):
    spec = lay.groups[g]
    acc = groups.rules(spec).tail_pending(spec, g, i, ids, t, prim, extra, step, nb, acc)
  aux, ncached, pend, n_rec = acc
  req_group = ReqGroup(state.req_group)[r].set(ncached=ncached)
  if lay.chain_features:  # a recurrent tail entry is the request's latest kept state
    rec = jnp.asarray([g in lay.recurrent_groups for g in gs]) & (ids > 0)
    chain = chain0.at[grp].set(jnp.where(rec, jnp.maximum(chain0[grp], t), chain0[grp]))
    req_group = ReqGroup(req_group)[r].set(chain=chain)
  return state.replace(
    block_aux=aux,
    req_group=req_group,
    req_partial=state.req_partial.at[r].set(pend),
    counters=Counters(state.counters).add(states_admitted=n_rec),
  )
