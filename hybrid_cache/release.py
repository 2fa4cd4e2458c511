"""Releasing a request's blocks when it finishes or is preempted (vLLM §1.6, SPEC B1).

Pure and jittable; `scheduler.release_request` is the jitted entry point.
"""

from __future__ import annotations

import jax.numpy as jnp

from hybrid_cache import block_pool
from hybrid_cache.config import CacheConfig
from hybrid_cache.state import INFO_COMPUTED
from hybrid_cache.state import INFO_SPB
from hybrid_cache.state import INFO_STATUS
from hybrid_cache.state import RG_LAST
from hybrid_cache.state import STATUS_WAITING
from hybrid_cache.state import CacheState
from hybrid_cache.state import Layout


def release(lay: Layout, config: CacheConfig, state: CacheState, slot, preempt: bool) -> CacheState:
  """Frees a request's blocks tail first (group by group); preempt keeps it waiting."""
  rows = state.tables[slot][:, ::-1]
  batch = jnp.repeat(jnp.arange(lay.num_groups, dtype=jnp.int32), lay.max_blocks)
  state = block_pool.free_ordered(state, rows.reshape(-1), batch)
  rg = jnp.zeros_like(state.req_group[slot]).at[:, RG_LAST].set(-1)
  info = state.req_info[slot]
  if preempt:
    info = info.at[INFO_STATUS].set(STATUS_WAITING).at[INFO_COMPUTED].set(0).at[INFO_SPB].set(0)
  else:
    info = jnp.zeros_like(info)
  state = state.replace(
    tables=state.tables.at[slot].set(0),
    req_group=state.req_group.at[slot].set(rg),
    req_info=state.req_info.at[slot].set(info),
  )
  if not preempt:
    state = state.replace(req_hashes=state.req_hashes.at[slot].set(0))
  return state
