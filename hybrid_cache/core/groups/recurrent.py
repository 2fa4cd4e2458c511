"""Recurrent groups (Mamba2/GDN, vLLM §2.4): one state block exactly at the hit boundary.

The cache rules shared by every kind (`groups.rules`). The worker-side rules of a recurrent
group (which state blocks a scheduled chunk reads, writes and checkpoints, `state_slots`, vLLM
§5.1-5.4, and the engine's chunk rule for mode "all", `kernel_chunk_cap`) are in
`recurrent_slots`.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from hybrid_cache.core import block_pool
from hybrid_cache.core.groups.demand import BlockDemand
from hybrid_cache.core.groups.demand import grow_to
from hybrid_cache.core.groups.demand import target_blocks
from hybrid_cache.core.groups.placement import Placed
from hybrid_cache.core.groups.placement import Placement
from hybrid_cache.core.groups.placement import fresh_blocks
from hybrid_cache.core.split import checkpoint_position
from hybrid_cache.core.state import BlockAux
from hybrid_cache.core.state import ReqGroup
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


def before_skipped_free(lay, state, spec, row, drop, k, j0):
  """Nothing is pinned when states are superseded."""
  return state


def after_skipped_free(state, spec, r, g, row, c):
  """Mode align (vLLM §2.4.4): the previous running-state block (`group_last`) is freed a step
  later, once `c` computed tokens have moved past its block. Returns (state, row)."""
  if spec.mode != "align":
    return state, row
  pos = jnp.arange(row.shape[0])
  ls = ReqGroup(state.req_group)[r, g].last
  due = (ls >= 0) & (ls < cdiv(c, spec.block_size) - 1)
  blk = jnp.where(due, row[jnp.maximum(ls, 0)], 0)
  state = block_pool.free_ordered(state, blk[None], jnp.zeros((1,), jnp.int32))
  row = jnp.where(due & (pos == ls), 0, row)
  state = state.replace(req_group=ReqGroup(state.req_group)[r, g].set(last=jnp.where(due, -1, ls)))
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
  step = state.clock
  same_key = (state.block_group == state.block_group[last]) & jnp.all(
    state.block_hash == state.block_hash[last][None, :], axis=1
  )
  same_step = (BlockAux(state.block_aux)[last].key_step == step) | jnp.any(
    same_key & (state.key_step == step)
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


# ---------------------------------------------------------------------------------------------
# static properties (read when the layout is derived and where the coordinator is structured)

KEEPS_PREFIX = False
"""A hit needs one state block exactly at its end (§2.4): looked up at every candidate of the
coordinator's fixed point (§3.2)."""

RECURRENT = True
"""A recurrent group (`Layout.recurrent_groups`: recurrent-state counters, dead states)."""

MLP_PRIORITY = 2
"""The cost model's MLP layers go to recurrent groups when there is no attention group."""


def hit_need(spec) -> int:
  """Blocks a hit needs before its end (`SpecGroup.need`): none (the state block itself)."""
  return 0


def disables_caching(spec) -> bool:
  """Whether this group turns prefix caching off for the whole model: mode none (vLLM §2.4.1:
  one state block overwritten in place, nothing to hit)."""
  return spec.mode == "none"


def without_caching(spec):
  """The group as the layout holds it when prefix caching is off: mode none (one state block,
  overwritten in place; vLLM §2.4.1)."""
  return dataclasses.replace(spec, mode="none")


def is_align(spec) -> bool:
  """Mode align (§2.4.3): states at block boundaries (`Layout.align_bs`, the block-aligned
  split of §4.3)."""
  return spec.mode == "align"


def caches_prompt_tail(spec, partial: bool) -> bool:
  """Whether a block larger than the hash block gets the prompt-tail partial entry (vLLM
  `MambaManager._cache_partial_tail_block`, §2.5): mode align with partial hits."""
  return partial and spec.mode == "align"


