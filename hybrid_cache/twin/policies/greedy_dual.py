"""Twin of `hybrid_cache.core.policies.greedy_dual`: chain-aware GreedyDual, same integers.

Priority = min(stamp + w, 2^30), w = min((1 + hits) * eff, 2^28); eff = the group's constant
`eviction_costs.block_span_eff` for an attention block, else T[g, E // u] - T[g, A // u] floored
at 0 (T = `eviction_costs.span_table`, u the hash block, E the key's token end, A its chain
start; indices clipped to the table); hits clipped to [0, 2^28 - 1], stamp clipped to
[0, 2^30], exactly as the core.
"""

from __future__ import annotations

import functools

import numpy as np

from hybrid_cache.config import CacheConfig
from hybrid_cache.core.eviction_costs import block_span_eff
from hybrid_cache.core.eviction_costs import span_table

WEIGHT_LIMIT = 1 << 28
PRIORITY_LIMIT = 1 << 30


@functools.lru_cache(maxsize=64)
def _table(config: CacheConfig) -> np.ndarray:
  return span_table(config)


@functools.lru_cache(maxsize=64)
def _kv(config: CacheConfig) -> np.ndarray:
  return block_span_eff(config)


def priority(config: CacheConfig, blocks, order) -> list[int]:
  """Per candidate (in `blocks.candidates` order): its GreedyDual priority (module docstring)."""
  table, kv = _table(config), _kv(config)
  u = config.resolved_hash_block_size
  last = table.shape[1] - 1
  ng = table.shape[0]
  out = []
  for b in blocks.candidates:
    g = min(max(blocks.group[b], 0), ng - 1)
    if kv[g] >= 0:  # an attention block: its group's constant
      eff = int(kv[g])
    else:  # a recurrent state: its span back to the previous state
      hi = int(table[g, min(max(blocks.token_end[b] // u, 0), last)])
      lo = int(table[g, min(max(blocks.chain_start[b] // u, 0), last)])
      eff = max(hi - lo, 0)
    uses = min(max(blocks.hits[b], 0), WEIGHT_LIMIT - 1) + 1
    w = min(eff * uses, WEIGHT_LIMIT)
    stamp = min(max(blocks.stamp[b], 0), PRIORITY_LIMIT)
    out.append(min(stamp + w, PRIORITY_LIMIT))
  return out
