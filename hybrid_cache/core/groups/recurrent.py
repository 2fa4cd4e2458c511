"""Recurrent groups (Mamba2/GDN, vLLM §2.4): one state block exactly at the hit boundary."""

from __future__ import annotations

import jax.numpy as jnp

from hybrid_cache.core import block_pool
from hybrid_cache.core.groups.demand import BlockDemand
from hybrid_cache.core.groups.demand import grow_to
from hybrid_cache.core.groups.demand import target_blocks
from hybrid_cache.core.state import C_STEP
from hybrid_cache.core.state import RG_LAST
from hybrid_cache.core.state import cdiv
from hybrid_cache.core.state import floor_to


def find(cached, cap, bs: int, alignment: int):
  """Rightmost cached block i < cap//bs whose right edge is a multiple of `alignment`.

  Returns (L, lo) = ((i+1)*bs, i), or (0, 0) when none. No EAGLE drop for recurrent groups.
  """
  pos = jnp.arange(cached.shape[0])
  ok = cached & (pos < cap // bs) & (((pos + 1) * bs) % alignment == 0)
  i = jnp.max(jnp.where(ok, pos, -1))
  return ((i + 1) * bs).astype(jnp.int32), jnp.maximum(i, 0).astype(jnp.int32)


def find_hit(lay, spec, need: int, cached, cap, drop):
  """The coordinator's finder (the uniform signature of `groups.rules`; no EAGLE drop)."""
  return find(cached, cap, spec.block_size, lay.sbs)


def valid_ends(spec, need: int, cached, cs, aligned, lead):
  """bool[MB]: where a hit may end: aligned cached state blocks."""
  return cached & aligned


def skipped_blocks(spec, tokens):
  """Leading blocks no longer needed once `tokens` are computed: all but the latest state
  ((c - 1) // B), except in mode none (one block, overwritten in place)."""
  if spec.mode == "none":
    return jnp.zeros_like(tokens)
  return jnp.maximum(tokens - 1, 0) // spec.block_size


def finish_pin_mask(spec, keyed, pos):
  """Blocks a finished request pins (SPEC B1): its deepest keyed state."""
  deepest = jnp.max(jnp.where(keyed, pos, -1))
  return keyed & (pos > deepest - 1)


def retention_mask(pos, bs, align, retention, boundaries):
  """bool[MB]: recurrent states worth caching (vLLM §2.4.7).

  `retention` (traced i32 from `CacheState.params`, or a Python int / None): < 0 or None =
  dense (every state), 0 = replay boundaries only, k * sbs = one state per `retention` tokens
  plus the boundaries. `align`: the hit alignment the boundaries are floored to (the hash block
  with partial hits, else the scheduler block; vLLM `reachable_block_mask`).
  """
  retention = -1 if retention is None else retention  # RETENTION_NONE
  per = retention // bs
  dense = (retention < 0) | ((retention > 0) & (per <= 1))
  mask = dense | ((retention > 0) & ((pos + 1) % jnp.maximum(per, 1) == 0))
  for b in boundaries:
    mask |= (b > 0) & (pos == floor_to(b, align) // bs - 1)
  return mask


def frees_skipped(spec) -> bool:
  """Whether a running request releases superseded state blocks: yes unless mode none (one
  block, overwritten in place)."""
  return spec.mode != "none"


def before_skipped_free(config, state, spec, row, drop, k, j0):
  """Nothing is pinned when states are superseded."""
  return state


def after_skipped_free(state, spec, r, g, row, c):
  """Mode align (vLLM §2.4.4): the previous running-state block (`RG_LAST`) is freed a step
  later, once `c` computed tokens have moved past its block. Returns (state, row)."""
  if spec.mode != "align":
    return state, row
  pos = jnp.arange(row.shape[0])
  ls = state.req_group[r, g, RG_LAST]
  due = (ls >= 0) & (ls < cdiv(c, spec.block_size) - 1)
  blk = jnp.where(due, row[jnp.maximum(ls, 0)], 0)
  state = block_pool.free_ordered(state, blk[None], jnp.zeros((1,), jnp.int32))
  row = jnp.where(due & (pos == ls), 0, row)
  state = state.replace(req_group=state.req_group.at[r, g, RG_LAST].set(jnp.where(due, -1, ls)))
  return state, row


def own_partial(spec, state, r, g, is_new):
  """Mode align with partial hits: the request's own partial entry still on its running
  block needs a copy-on-write block at its next allocation (§2.5)."""
  if spec.mode != "align":
    return jnp.int32(0)
  return (~is_new & (state.req_partial[r, g] > 0)).astype(jnp.int32)


def _same_step(d: BlockDemand):
  """Same-step rule (§2.4.6), whatever the mode: a hit whose last state block's key was cached
  during this scheduling step, by that block or by any other (vLLM keeps
  `cached_blocks_this_step` by hash: a duplicate registered by another request of the step
  refuses the hit too), has not been computed yet."""
  state = d.state
  last = d.hit_ids[jnp.maximum(d.hits_len - 1, 0)]
  step = state.counters[C_STEP]
  same_key = (state.block_group == state.block_group[last]) & jnp.all(
    state.block_hash == state.block_hash[last][None, :], axis=1
  )
  same_step = (state.block_aux[last, 0] == step) | jnp.any(
    same_key & (state.block_aux[:, 0] == step)
  )
  return d.is_new & (d.hit > 0) & (last > 0) & same_step


def blocks_needed(spec, d: BlockDemand):
  """(blocks, refused). align (§2.4.3): the blocks up to the running state's column (+S),
  capped at one (1 + S on the first allocation; + the copy-on-write block); none: one block
  (1 + S) on the first allocation only; all: one block per B tokens (+S blocks of lookahead).
  Refused by the same-step rule."""
  s, bs = d.num_spec_blocks, spec.block_size
  if spec.mode == "align":
    k = cdiv(d.main_tokens, bs) + s - d.hits_len - d.length
    if d.partial:
      k = jnp.where(d.part > 0, jnp.maximum(k, 0) + 1, k)
    first = jnp.where(d.length == 0, 1 + s, 1)
    if d.partial:
      first = first + d.part
    k = jnp.where(k > 0, jnp.minimum(k, first), 0)  # vLLM's physical block cap
  elif spec.mode == "none":
    k = jnp.where(d.length == 0, 1 + s, 0)
  else:
    k = grow_to(spec, d, target_blocks(spec, d, bs * s), skipped_blocks(spec, d.hit))
  return k, _same_step(d)


def eagle_lookahead(spec) -> bool:
  """Recurrent states are registered at the computed floor only, EAGLE or not."""
  return False


def cache_mask(spec, pos, align, retention, boundaries):
  """bool[MB]: state blocks whose keys are registered: none in mode none, else
  `retention_mask` (§2.4.7)."""
  if spec.mode == "none":
    return jnp.zeros(pos.shape, bool)
  return retention_mask(pos, spec.block_size, align, retention, boundaries)
