"""Sliding window (vLLM §2.3): right-to-left contiguous run of ceil((W-1)/B) blocks."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from hybrid_cache.core import block_pool
from hybrid_cache.core.groups.demand import BlockDemand
from hybrid_cache.core.groups.demand import grow_to
from hybrid_cache.core.groups.demand import target_blocks
from hybrid_cache.core.groups.placement import Placed
from hybrid_cache.core.groups.placement import Placement
from hybrid_cache.core.groups.placement import fresh_blocks
from hybrid_cache.core.state import cdiv
from hybrid_cache.core.state import floor_to


def find(cached, cap, drop, bs: int, alignment: int, need: int):
  """Hit for an SWA group: the rightmost aligned run of `need` (+1 with `drop`) cached blocks.

  A run may only start at a block whose right edge (the left edge with `drop`) is a multiple of
  `alignment`; a run touching block 0 counts even if shorter. With `drop` one block is popped
  and the length aligned down. Example (S06, bs=2, W=4 so need=2): cached `TTFTFFTTFTTT` gives
  12; `TTFTFFTTFFF` gives 8. Returns (L, lo) with lo the first non-null hit position.
  """
  mb = cached.shape[0]
  pos = jnp.arange(mb)
  n = cap // bs
  need_eff = jnp.maximum(need + drop.astype(jnp.int32), 1)
  c = cached & (pos < n)
  end = jnp.where(drop, pos, pos + 1)
  eligible = c & (((end * bs) % alignment == 0) if bs != alignment else True)
  cs = jnp.cumsum(c.astype(jnp.int32))
  before = jnp.where(pos - need_eff >= 0, cs[jnp.maximum(pos - need_eff, 0)], 0)
  full_window = ((cs - before) == need_eff) & (pos - need_eff + 1 >= 0)
  ok = eligible & full_window
  found = jnp.any(ok)
  s_found = jnp.max(jnp.where(ok, pos, -1))
  # the run touching block 0: leading cached prefix, started at an eligible block
  r = jnp.sum(jnp.cumprod(c.astype(jnp.int32)))
  s0 = jnp.max(jnp.where(eligible & (pos < r), pos, -1))
  len_found = (s_found + 1) * bs
  len_zero = floor_to((s0 + 1) * bs, alignment)
  length = jnp.where(found, len_found, len_zero)
  length = jnp.where(drop & (length > 0), floor_to(length - bs, alignment), length)
  lo = jnp.where(found, jnp.maximum(s_found - need_eff + 1, 0), 0)
  return length.astype(jnp.int32), lo.astype(jnp.int32)


def find_hit(lay, spec, need: int, cached, cap, drop):
  """The coordinator's finder (the uniform signature of `groups.rules`)."""
  return find(cached, cap, drop, spec.block_size, lay.sbs, need)


def valid_ends(spec, need: int, cached, cs, aligned, lead):
  """bool[MB]: where a hit may end (no EAGLE drop): aligned cached ends with `need` cached
  blocks before them, or inside the leading run. `cs`: inclusive prefix count of `cached`."""
  mb = cached.shape[0]
  pos = np.arange(mb)
  k = max(need, 1)
  before = jnp.concatenate([jnp.zeros((k,), cs.dtype), cs[: mb - k]]) if k < mb else 0 * cs
  window = ((cs - before) == k) & jnp.asarray(pos >= k - 1)
  return cached & aligned & (window | lead)


def skipped_blocks(spec, tokens):
  """Leading blocks out of the window once `tokens` are computed: max(0, c - W + 1) // B."""
  return jnp.maximum(tokens - spec.window + 1, 0) // spec.block_size


def finish_pin_mask(spec, keyed, pos):
  """Blocks a finished request pins (SPEC B1): its last `swa_need` keyed blocks (the window)."""
  deepest = jnp.max(jnp.where(keyed, pos, -1))
  return keyed & (pos > deepest - spec.swa_need)