def takes_fine_keys(spec, hbs: int) -> bool:
  """Keys at hash-block boundaries inside a block (`CacheConfig.fine_keys`): no (a state
  block holds one state, at its end)."""
  return False


# ---------------------------------------------------------------------------------------------
# coordinator (§3.2) and fine-grained hits (§2.5)


def eagle_cap(spec, cur, drop, max_len):
  """The finder's cap at candidate `cur` in the fixed point: `cur` (recurrent groups get no
  EAGLE margin, §3.2)."""
  return cur


def hit_lo(spec, hi, need: int):
  """First table position of the hit mask for a hit of `hi` blocks (closed form): the state
  block at the hit's end (§2.4)."""
  return jnp.maximum(hi - 1, 0)


def fine_valid(lay, spec, fine_cached, cached):
  """bool[MH]: hash-block indices where a recurrent hit may end, with partial hits (§2.5): a
  key at that boundary (`fine_cached`, the group's hash-block probe, when its block is larger
  than the hash block), else a block key ending there."""
  hbs = lay.hash_block_size
  if fine_cached is not None:
    return fine_cached
  # block == hash block: block position i ends at hash index i * (bs // hbs) + ... (scale 1)
  mh = lay.max_hashes
  k = spec.block_size // hbs
  fpos = np.arange(mh)
  blk = (fpos + 1) // k - 1
  on_edge = ((fpos + 1) % k == 0) & (blk < cached.shape[0])
  return jnp.where(jnp.asarray(on_edge), cached[np.clip(blk, 0, cached.shape[0] - 1)], False)


