"""What a group needs to know to place its fresh blocks (`allocate.allocate_slots`).

`Placement` carries one request's numbers for one group after its hits are touched; each kind's
`place_blocks(spec, p)` returns a `Placed`; `fresh_blocks` is the rule shared by the kinds that
keep a table of consecutive blocks (full attention, sliding window, recurrent `all`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from hybrid_cache.core.state import cdiv


class Placement(NamedTuple):
  """One request slot, one group, in `allocate_slots` (vLLM §2.1-§2.4 `allocate_new_blocks`).

  Attributes:
    row: i32[MB], the group's table row (the hit blocks for a new request).
    pos: i32[MB], arange(MB).
    length: i32, blocks in the table before this allocation (the hit entries when new).
    len0: i32, `group_len[r, g]` before the step (0 for a new request).
    hits_len: i32, hit entries of a new request (0 for a running one).
    last: i32, `group_last[r, g]` (align's previous running-state block, -1 = none).
    main: i32, computed tokens after the step.
    need_tokens: i32, tokens the table must cover after the step (+ lookahead, capped at
      max_model_len).
    has_cow: bool, a copy-on-write block comes first in the group's pops (partial hits, §2.5);
      None without partial hits.
    num_spec_blocks: int (static), S lookahead blocks of speculative decoding.
    partial: bool (static), partial hits on.
  """

  row: jax.Array
  pos: jax.Array
  length: jax.Array
  len0: jax.Array
  hits_len: jax.Array
  last: jax.Array
  main: jax.Array
  need_tokens: jax.Array
  has_cow: jax.Array | None
  num_spec_blocks: int
  partial: bool


class Placed(NamedTuple):
  """A group's placement: its table row (align may move lookahead blocks), where its fresh
  blocks go (`base`: first table position, `count`: blocks popped for it, without the
  copy-on-write block), its `group_last` and its table length after the allocation."""

  row: jax.Array
  base: jax.Array
  count: jax.Array
  last: jax.Array
  length: jax.Array


def fresh_blocks(spec, p: Placement, extra_tokens: int = 0) -> Placed:
  """Consecutive blocks past the table's end up to cdiv(need_tokens + extra_tokens, B) blocks
  (vLLM §2.1 `get_num_blocks_to_allocate`); the row and `group_last` are unchanged."""
  target = cdiv(p.need_tokens + extra_tokens, spec.block_size)
  count = jnp.maximum(target - p.length, 0)
  return Placed(p.row, p.length, count, p.last, p.length + count)
