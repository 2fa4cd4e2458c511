"""FLOP-aware eviction (SPEC B2, Marconi M§1.4): FLOPs saved per byte, weighed with recency.

Each candidate's priority is `1000 * rn + alpha_milli * en`, where
`rn = floor(r * 2^14 / (n - 1))` is the min-max normalised recency rank r (0 = least recently
freed) among the n candidates and `en = floor((q - q_min) * 2^14 / (q_max - q_min))` the
normalised efficiency q (FLOPs saved per byte of the block's group at its key's token end,
`eviction_costs.efficiency_table`); a single candidate or all-equal values normalise to 2^14
(Marconi's `_normalize`). Integer arithmetic only, so the twin
(`hybrid_cache.twin.policies.flop_aware`) agrees exactly. alpha = 0 (`CacheState.alpha_milli`)
leaves the queue alone: exactly LRU. alpha is the policy's runtime parameter, held in the state
(`set_alpha` / `get_alpha`; tuned online by `alpha_tuning`).

Known limitation: the utility is per block and blind to prefix chains; see
`hybrid_cache.core.eviction`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.core.eviction import NORM
from hybrid_cache.core.eviction import FreeBlocks
from hybrid_cache.core.eviction import scaled_ratio
from hybrid_cache.core.eviction_costs import ALPHA_MILLI_MAX
from hybrid_cache.core.eviction_costs import alpha_milli
from hybrid_cache.core.eviction_costs import efficiency_table
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.state import BIG
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import Counters


def set_alpha(state: CacheState, alpha: float) -> CacheState:
  """The state with the FLOP-aware weight alpha, stored in thousandths in
  `CacheState.alpha_milli` (host call; pure, returns a new state). ValueError unless alpha is a
  number in [0, 100] (`eviction_costs.alpha_milli`)."""
  return state.replace(counters=Counters(state.counters).set(alpha_milli=alpha_milli(alpha)))


def get_alpha(state: CacheState) -> float:
  """The FLOP-aware weight alpha the state holds (host call)."""
  return int(jax.device_get(state.alpha_milli)) / 1000.0


def _alpha(state: CacheState) -> jax.Array:
  return jnp.clip(state.alpha_milli, 0, ALPHA_MILLI_MAX)


def active(state: CacheState) -> jax.Array:
  """Re-order only when alpha > 0 (alpha = 0 is vLLM's LRU order, untouched)."""
  return _alpha(state) > 0


def priority(lay: Layout, state: CacheState, blocks: FreeBlocks) -> jax.Array:
  """i32[NB]: `1000 * rn + alpha_milli * en` per candidate (module docstring)."""
  alive, n, r = blocks.candidate, blocks.num_candidates, blocks.recency
  table = jnp.asarray(efficiency_table(lay.config))
  bs = jnp.asarray([g.block_size for g in lay.groups], jnp.int32)
  g_safe = jnp.clip(blocks.group, 0, lay.num_groups - 1)
  col = jnp.clip(blocks.token_end // bs[g_safe], 0, table.shape[1] - 1)
  q = table[g_safe, col]
  q_min = jnp.min(jnp.where(alive, q, BIG))
  q_max = jnp.max(jnp.where(alive, q, -1))
  span = q_max - q_min
  r_c = jnp.clip(r, 0, jnp.maximum(n - 1, 0))
  rn = jnp.where(n > 1, scaled_ratio(r_c, jnp.maximum(n - 1, 1)), NORM)
  q_c = jnp.clip(q - q_min, 0, jnp.maximum(span, 0))
  en = jnp.where(span > 0, scaled_ratio(q_c, jnp.maximum(span, 1)), NORM)
  return 1000 * rn + _alpha(state) * en
