"""Twin of `hybrid_cache.core.policies.flop_aware` (SPEC B2): the same integer utility.

Priority of the candidate of recency rank r among n: `1000 * rn + alpha_milli * en` with
`rn = (r << 14) // (n - 1)` (2^14 when n == 1) and `en = ((q - q_min) << 14) // (q_max - q_min)`
(2^14 when all equal), q = quantised FLOPs saved per byte of the block's group at its key's
token end (`eviction_costs.efficiency_table`). alpha = 0: not `active`, the list is left alone.
"""

from __future__ import annotations

import functools

import numpy as np

from hybrid_cache.config import CacheConfig
from hybrid_cache.core.eviction_costs import efficiency_table

NORM_BITS = 14


@functools.lru_cache(maxsize=64)
def _table(config: CacheConfig) -> np.ndarray:
  return efficiency_table(config)


def active(order) -> bool:
  return order.alpha_milli > 0


def priority(config: CacheConfig, blocks, order) -> list[int]:
  """Per candidate (in `blocks.candidates` order), the utility (module docstring)."""
  table = _table(config)
  bs = [g.block_size for g in config.resolved_groups]
  cand = blocks.candidates
  n = len(cand)

  def efficiency(b: int) -> int:
    g = blocks.group[b]
    col = min(max(blocks.token_end[b] // bs[g], 0), table.shape[1] - 1)
    return int(table[g][col])

  q = [efficiency(b) for b in cand]
  q_min = min(q, default=0)
  span = max(q, default=0) - q_min
  one = 1 << NORM_BITS
  out = []
  for r, qb in enumerate(q):
    rn = (r << NORM_BITS) // (n - 1) if n > 1 else one
    en = ((qb - q_min) << NORM_BITS) // span if span > 0 else one
    out.append(1000 * rn + order.alpha_milli * en)
  return out
