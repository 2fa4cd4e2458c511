"""What a group needs to know to count the blocks an allocation takes (`admission`).

`BlockDemand` carries one request's numbers for one group; `grow_to` is the count shared by the
kinds that keep a table of consecutive blocks (full attention, sliding window, recurrent `all`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import cdiv


class BlockDemand(NamedTuple):
  """One request slot `r`, one group `g`, at admission (`is_new`) or while running.

  Attributes:
    state: the cache state.
    r, g: the request slot and the group index.
    is_new: bool, the request is being admitted (its hit counts) rather than running.
    hit: i32, the reconciled hit in tokens (new requests).
    length: i32, blocks in the group's table now (running requests).
    hits_len: i32, hit entries of the group (cdiv(hit, B) with partial hits, else hit // B).
    part: i32 0/1, one more block for a partial hit's copy-on-write (§2.5).
    hit_ids: i32[MB], the group's hit blocks kept after skipping.
    need_tokens: i32, tokens the table must cover after the step (+ lookahead).
    main_tokens: i32, computed tokens after the step.
    num_spec_blocks: int (static), S lookahead blocks of speculative decoding.
    partial: bool (static), partial hits on.
    swa_cap: bool (static), cap window groups at their per-request worst case.
  """

  state: CacheState
  r: jax.Array
  g: int
  is_new: jax.Array
  hit: jax.Array
  length: jax.Array
  hits_len: jax.Array
  part: jax.Array
  hit_ids: jax.Array
  need_tokens: jax.Array
  main_tokens: jax.Array
  num_spec_blocks: int
  partial: bool
  swa_cap: bool


def grow_to(spec, d: BlockDemand, target, skip) -> jax.Array:
  """Blocks to allocate so the table reaches `target` blocks: a new request past its hits (or
  its skipped blocks), a running one past its length; + the copy-on-write block."""
  k_new = jnp.maximum(target - jnp.maximum(skip, d.hits_len), 0)
  k_run = jnp.maximum(target - d.length, 0)
  k = jnp.where(d.is_new, k_new, k_run)
  return k + d.part if d.partial else k


def target_blocks(spec, d: BlockDemand, extra_tokens: int = 0) -> jax.Array:
  """Blocks that cover `need_tokens` + `extra_tokens` (recurrent `all`: the S lookahead blocks)."""
  return cdiv(d.need_tokens + extra_tokens, spec.block_size)
