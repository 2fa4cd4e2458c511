"""Eviction `greedy_dual`: chain-aware GreedyDual-Size-Frequency over the free blocks.

Source: the simulator's `adaptive` eviction (`hybrid_cache/sim/chain_eviction.py`, issue 15),
GreedyDual-Size-Frequency (Cao & Irani, USENIX ITS 1997; Cherkasova 1998) with Marconi's
FLOPs-saved-per-byte value (M§1.4). Ported to the cache core's eviction seam in issue 28.

Rule. Each candidate (a keyed free block that can still be hit, `FreeBlocks`) has priority

  H = stamp + w,   w = min((1 + hits) * eff, 2^28),

lower evicted first, ties least recently freed first (the frame's rule). `stamp` is the
eviction clock L when the block's key was registered or last hit (`FreeBlocks.stamp`); L is
the largest priority evicted so far (the frame raises it to each evicted block's ranked
priority, `hybrid_cache.core.eviction`). So equal weights evict in LRU order, a block outlives
blocks accessed after it only by the margin of its weight, and L rises as the cache turns
over (an old block's hits and FLOPs count for less and less: GreedyDual's aging).
`eff` is the FLOPs a hit on the block saves per byte it frees, from T =
`eviction_costs.span_table` (the whole model's prefill FLOPs of [0, j u) per byte of group g's
block, quantised to 2^24; u the hash block): a recurrent state ending at E whose chain starts at
A (`FreeBlocks.chain_start`: the end of the previous state its request kept, what a hit falls
back to without it, the sim's a) has eff = T[g, E // u] - T[g, A // u], the FLOPs of [A, E) per
byte of its block. An attention block has its group's constant `block_span_eff` (the FLOPs of
one block at the prefix's start per byte): its own block's FLOPs grow with depth under
quadratic attention, which would rank a chain's shallow blocks first and break every deeper
hit; the sim never splits a chain (a unit is a leaf), so here a chain's KV blocks differ only
in hits and stamps (non-increasing with depth) and recency (a request frees tail first), and
go leaf first. `hits` = `FreeBlocks.hits`.

Deviations from `sim/chain_eviction.py` (exact integer rule instead, so both twins agree):
* alpha = 1 fixed (`ALPHA`; the sim's `hits/1`, `reach/1` weightings; its tuner picks among
  alpha 0, 1, 2 and priors, a separate piece of work). eff_ref, the sim's running mean of eff,
  is a fixed per-config reference (the largest F/bytes of the config): GreedyDual's order is
  invariant to scaling every weight by one constant, so this differs only in that the sim's
  mean drifts over the run, and in rounding.
* p_kind = 1 (the sim's prior "none": the core does not know a state's placement kind). On
  Mooncake this prior is the sim's main lever (1.26x over LRU on chains at 2e11; its branch
  points, where a request leaves everything seen, are hit ~100x as often per placed state as
  its input-end points), and the core, without it, is at 0.98x vLLM best (BENCHMARKS.md,
  section 3, "Why the core's `adaptive` is at 0.98x").
* The unit is a block, not a checkpoint with its leaf KV chain: a state is weighted by its
  span back to A over its own block's bytes (the sim's leaf unit also counts the KV bytes over
  [A, E); tried here, it ranked every state below the KV it needs and saved less: ShareGPT
  seed 0 at 2e9 0.83x vs 0.95x of LRU, Mooncake synthetic at 1e11 1.02x vs 1.04x, agentic seed
  0 at 3e9 1.24x vs 1.25x), an attention block by its group's constant. Chain awareness comes
  from A, from the constant KV weight (leaf first) and from the frame evicting dead states
  (KV prefix gone) first.
* Timing: priorities are ranked once per scheduler step (`eviction.prepare`); the clock rises
  at eviction to the priority the block was ranked with. A block freed after the step's
  ranking is not ranked: it goes to the queue's tail (after every ranked one) and does not
  raise the clock if evicted in that step. Stamps are set at registration and at each hit,
  as in the sim (`touch=True`); the sim's re-weighting of a unit whose shape changes has no
  analogue (a block's span is fixed at registration).
* Hits: each block of a hit counts one (`key_hits`), not only the deepest checkpoint.
* Fixed point: weights saturate at 2^28 and priorities at 2^30 (`PRIORITY_LIMIT`); the clock
  and the stamps drop by 2^28 when the clock passes 2^29 (`eviction.rebase_clock`), stamps
  floored at 0 (only blocks more than 2^28 below the clock can tie).

Reads the cost fields, the chain features and the clock (`Reads(costs, chain, clock)`).
Twin: `hybrid_cache/twin/policies/greedy_dual.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.core.eviction import FreeBlocks
from hybrid_cache.core.eviction_costs import block_span_eff
from hybrid_cache.core.eviction_costs import span_table
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.state import CacheState

ALPHA = 1  # the exponent of eff: fixed, the rule below is written for it (module docstring)
WEIGHT_LIMIT = 1 << 28  # w saturates here
PRIORITY_LIMIT = 1 << 30  # the frame's priority range [0, 2^30]


def priority(lay: Layout, state: CacheState, blocks: FreeBlocks) -> jax.Array:
  """i32[NB]: min(stamp + min((1 + hits) * eff, 2^28), 2^30) per candidate (module docstring);
  every product saturates without int32 overflow."""
  table = jnp.asarray(span_table(lay.config))
  kv = jnp.asarray(block_span_eff(lay.config))
  u = lay.config.resolved_hash_block_size
  last = table.shape[1] - 1
  g = jnp.clip(blocks.group, 0, lay.num_groups - 1)
  hi = table[g, jnp.clip(blocks.token_end // u, 0, last)]
  lo = table[g, jnp.clip(blocks.chain_start // u, 0, last)]
  eff = jnp.where(kv[g] >= 0, kv[g], jnp.maximum(hi - lo, 0))
  uses = jnp.clip(blocks.hits, 0, WEIGHT_LIMIT - 1) + 1
  # eff * uses > LIMIT  <=>  uses > LIMIT // eff (eff >= 1)
  over = uses > WEIGHT_LIMIT // jnp.maximum(eff, 1)
  w = jnp.where(over, WEIGHT_LIMIT, eff * uses)
  stamp = jnp.clip(blocks.stamp, 0, PRIORITY_LIMIT)
  return jnp.minimum(stamp, PRIORITY_LIMIT - w) + w
