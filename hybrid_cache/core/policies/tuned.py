"""Eviction `tuned`: GreedyDual or LRU-2, chosen at run time, for `adaptive`'s online re-tuning.

Source: the simulator's `adaptive` re-tunes its eviction weighting online
(`hybrid_cache/sim/eviction_weightings.py`: shadow caches replay the same requests under fixed
weightings, and every `RETUNE_EVERY` requests the live cache takes the weighting of the shadow
that saved the most FLOPs recently). In the cache core two weightings carry it: `greedy_dual`
(`policies/greedy_dual.py`, the unit cache's hits/1; best on agentic traces) and `lru2`
(`policies/lru2.py` with its KV owners, the unit cache's LRU-2; best on chat sessions),
BENCHMARKS.md section 3. This policy keeps both policies' bookkeeping (the chain features,
the eviction clock, the access history and the KV owners: `Reads(costs, chain, clock,
history)`) and ranks by the one `CacheState.eviction_weighting` names (`GREEDY_DUAL` = 0, the
default, or `LRU2` = 1; `set_weighting`, a host call); the simulator's tuner
(`hybrid_cache.sim.core_scan`, `run_scan` with eviction `tuned`, with constants of its own:
every 64 requests, score half-life 256) runs the shadows and sets it.

Switching. Both rankings read fields the core keeps current whatever the weighting, so a
switch takes effect at the next step's ranking (the unit cache re-weights its heap at a switch,
`UnitCache.retune`, for the same effect). GreedyDual's clock rises only while GreedyDual ranks
(`clock_priority`: under LRU-2 no block is ranked on the clock, so evictions leave it, and keys
registered meanwhile are stamped with the clock where it stopped), as the unit cache's clock
stays put under LRU-2 (`chain_eviction.py`).

Twin: `hybrid_cache/twin/policies/tuned.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache import policies
from hybrid_cache.core.eviction import FreeBlocks
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.policies import greedy_dual
from hybrid_cache.core.policies import lru2
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import Counters

WEIGHTINGS = policies.TUNED_WEIGHTINGS  # index = the value of `eviction_weighting`
GREEDY_DUAL, LRU2 = (WEIGHTINGS.index(w) for w in ("greedy_dual", "lru2"))


def set_weighting(state: CacheState, name: str) -> CacheState:
  """`state` ranking by weighting `name` (one of `WEIGHTINGS`) from its next step (host call;
  pure). ValueError naming the allowed ones otherwise."""
  w = policies.tuned_weighting(name)
  return state.replace(counters=Counters(state.counters).set(eviction_weighting=w))


def weighting(state: CacheState) -> str:
  """The name of the weighting `state` ranks by (host call)."""
  return WEIGHTINGS[int(jax.device_get(state.eviction_weighting))]


def priority(lay: Layout, state: CacheState, blocks: FreeBlocks) -> jax.Array:
  """i32[NB]: `greedy_dual`'s priority, or `lru2`'s when the state's weighting is LRU-2."""
  gd = greedy_dual.priority(lay, state, blocks)
  return jnp.where(state.eviction_weighting == LRU2, lru2.priority(lay, state, blocks), gd)


def clock_priority(state: CacheState, ranked: jax.Array) -> jax.Array:
  """i32[NB]: what each ranked block may raise GreedyDual's clock to when evicted: its ranked
  priority under GreedyDual, 0 (nothing) under LRU-2."""
  return jnp.where(state.eviction_weighting == LRU2, 0, ranked)
