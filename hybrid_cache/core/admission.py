"""Admission accounting (vLLM §2.1, §2.4.3, §4.2): blocks an allocation needs, per group.

New request: `max(cdiv(tokens, B) - max(skip, hits), 0)` fresh blocks plus every hit block with
ref 0 (touching takes it out of the free queue). Running request: `max(cdiv(tokens, B) - len, 0)`.
Recurrent `align`: one block (1 + S on the first allocation) when the running-state position
moves. In every recurrent mode, a hit block registered in the current step makes admission
impossible (§2.4.6). With partial hits (§2.5) a hit ending inside a block needs one more block
(the copy-on-write copy), and so does the next allocation of a request whose recurrent partial
entry sits on its running state block.
"""

from __future__ import annotations

import jax.numpy as jnp

from hybrid_cache.core import groups
from hybrid_cache.core.groups.demand import BlockDemand
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import ReqGroup
from hybrid_cache.core.state import cdiv


def blocks_needed(
  lay: Layout,
  state: CacheState,
  r,
  is_new,
  hit,
  hit_ids,
  need_tokens,
  main_tokens,
  swa_cap: bool = False,
):
  """(count, impossible bool): blocks to allocate for request slot `r`: count i32 with one
  pool, i32[2] (pages, state slots; each group counts in `Layout.group_pool`) with two.

  `hit_ids` i32[G, MB]: hit blocks kept after skipping (0 elsewhere; all 0 for running ones).
  `swa_cap`: cap SWA groups at their per-request worst case (the full-sequence gate).
  """
  rg = state.req_group[r]
  totals = [jnp.int32(0)] * lay.num_pools
  impossible = jnp.bool_(False)
  # hit blocks with ref 0 of every group in one [G, MB] reduction (not one per group)
  evictable_all = jnp.sum((hit_ids > 0) & (state.ref_cnt[hit_ids] == 0), axis=1).astype(jnp.int32)
  for g, spec in enumerate(lay.groups):
    kind = groups.rules(spec)
    bs = spec.block_size
    # with partial hits (§2.5) a hit may end inside a block: cdiv(hit, bs) hit entries
    hits_len = jnp.where(is_new, cdiv(hit, bs) if lay.partial else hit // bs, 0)
    # +1 copy-on-write block for a hit ending inside this group's block (a new request) or a
    # recurrent partial entry still on the running block (the request that registered it)
    part = jnp.int32(0)
    if lay.partial:
      part = (is_new & (hit % bs != 0) & (hit > 0)).astype(jnp.int32)
      part = part | kind.own_partial(spec, state, r, g, is_new)
    d = BlockDemand(
      state=state,
      r=r,
      g=g,
      is_new=is_new,
      hit=hit,
      length=ReqGroup(rg)[g].length,
      hits_len=hits_len,
      part=part,
      hit_ids=hit_ids[g],
      need_tokens=need_tokens,
      main_tokens=main_tokens,
      num_spec_blocks=lay.num_spec_blocks,
      partial=lay.partial,
      swa_cap=swa_cap,
    )
    k, refused = kind.blocks_needed(spec, d)
    impossible |= refused
    p = lay.group_pool[g] if lay.state_pool else 0
    totals[p] = totals[p] + k + evictable_all[g]
  return (jnp.stack(totals) if lay.state_pool else totals[0]), impossible
