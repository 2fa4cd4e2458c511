"""Full attention (vLLM §2.2): longest cached prefix, left to right; never frees early."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.core.groups.demand import BlockDemand
from hybrid_cache.core.groups.demand import grow_to
from hybrid_cache.core.groups.demand import target_blocks
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
