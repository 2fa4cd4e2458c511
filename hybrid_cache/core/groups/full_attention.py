"""Full attention (vLLM §2.2): longest cached prefix, left to right; never frees early."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.core.groups.demand import BlockDemand
from hybrid_cache.core.groups.demand import grow_to
from hybrid_cache.core.groups.demand import target_blocks
from hybrid_cache.core.groups.placement import Placed
from hybrid_cache.core.groups.placement import Placement
from hybrid_cache.core.groups.placement import fresh_blocks
from hybrid_cache.core.state import floor_to


def find(cached: jax.Array, cap: jax.Array, drop: jax.Array, bs: int, alignment: int):
  """Longest hit over the first `cap // bs` blocks of `cached` (bool[MB]).

  Returns (L, lo): hit length in tokens (EAGLE drops one block, then aligned down) and the first
  non-null hit position (always 0).
  """
  pos = jnp.arange(cached.shape[0])
  ok = cached & (pos < cap // bs)
  hits = jnp.sum(jnp.cumprod(ok.astype(jnp.int32)))
  length = hits * bs
  length = jnp.where(drop & (length > 0), length - bs, length)
  return floor_to(length, alignment).astype(jnp.int32), jnp.int32(0)


def find_hit(lay, spec, need: int, cached, cap, drop):
  """The coordinator's finder (the uniform signature of `groups.rules`; `need` unused)."""
  return find(cached, cap, drop, spec.block_size, lay.sbs)


def valid_ends(spec, need: int, cached, cs, aligned, lead):
  """bool[MB]: where a hit may end (no EAGLE drop): aligned ends inside the leading run."""
  return lead & aligned


def skipped_blocks(spec, tokens):
  """Leading blocks no longer needed once `tokens` are computed: none (the prefix stays)."""
  return jnp.zeros_like(tokens)


def finish_pin_mask(spec, keyed, pos):
  """Blocks a finished request pins (SPEC B1): every keyed block of its prefix."""
  return keyed


def frees_skipped(spec) -> bool:
  """Whether a running request releases leading blocks as it advances: never."""
  return False


def own_partial(spec, state, r, g, is_new):
  """A partial entry of the request's own that needs a copy-on-write block: none."""
  return jnp.int32(0)


def blocks_needed(spec, d: BlockDemand):
  """(blocks, refused): one block per B tokens up to `need_tokens` (vLLM §2.1)."""
  return grow_to(spec, d, target_blocks(spec, d), jnp.zeros_like(d.hit)), jnp.bool_(False)


def eagle_lookahead(spec) -> bool:
  """EAGLE groups register keys one block past the computed floor (vLLM §4.5)."""
  return spec.eagle


def cache_mask(spec, pos, align, retention, boundaries):
  """bool[MB]: blocks whose keys are registered: all (full attention keeps its prefix)."""
  return jnp.ones(pos.shape, bool)


# ---------------------------------------------------------------------------------------------
# static properties (read when the layout is derived and where the coordinator is structured)

KEEPS_PREFIX = True
"""A hit is the whole cached prefix from block 0 (vLLM §2.2): the valid ends are downward
closed, so the coordinator looks full attention up once, first, and its hit mask starts at block
0 (§3.2); a recurrent state whose token end no full-attention key covers any more can never be
hit again (`eviction.dead_states`, SPEC B2)."""

RECURRENT = False
"""Not a recurrent group (no state blocks: `Layout.recurrent_groups`)."""

MLP_PRIORITY = 0
"""The cost model's MLP layers are charged to full attention first (`alpha_tuning.cost_fields`)."""


def hit_need(spec) -> int:
  """Blocks a hit needs before its end beyond the leading run (`SpecGroup.need`): none."""
  return 0


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
  """Whether a block larger than the hash block gets the prompt-tail partial entry (vLLM
  `FullAttentionManager.cache_blocks` / `_cache_partial_tail_block`, §2.5): always, with or
  without partial hits."""
  return True


def takes_fine_keys(spec, hbs: int) -> bool:
  """Beyond vLLM (`CacheConfig.fine_keys`, `Layout.fine_key_groups`): whether a full block is
  also keyed at every hash-block boundary inside it: when it is larger than the hash block
  `hbs` (a hit on the whole prefix may then end at any boundary)."""
  return spec.block_size > hbs


