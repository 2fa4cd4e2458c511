"""The block-aligned chunk split (vLLM §4.3, `_mamba_block_aligned_split`).

`split` limits a request's chunk so that a recurrent (align-mode) group's state lands on a
block boundary: the chunk is floored to the scheduler block, and it stops at the prompt's
checkpoint position (`checkpoint_position`) so that the last full block of the prompt is kept.
"""

from __future__ import annotations

import jax.numpy as jnp

from hybrid_cache.core.layout import Layout
from hybrid_cache.core.state import BIG
from hybrid_cache.core.state import cdiv
from hybrid_cache.core.state import floor_to

# ---------------------------------------------------------------------------------------------
# block-aligned split (§4.3)


def checkpoint_position(num_tokens, unit: int, eagle: bool):
  """vLLM `get_mamba_prefill_checkpoint_position` (`hybrid_cache.twin.rules.checkpoint_position`):
  floor((N-1)/unit)*unit, EAGLE floor(N/unit)*unit - unit, never below 0."""
  if eagle:
    return jnp.maximum(floor_to(num_tokens, unit) - unit, 0)
  return jnp.maximum(floor_to(num_tokens - 1, unit), 0)


def split(lay: Layout, start, n, num_tokens, num_prompt, spb, max_chunk, cuts=()):
  """Tokens to schedule so chunk ends land where a recurrent state is cached (align mode).

  vLLM 0.33 `Scheduler._mamba_block_aligned_split`, the same rule as
  `hybrid_cache.twin.rules.block_aligned_split` (see there), on the scheduler block: a chunk
  ending before the prefill end is floored to the block unless that leaves nothing and the block is
  wider than `max_chunk` (the entry's cap, else the configured budget); then it stops at the
  earliest of the next block boundary (a chunk starting mid-block), the last cacheable
  boundary floor((N-1)/B)*B, the partial-tail boundary floor((P-1)/HBS)*HBS (partial hits),
  the block-floored junction, and (beyond vLLM) any of `cuts` (i32 token positions, `BIG` =
  none): where a stateful placement keeps a state (`chunk_cuts` of the placement policy, e.g.
  `adaptive`'s continuation point, `step.placement_cuts`), so that align mode computes it.
  Example (bs 4, 22-token prompt, no hit, n 22): 20, then 2.
  """
  if not lay.align_bs:
    return n
  bs = lay.sbs
  jbs = lay.config.junction_block_size  # bs (vLLM); the recurrent block with fine keys
  eagle = any(g.eagle for g in lay.groups)
  prefill_end = jnp.maximum(num_prompt, num_tokens - 1)
  decode = start >= prefill_end
  lcp = checkpoint_position(num_tokens, bs, eagle)  # last cacheable boundary (SPEC A8)
  end = start + n
  aligned = floor_to(end, bs)
  end = jnp.where((end < prefill_end) & ((aligned > start) | (bs <= max_chunk)), aligned, end)
  nxt = cdiv(start, bs) * bs
  cands = [
    jnp.where(start % bs != 0, nxt, BIG),
    lcp,
    jnp.where((start < spb) & (spb < end), start + floor_to(spb - start, jbs), BIG),
  ]
  if lay.partial:  # §2.5: a chunk stops at the prompt's last hash boundary (partial entry)
    tail = checkpoint_position(num_prompt, lay.hash_block_size, eagle)
    cands.append(jnp.where((lcp < tail) & (tail < num_prompt), tail, BIG))
  cands.extend(cuts)
  best = end
  for s in cands:
    best = jnp.where((s > start) & (s < best), s, best)
  return jnp.where(decode, n, jnp.maximum(best - start, 0))