def retention_mask(pos, bs, need, align, retention, eagle, boundaries):
  """bool[MB]: SWA blocks worth caching (vLLM §2.3.4) for reachable `boundaries` (i32[k]).

  `retention` (traced i32 from `CacheState.params`, or a Python int / None): < 0 or None =
  the last `need` blocks of every `align` tokens, no boundaries; 0 = boundaries only;
  k * sbs = the last `need` blocks of every `retention` tokens plus the boundaries. `align`:
  the hit alignment (the hash block with partial hits, else the scheduler block; vLLM
  `reachable_block_mask`), also what the boundaries are floored to.
  """
  retention = -1 if retention is None else retention  # RETENTION_NONE
  shift = 1 if eagle else 0
  segment = jnp.where(retention < 0, align, retention)
  per = jnp.maximum(segment // bs, 1)  # segment is a multiple of bs when > 0
  periodic = (need >= per) | ((pos >= shift) & ((pos - shift) % per >= per - need))
  mask = (segment > 0) & periodic
  for b in boundaries:
    e = floor_to(b, align) // bs + shift
    mask |= (retention >= 0) & (b > 0) & (pos >= e - need) & (pos < e)
  return mask


def frees_skipped(spec) -> bool:
  """Whether a running request releases leading blocks as it advances: those out of the window
  (vLLM §2.3.3)."""
  return True


def before_skipped_free(lay, state, spec, row, drop, k, j0):
  """Pins the window's blocks among the dropped ones (SPEC B1, `lay.config.pinning`): the last
  `window_blocks` before position k, unless fewer than `pin_min_drop_size` blocks drop (a decode
  tail drops one block at a time; its blocks carry unique hashes)."""
  if not lay.config.pinning:
    return state
  pos = jnp.arange(row.shape[0])
  big_enough = (k - 1 - j0) >= state.pin_min_drop_size
  to_pin = drop & (pos >= k - spec.window_blocks) & big_enough & (state.block_group[row] >= 0)
  return block_pool.pin(state, jnp.where(to_pin, row, 0))


def after_skipped_free(state, spec, r, g, row, c):
  """Nothing more to release."""
  return state, row


def own_partial(spec, state, r, g, is_new):
  """A partial entry of the request's own that needs a copy-on-write block: none."""
  return jnp.int32(0)


def blocks_needed(spec, d: BlockDemand):
  """(blocks, refused): as full attention, past the blocks out of the window (§2.3); with
  `swa_cap` (the full-sequence gate) at most the per-request worst case,
  cdiv(min(W - 1 + max_num_batched_tokens, max_model_len), B) + 1."""
  target = target_blocks(spec, d)
  if d.swa_cap:
    # min(W - 1 + max_num_batched_tokens, max_model_len) without int32 overflow
    budget, mml = d.state.max_batched_tokens, d.state.max_model_len
    w1 = spec.window - 1
    bound = cdiv(jnp.minimum(budget, mml - w1) + w1, spec.block_size)
    target = jnp.minimum(target, bound + 1)
  return grow_to(spec, d, target, skipped_blocks(spec, d.hit)), jnp.bool_(False)


def eagle_lookahead(spec) -> bool:
  """EAGLE groups register keys one block past the computed floor (vLLM §4.5)."""
  return spec.eagle


def cache_mask(spec, pos, align, retention, boundaries):
  """bool[MB]: blocks whose keys are registered (`retention_mask`, §2.3.4)."""
  return retention_mask(
    pos, spec.block_size, spec.swa_need, align, retention, spec.eagle, boundaries
  )


# ---------------------------------------------------------------------------------------------
# static properties (read when the layout is derived and where the coordinator is structured)

KEEPS_PREFIX = False
"""A hit needs only the window's blocks before its end (§2.3): looked up at every candidate of
the coordinator's fixed point (§3.2)."""

RECURRENT = False
"""Not a recurrent group (no state blocks: `Layout.recurrent_groups`)."""

MLP_PRIORITY = 1
"""The cost model's MLP layers go to window groups when there is no full-attention group."""


def hit_need(spec) -> int:
  """Blocks a hit needs before its end (`SpecGroup.need`): ceil((W - 1) / B), without the EAGLE
  +1 (vLLM §2.3)."""
  return spec.window_blocks


def disables_caching(spec) -> bool:
  """Whether this group turns prefix caching off for the whole model: no."""
  return False


def without_caching(spec):
  """The group as the layout holds it when prefix caching is off: unchanged."""
  return spec


def is_align(spec) -> bool:
  """A recurrent group in mode align (`Layout.align_bs`, the block-aligned split): no."""
  return False


def caches_prompt_tail(spec, partial: bool) -> bool:
  """Whether the group gets the prompt-tail partial entry (vLLM `_cache_partial_tail_block`,
  §2.5): no (a window group beside partial hits has the hash block as its block)."""
  return False


def takes_fine_keys(spec, hbs: int) -> bool:
  """Keys at hash-block boundaries inside a block (`CacheConfig.fine_keys`): no (a window
  group beside fine keys has the hash block as its block)."""
  return False


# ---------------------------------------------------------------------------------------------
# coordinator (§3.2) and fine-grained hits (§2.5)


def eagle_cap(spec, cur, drop, max_len):
  """The finder's cap at candidate `cur` in the fixed point: with the EAGLE drop pending the
  lookup reaches one block past the candidate (so that dropping one block can land on it),
  at most `max_len` (vLLM §3.2 / §4.5)."""
  return jnp.where(drop, jnp.minimum(cur + spec.block_size, max_len), cur)


def hit_lo(spec, hi, need: int):
  """First table position of the hit mask for a hit of `hi` blocks (closed form): the window's
  max(need, 1) blocks before the hit (§2.3)."""
  return jnp.maximum(hi - max(need, 1), 0)


def fine_valid(lay, spec, fine_cached, cached):
  """bool[MH]: hash-block indices where a sliding-window hit may end, with partial hits (§2.5).

  A window group beside partial hits has the hash block as its block (vLLM turns partial hits
  off otherwise), so block position i ends at hash index i: valid where the `swa_need` blocks
  (at least one) before the end are cached, or inside the leading cached run (§2.3).
  `fine_cached` is unused (None: the block is the hash block).
  """
  mb, mh = cached.shape[0], lay.max_hashes
  k = max(spec.swa_need, 1)
  pos = jnp.arange(mb)
  cs = jnp.cumsum(cached.astype(jnp.int32))
  before = jnp.concatenate([jnp.zeros((k,), cs.dtype), cs[: mb - k]]) if k < mb else 0 * cs
  window = ((cs - before) == k) & (pos >= k - 1)
  valid = cached & (window | (cs == pos + 1))
  if mb >= mh:
    return valid[:mh]
  return jnp.concatenate([valid, jnp.zeros((mh - mb,), bool)])


def fine_hit(lay, spec, g, hit, found, cached, fine, fa, pos):
  """(bool[MB] hit mask before the miss filter, i32[MB] blocks) of group `g` for a partial-hit
  lookup's reconciled `hit` (§2.5): the window's blocks before the hit (§2.3)."""
  bs = spec.block_size
  hi = hit // bs
  m = (pos >= jnp.maximum(hi - max(spec.swa_need, 1), 0)) & (pos < hi) & cached[g]
  return m, found[g]


# ---------------------------------------------------------------------------------------------
# allocation (§2.3)


def own_cow(spec, state, r, g, is_new):
  """bool: the request's own partial entry moves to a copy-on-write block now: never."""
  return jnp.bool_(False)


def place_blocks(spec, p: Placement) -> Placed:
  """One block per B tokens up to `need_tokens`, as full attention (the blocks out of the window
  are released by `allocate.remove_skipped`, vLLM §2.3.3)."""
  return fresh_blocks(spec, p)


# ---------------------------------------------------------------------------------------------
# host-side cost model of FLOP-aware eviction (SPEC B2, `eviction_costs`, `alpha_tuning`)


def prefix_flops(spec, tokens, linear: float, quadratic: float):
  """F_g(L) = linear * L + quadratic * L * min(L, W) over `tokens` = L (float64; the sim cost
  model's non-causal count)."""
  return linear * tokens + quadratic * tokens * np.minimum(tokens, float(spec.window))


def block_flops(spec, end, linear: float, quadratic: float):
  """FLOPs a hit on the block ending at `end` (float64) saves: its own tokens,
  F_g(E) - F_g(E - B)."""
  total = prefix_flops(spec, end, linear, quadratic)
  return total - prefix_flops(spec, end - spec.block_size, linear, quadratic)


def layer_costs(model, spec, block_size: int, share: float, lin_quad):
  """(linear, quadratic, bytes) of the sliding-window layers a group of this kind stands for
  (`share` of them): context capped at the window; bytes: the window KV of `block_size`
  tokens."""
  s_lin, s_quad = lin_quad(model.swa_flops, spec.window)
  own = model.swa_kv_bytes_per_token * block_size * share
  return model.n_swa * s_lin, model.n_swa * s_quad, own