# ---------------------------------------------------------------------------------------------
# coordinator (§3.2) and fine-grained hits (§2.5)


def eagle_cap(spec, cur, drop, max_len):
  """The finder's cap at candidate `cur` in the fixed point: with the EAGLE drop pending the
  lookup reaches one block past the candidate (so that dropping one block can land on it),
  at most `max_len` (vLLM §3.2 / §4.5)."""
  return jnp.where(drop, jnp.minimum(cur + spec.block_size, max_len), cur)


def hit_lo(spec, hi, need: int):
  """First table position of the hit mask for a hit of `hi` blocks (closed form): 0, the whole
  prefix (§2.2)."""
  return 0


def fine_hit(lay, spec, g, hit, found, cached, fine, fa, pos):
  """(bool[MB] hit mask before the miss filter, i32[MB] blocks) of group `g` for a partial-hit
  lookup's reconciled `hit` (§2.5): blocks 0 .. cdiv(hit, B) - 1; the block at the run's end
  is the phase-2 block (`fa` = (run, f) of `partial._full_find_fine`) when one was found."""
  bs = spec.block_size
  n = (hit + bs - 1) // bs
  m = pos < n
  run, f = fa
  blk = found[g]
  if fine is not None:
    # the phase-2 block sits at position `run` (only used when the hit reaches into it)
    pb = fine[jnp.maximum(f, 0)]
    blk = jnp.where((pos == run) & (f >= 0), pb, blk)
  return m, blk


# ---------------------------------------------------------------------------------------------
# allocation (§2.1) and the prompt-tail entry (§2.5)


def own_cow(spec, state, r, g, is_new):
  """bool: the request's own partial entry moves to a copy-on-write block now: never."""
  return jnp.bool_(False)


def place_blocks(spec, p: Placement) -> Placed:
  """One block per B tokens up to `need_tokens` (vLLM §2.1)."""
  return fresh_blocks(spec, p)


def tail_boundary(prompt, hbs: int, eagle: bool):
  """The prompt-tail boundary t = floor((P - 1) / HBS) * HBS: a re-sent prompt hits at most
  P - 1 tokens; EAGLE lookups read the whole prompt: floor(P / HBS) * HBS (vLLM
  `FullAttentionManager.cache_blocks`)."""
  return floor_to(prompt if eagle else prompt - 1, hbs)


def tail_block(spec, t, n):
  """(table position, bool) of the tail entry: the block holding t, when t is inside it and the
  group has cached past t (`n` tokens)."""
  bs = spec.block_size
  return t // bs, (t % bs != 0) & (t <= n)


def tail_needs_key(state, blk, t, cond):
  """`cond` filtered by what the block carries: unchanged (a block holding t inside it is never
  keyed at t by a hit)."""
  return cond


def tail_pending(spec, g, i, ids, t, prim, extra, step, nb, acc):
  """After the tail keys are written: nothing pending (the block stays in the table and is
  promoted to its full key once cached past its end). `acc` = (aux, ncached, pend, n_rec)."""
  return acc


# ---------------------------------------------------------------------------------------------
# host-side cost model of FLOP-aware eviction (SPEC B2, `eviction_costs`, `alpha_tuning`)


def prefix_flops(spec, tokens, linear: float, quadratic: float):
  """F_g(L) = linear * L + quadratic * L^2 over `tokens` = L (float64)."""
  return linear * tokens + quadratic * tokens * tokens


def block_flops(spec, end, linear: float, quadratic: float):
  """FLOPs a hit on the block ending at `end` (float64) saves: its own tokens,
  F_g(E) - F_g(E - B)."""
  total = prefix_flops(spec, end, linear, quadratic)
  return total - prefix_flops(spec, end - spec.block_size, linear, quadratic)


def layer_costs(model, spec, block_size: int, share: float, lin_quad):
  """(linear, quadratic, bytes) of the full-attention layers a group of this kind stands for
  (`share` of them): the model's attention layers; bytes: the KV of `block_size` tokens."""
  a_lin, a_quad = lin_quad(model.attn_flops)
  own = model.kv_bytes_per_token * block_size * share
  return model.n_attn * a_lin, model.n_attn * a_quad, own
