"""Twin of `hybrid_cache.core.policies.tuned`: `greedy_dual`'s or `lru2`'s priority by the
order's weighting (`EvictionOrder.weighting`, the core's `CacheState.eviction_weighting`: 0 =
GreedyDual, 1 = LRU-2); the clock rises only under GreedyDual (`clock_priority`). The rule and
its source are documented there."""

from __future__ import annotations

from hybrid_cache import policies
from hybrid_cache.config import CacheConfig
from hybrid_cache.twin.policies import greedy_dual
from hybrid_cache.twin.policies import lru2

WEIGHTINGS = policies.TUNED_WEIGHTINGS  # index = `EvictionOrder.weighting`
GREEDY_DUAL, LRU2 = (WEIGHTINGS.index(w) for w in ("greedy_dual", "lru2"))


def priority(config: CacheConfig, blocks, order) -> list[int]:
  """Per candidate (`blocks.candidates` order): the priority of the order's weighting."""
  if order.weighting == LRU2:
    return lru2.priority(config, blocks, order)
  return greedy_dual.priority(config, blocks, order)


def clock_priority(order, prio: list[int]) -> list[int]:
  """Per candidate: what it may raise the clock to when evicted (0 under LRU-2)."""
  return [0] * len(prio) if order.weighting == LRU2 else list(prio)
