"""The plain-Python twin's entry points over a whole step or the whole pool.

Jitted twin: `core/scheduler.py` (`schedule_step`, `reset_prefix_cache`, `pool_stats`). A step
first lets a registered eviction policy re-order the free queue (`twin/eviction.py`, core
`eviction.prepare`), then runs its entries in list order (`step.schedule_one`), so a later
entry sees the keys an earlier one registered in the same step (§2.4.6); the partial-hit
copies queued during the step run first and their retention is released at its end (§2.5).
"""

from __future__ import annotations

from collections.abc import Sequence

from hybrid_cache.twin import allocate
from hybrid_cache.twin import block_pool
from hybrid_cache.twin import eviction
from hybrid_cache.twin import step
from hybrid_cache.twin.state import TwinState
from hybrid_cache.types import PoolStats
from hybrid_cache.types import ScheduleEntry
from hybrid_cache.types import StepResult


def schedule_step(s: TwinState, entries: Sequence[ScheduleEntry]) -> StepResult:
  """One scheduler step over validated entries (active requests, each at most once)."""
  s.step += 1  # the core's `clock`
  if s.evict is not None:  # a registered eviction policy re-orders the free list
    groups = [None if k is None else k[1] for k in s.key]
    dead = eviction.dead_states(s.config, s.key, s.key_end, s.index)
    if s.evict.clocked:  # GreedyDual's clock: rebased, then each candidate's rank recorded
      s.evict_clock, s.stamp = eviction.rebase_clock(s.evict_clock, s.stamp)
    s.free = s.evict.reorder(
      s.free, groups, s.key_end, dead, s.hits, s.chain, s.stamp, s.penult, s.owner
    )
    if s.evict.clocked:
      s.ranked = [s.evict.ranked.get(b, 0) for b in range(len(s.ranked))]
  s.cached_this_step.clear()
  budget = s.config.max_num_batched_tokens
  out, copies = [], []
  for e in entries:
    res, cps, n = step.schedule_one(s, e, budget)
    budget -= n
    out.append(res)
    copies.extend(cps)
  copies[0:0] = allocate.release_cow(s)  # CoW copies run first (§2.5); retention released
  return StepResult(tuple(out), tuple(copies))


def reset_prefix_cache(s: TwinState) -> bool:
  """Drops every key when no block is held (vLLM `reset_prefix_cache`); False otherwise."""
  if block_pool.num_free(s) != s.config.pool_size - 1:
    return False
  block_pool.demote(s, len(s.pinned_free))
  s.index.clear()
  s.extra.clear()
  s.key = [None] * s.config.pool_size
  s.hits = [0] * s.config.pool_size
  s.chain = [-1] * s.config.pool_size
  s.stamp = [0] * s.config.pool_size  # the eviction clock itself stays
  s.ranked = [0] * s.config.pool_size
  s.last = [0] * s.config.pool_size
  s.penult = [0] * s.config.pool_size
  s.owner = [-1] * s.config.pool_size
  s.pinned = [False] * s.config.pool_size
  s.cached_this_step.clear()
  return True


def pool_stats(s: TwinState) -> PoolStats:
  """Free, used, free cached and pinned blocks; keyed blocks per group."""
  ng = len(s.groups)
  per_group = [0] * ng
  for key in s.key:
    if key is not None:
      per_group[key[1]] += 1
  free = block_pool.num_free(s)
  free_cached = sum(1 for b in s.free + s.pinned_free if s.key[b] is not None)
  return PoolStats(
    num_free_blocks=free,
    num_used_blocks=s.config.pool_size - 1 - free,
    num_free_cached_blocks=free_cached,
    cached_blocks_per_group=tuple(per_group),
    num_pinned_blocks=len(s.pinned_free),
  )
