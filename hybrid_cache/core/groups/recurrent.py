"""Recurrent groups (Mamba2/GDN, vLLM §2.4): one state block exactly at the hit boundary.

Besides the cache rules shared by every kind (`groups.rules`), the worker-side rules of a
recurrent group live here: which state blocks a scheduled chunk reads, writes and checkpoints
(`state_slots`, vLLM §5.1-5.4, carried in the step results) and the engine's own chunk rule for
mode "all" (`kernel_chunk_cap`), so that no caller re-derives the modes.
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
from hybrid_cache.core.state import AUX_END
from hybrid_cache.core.state import AUX_STEP
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
  step = state.clock
  same_key = (state.block_group == state.block_group[last]) & jnp.all(
    state.block_hash == state.block_hash[last][None, :], axis=1
  )
  same_step = (state.block_aux[last, AUX_STEP] == step) | jnp.any(
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
  new state (or a copy-on-write) remembers the previous state's column in `RG_LAST` (freed a
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
  return cond & ~((state.block_group[blk] >= 0) & (state.block_aux[blk, AUX_END] == t))


def tail_pending(spec, g, i, ids, t, prim, extra, step, nb, acc):
  """After the tail keys are written (entry `i` of the tail groups, group `g`): the state block
  just written stays pending for the copy-on-write (and the same-step rule) even if it already
  carried this key: registration step = `step`; a sub-block entry (t inside the block) is
  remembered in `req_partial` (1 + its position) for the request's next allocation (§2.5) and
  the block is not cached again. `acc` = (aux, ncached, pend, n_rec): the `block_aux` array,
  the request's `RG_NCACHED` and `req_partial` rows and the recurrent states admitted."""
  aux, ncached, pend, n_rec = acc
  bs = spec.block_size
  aux = aux.at[jnp.where(ids[i] > 0, ids[i], nb), AUX_STEP].set(step, mode="drop")
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


# ---------------------------------------------------------------------------------------------
# worker side: state slots of a scheduled chunk (vLLM §5)


# the columns of a `state_slots` result
SLOT_READ, SLOT_WRITE, SLOT_FIRST_CHECKPOINT, SLOT_NUM_CHECKPOINTS = range(4)
SLOT_WIDTH = 4


def state_slots(spec, row, start, n):
  """Where a scheduled chunk [start, start + n) reads and writes this group's recurrent state.

  The state after a prefix [0, p) lives in the block of the column holding token p - 1 (vLLM
  §5.1). With B = `spec.block_size` and end = start + n, per mode (`spec.mode`, the effective
  one: caching off is "none"):
    none  (§2.4.1): one block per request, read (start > 0) and written in place: column 0.
    align (§5.1, §5.2): the running-state column cdiv(end, B) - 1; the step's pre-forward copy
          (`StateCopy`, §5.2) has moved the previous state there, so it is read (start > 0)
          and written.
    all   (§5.4): read column (start - 1) // B, write column (end - 1) // B, and checkpoint
          the state after each of the n // B full blocks of a chunk that starts on a block
          boundary, into columns start // B, ... (the last one is the write column when end is
          a boundary). Our kernels emit a checkpoint every B tokens from a chunk's start, so a
          chunk starting inside a block checkpoints nothing: its only boundary state, when it
          ends on one, is its write block, and it must not cross a boundary (the engine keeps
          its chunks so, `kernel_chunk_cap`). vLLM's kernels write every boundary wherever
          the chunk starts (§5.4); both agree on every chunk that rule lets through.
  A chunk with start == 0 reads no state (-1: start from zeros).

  Args:
    spec: the group's resolved spec (static).
    row: i32[MB], the request's block table of this group after the step's allocation.
    start, n: i32 scalars, tokens computed before the chunk and the chunk's length.

  Returns:
    i32[SLOT_WIDTH] (`SLOT_*` columns: read block or -1, write block, first checkpoint
    column, checkpoint count): the checkpoint blocks are row[first : first + count]. n == 0
    (not scheduled) gives (-1, -1, 0, 0).

  Example (mode all, B=4): row [7, 8, 9], start 4, n 6 -> (7, 9, 1, 1): read the state after
  4 tokens from block 7, checkpoint the state after 8 tokens into block 8, write the state
  after 10 tokens into block 9.
  """
  bs = spec.block_size
  end = start + n
  if spec.mode == "none":
    read_col = write_col = jnp.int32(0)
  elif spec.mode == "align":
    read_col = write_col = cdiv(end, bs) - 1
  else:
    read_col, write_col = (start - 1) // bs, (end - 1) // bs
  count = jnp.int32(0)
  if spec.mode == "all":
    count = jnp.where(start % bs == 0, n // bs, 0)
  mb = row.shape[0]
  read = jnp.where(start > 0, row[jnp.clip(read_col, 0, mb - 1)], -1)
  write = row[jnp.clip(write_col, 0, mb - 1)]
  on = n > 0
  return jnp.stack(
    [
      jnp.where(on, read, -1),
      jnp.where(on, write, -1),
      jnp.where(on, start // bs, 0),
      jnp.where(on, count, 0),
    ]
  ).astype(jnp.int32)


def kernel_checkpoints(spec) -> bool:
  """Whether prefill chunks write checkpoints besides their final state (mode all, §5.4)."""
  return spec.mode == "all"


def copies_after_verify(spec) -> bool:
  """Whether a speculative verify window copies the state at a block boundary reached inside
  its accepted tokens into that boundary's block (vLLM §5.3: align mode only; mode all is
  refused with speculative decoding, mode none caches nothing)."""
  return spec.mode == "align"


def kernel_chunk_cap(spec, num_computed: int, num_tokens: int, budget: int) -> int | None:
  """The engine's cap on a request's next chunk so that our kernels can checkpoint it (host).

  Mode all: our GDN / SSD kernels emit a checkpoint every B tokens from a chunk's start, so a
  prefill chunk that stops before the sequence end must end on a block boundary (then every
  chunk after a block-aligned hit starts on one, and `state_slots` lists every boundary state).
  Returns min(num_tokens - num_computed, budget), floored to end on a multiple of B unless it
  reaches num_tokens; <= 0 = the chunk cannot end on a boundary within `budget` (skip the
  request this step). A waiting request passes num_computed = 0: its prefix hit is aligned to
  the scheduler block (a multiple of B), so a B-multiple cap keeps its end aligned. Other
  modes: None (no cap; align chunks are aligned by the core's split, vLLM §4.3).

  This is an engine rule, not vLLM's: vLLM 0.33's kernels write every block boundary wherever
  a chunk starts (§5.4), and its scheduler aligns chunks only in align mode
  (`Scheduler.need_mamba_block_aligned_split`), so the core's split (vLLM-exact replay) does not
  apply it. Example (B=4): computed 4, 27 tokens, budget 7 -> 4 (ends at 8); budget 30 -> 23.
  """
  if not kernel_checkpoints(spec):
    return None
  remaining = num_tokens - num_computed
  n = min(remaining, budget)
  if n < remaining:
    n = floor_to(num_computed + n, spec.block_size) - num_computed
  return n


def check_kernel_chunk(spec, start: int, n: int) -> None:
  """Raises AssertionError when our kernels cannot checkpoint chunk [start, start + n) (host):
  in mode all, a chunk starting inside a block must not cross a block boundary (see
  `kernel_chunk_cap`, which keeps the engine's chunks so)."""
  bs = spec.block_size
  if kernel_checkpoints(spec) and start % bs and cdiv(start, bs) * bs < start + n:
    raise AssertionError(f"'all' mode chunk [{start}, {start + n}) crosses a block boundary")