def fine_hit(lay, spec, g, hit, found, cached, fine, fa, pos):
  """(bool[MB] hit mask before the miss filter, i32[MB] blocks) of group `g` for a partial-hit
  lookup's reconciled `hit` (§2.5): the one state block at (hit - 1) // B, the block carrying
  the hash-block key at `hit` (`fine`) when the block is larger than the hash block."""
  bs = spec.block_size
  p = (hit - 1) // bs
  m = (pos == p) & (hit > 0)
  if fine is not None:
    fb = fine[jnp.maximum(hit // lay.hash_block_size - 1, 0)]
  else:
    fb = found[g][jnp.maximum(p, 0)]
  return m, jnp.where(m, fb, -1)


# ---------------------------------------------------------------------------------------------
# allocation (§2.4.3) and the prompt-tail entry (§2.5)


def own_cow(spec, state, r, g, is_new):
  """bool: mode align with partial hits: the request's own partial entry still on its running
  block moves to a copy-on-write block at this allocation (§2.5)."""
  if spec.mode != "align":
    return jnp.bool_(False)
  return ~is_new & (state.req_partial[r, g] > 0)


def place_blocks(spec, p: Placement) -> Placed:
  """align (vLLM §2.4.3 `MambaManager.allocate_new_blocks`): the table grows to the running
  state's column cdiv(main, B) + S; blocks before the new state's column are left null (the
  lookahead blocks of a running request move up to it), fresh ones fill the rest; entering a
  new state (or a copy-on-write) remembers the previous state's column in `group_last` (freed a
  step later, `after_skipped_free`). none: one block (1 + S) on the first allocation only. all:
  one block per B tokens, S blocks of lookahead."""
  s, bs, length, row = p.num_spec_blocks, spec.block_size, p.length, p.row
  if spec.mode == "align":
    req = cdiv(p.main, bs) + s
    grow = req > length
    enter = (grow | p.has_cow) if p.partial else grow
    prev = length
    last_state = jnp.where(p.len0 > 0, prev - 1 - s, jnp.where(p.hits_len > 0, prev - 1, -1))
    skip_to = req - s - 1
    base = jnp.maximum(prev, skip_to)
    nrel = jnp.int32(0)
    for t in range(s):
      j = prev - s + t
      move = grow & (p.len0 > 0) & (j >= 0) & (j < skip_to)
      blk = row[jnp.maximum(j, 0)]
      row = jnp.where(move & (p.pos == base + nrel), blk, row)
      row = jnp.where(move & (p.pos == j), 0, row)
      nrel = nrel + move.astype(jnp.int32)
    first = base + nrel
    count = jnp.where(grow, req - base - nrel, 0)
    last = jnp.where(enter, last_state, p.last)
    return Placed(row, first, count, last, jnp.maximum(length, req))
  if spec.mode == "none":
    count = jnp.where(length == 0, 1 + s, 0)
    return Placed(row, length, count, p.last, length + count)
  return fresh_blocks(spec, p, bs * s)


def tail_boundary(prompt, hbs: int, eagle: bool):
  """The prompt-tail boundary: the prompt's checkpoint position (`split.checkpoint_position`,
  EAGLE one hash block lower; vLLM `MambaManager._cache_partial_tail_block`)."""
  return checkpoint_position(prompt, hbs, eagle)


def tail_block(spec, t, n):
  """(table position, bool) of the tail entry: the state block ending at t, when a chunk ends
  exactly there (`n` == t; t may be block aligned)."""
  return cdiv(t, spec.block_size) - 1, n == t


def tail_needs_key(state, blk, t, cond):
  """`cond` without a block already keyed at t (a hit or an earlier step)."""
  return cond & ~((state.block_group[blk] >= 0) & (BlockAux(state.block_aux)[blk].key_end == t))


def tail_pending(spec, g, i, ids, t, prim, extra, step, nb, acc):
  """After the tail keys are written (entry `i` of the tail groups, group `g`): the state block
  just written stays pending for the copy-on-write (and the same-step rule) even if it already
  carried this key: registration step = `step`; a sub-block entry (t inside the block) is
  remembered in `req_partial` (1 + its position) for the request's next allocation (§2.5) and
  the block is not cached again. `acc` = (aux, ncached, pend, n_rec): the `block_aux` array,
  the request's `group_ncached` and `req_partial` rows and the recurrent states admitted."""
  aux, ncached, pend, n_rec = acc
  bs = spec.block_size
  aux = BlockAux(aux)[jnp.where(ids[i] > 0, ids[i], nb)].set(key_step=step, mode="drop")
  ti = t[i]
  sub = (ids[i] > 0) & (ti % bs != 0)  # a sub-block entry: copy-on-write at the next allocation
  ncached = ncached.at[g].set(jnp.where(sub, ti // bs, ncached[g]))
  pend = pend.at[g].set(jnp.where(sub, ti // bs + 1, pend[g]))
  n_rec = n_rec + ((prim[i] > 0) | (extra[i] > 0)).astype(jnp.int32)
  return aux, ncached, pend, n_rec


# ---------------------------------------------------------------------------------------------
# host-side cost model of FLOP-aware eviction (SPEC B2, `eviction_costs`, `alpha_tuning`)


def prefix_flops(spec, tokens, linear: float, quadratic: float):
  """F_g(L) = linear * L over `tokens` = L (float64)."""
  return linear * tokens


def block_flops(spec, end, linear: float, quadratic: float):
  """FLOPs a hit on the state block ending at `end` (float64) saves: the whole prefix, F_g(E)
  (a recurrent state replaces recomputing every token before it; Marconi charges only the edge
  since its parent node holds a state too, a block pool does not know the previous state, so
  this is the saving against a cold start)."""
  return prefix_flops(spec, end, linear, quadratic)


def layer_costs(model, spec, block_size: int, share: float, lin_quad):
  """(linear, quadratic, bytes) of the recurrent layers a group of this kind stands for
  (`share` of them): linear only; bytes: one checkpoint of its recurrent layers."""
  r_lin, _ = lin_quad(model.recurrent_flops)
  return model.n_recurrent * r_lin, 0.0, model.state_bytes * share
