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

import jax
import jax.numpy as jnp

from hybrid_cache.core.state import C_STEP
from hybrid_cache.core.state import P_MAX_BATCHED
from hybrid_cache.core.state import P_MAX_MODEL_LEN
from hybrid_cache.core.state import RG_LEN
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import Layout
from hybrid_cache.core.state import cdiv


def skipped_blocks(spec, tokens) -> jax.Array:
  """Leading blocks of a group no longer needed once `tokens` are computed."""
  bs = spec.block_size
  if spec.kind == "swa":
    return jnp.maximum(tokens - spec.window + 1, 0) // bs
  if spec.kind == "mamba" and spec.mode != "none":
    return jnp.maximum(tokens - 1, 0) // bs
  return jnp.zeros_like(tokens)


def blocks_needed(
  lay: Layout,
  config,
  state: CacheState,
  r,
  is_new,
  hit,
  hit_ids,
  need_tokens,
  main_tokens,
  swa_cap: bool = False,
):
  """(count i32, impossible bool): blocks to allocate for request slot `r`.

  `hit_ids` i32[G, MB]: hit blocks kept after skipping (0 elsewhere; all 0 for running ones).
  `swa_cap`: cap SWA groups at their per-request worst case (the full-sequence gate).
  """
  rg = state.req_group[r]
  s = lay.num_spec_blocks
  total = jnp.int32(0)
  impossible = jnp.bool_(False)
  # hit blocks with ref 0 of every group in one [G, MB] reduction (not one per group)
  evictable_all = jnp.sum((hit_ids > 0) & (state.ref_cnt[hit_ids] == 0), axis=1).astype(jnp.int32)
  for g, spec in enumerate(lay.groups):
    bs = spec.block_size
    length = rg[g, RG_LEN]
    # with partial hits (§2.5) a hit may end inside a block: cdiv(hit, bs) hit entries
    hits_len = jnp.where(is_new, cdiv(hit, bs) if lay.partial else hit // bs, 0)
    # +1 copy-on-write block for a hit ending inside this group's block (a new request) or a
    # recurrent partial entry still on the running block (the request that registered it)
    part = jnp.int32(0)
    if lay.partial:
      part = (is_new & (hit % bs != 0) & (hit > 0)).astype(jnp.int32)
      if spec.kind == "mamba" and spec.mode == "align":
        part = part | (~is_new & (state.req_partial[r, g] > 0)).astype(jnp.int32)
    ids = hit_ids[g]
    evictable = evictable_all[g]
    if spec.kind == "mamba":
      # Same-step rule (§2.4.6) lives in the recurrent manager, whatever its mode: a hit whose
      # last state block's key was cached during this scheduling step, by that block or by any
      # other (vLLM keeps `cached_blocks_this_step` by hash: a duplicate registered by another
      # request of the step refuses the hit too), has not been computed yet.
      last = ids[jnp.maximum(hits_len - 1, 0)]
      step = state.counters[C_STEP]
      same_key = (state.block_group == state.block_group[last]) & jnp.all(
        state.block_hash == state.block_hash[last][None, :], axis=1
      )
      same_step = (state.block_aux[last, 0] == step) | jnp.any(
        same_key & (state.block_aux[:, 0] == step)
      )
      impossible |= is_new & (hit > 0) & (last > 0) & same_step
    if spec.kind == "mamba" and spec.mode == "align":
      req = cdiv(main_tokens, bs) + s
      k = req - hits_len - length
      if lay.partial:
        k = jnp.where(part > 0, jnp.maximum(k, 0) + 1, k)
      first = jnp.where(length == 0, 1 + s, 1)
      if lay.partial:
        first = first + part
      k = jnp.where(k > 0, jnp.minimum(k, first), 0)  # vLLM's physical block cap
    elif spec.kind == "mamba" and spec.mode == "none":
      k = jnp.where(length == 0, 1 + s, 0)
    else:
      extra = bs * s if spec.kind == "mamba" else 0
      target = cdiv(need_tokens + extra, bs)
      if swa_cap and spec.kind == "swa":
        # min(W - 1 + max_num_batched_tokens, max_model_len) without int32 overflow
        budget, mml = state.params[P_MAX_BATCHED], state.params[P_MAX_MODEL_LEN]
        bound = cdiv(jnp.minimum(budget, mml - (spec.window - 1)) + (spec.window - 1), bs)
        target = jnp.minimum(target, bound + 1)
      skip = skipped_blocks(spec, hit)
      k_new = jnp.maximum(target - jnp.maximum(skip, hits_len), 0)
      k_run = jnp.maximum(target - length, 0)
      k = jnp.where(is_new, k_new, k_run)
      if lay.partial:
        k = k + part
    total = total + k + evictable
  return total, impossible
