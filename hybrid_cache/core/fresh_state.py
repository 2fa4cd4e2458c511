"""A config's fresh `CacheState`: every leaf at its initial value (`init_state`).

The leaves and their named rows and columns are documented in `state` (the `params` leaf:
`params.runtime_params`); the shapes come from the config's `layout.Layout` (padded pool,
bucketed widths).
"""

from __future__ import annotations

import jax
import numpy as np

from hybrid_cache import policies
from hybrid_cache.config import CacheConfig
from hybrid_cache.core import access_history
from hybrid_cache.core.layout import WAYS
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.layout import derive_layout
from hybrid_cache.core.layout import layout
from hybrid_cache.core.params import runtime_params
from hybrid_cache.core.state import BIG
from hybrid_cache.core.state import BlockAux
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import Counters
from hybrid_cache.core.state import HashLanes
from hybrid_cache.core.state import IndexEntry
from hybrid_cache.core.state import QueueKeys
from hybrid_cache.core.state import QueueOrder
from hybrid_cache.core.state import ReqGroup
from hybrid_cache.core.state import ReqInfo


def init_state(config: CacheConfig, bucketed: bool = True) -> CacheState:
  """A fresh state: every block but the null block 0 free, in id order; no keys, no requests.

  The arrays have the shapes of `layout(config)` (padded pool, bucketed widths); the padding
  ids past `config.pool_size` are never free. `bucketed=False`: the config's own shapes
  (no padding; for unit tests of the pool and index primitives, which read sizes from the
  arrays; the jitted entry points need the bucketed state). Built in NumPy and transferred
  once (no per-shape programs to compile).
  """
  lay = layout(config) if bucketed else derive_layout(config)
  nb, g, r = lay.num_blocks, lay.num_groups, lay.max_requests
  real = config.pool_size  # pages, then state slots (`CacheConfig.state_slots`)
  qk = np.full((QueueKeys.width(), nb), BIG, np.int32)
  qk = QueueKeys(qk)[1:real].set(free=np.arange(1, real, dtype=np.int32))
  # a re-keying policy's recency row starts as the free-queue keys (`eviction`: lazy order)
  order = np.full((QueueOrder.width(lay.rekeys), nb), BIG, np.int32)
  if lay.rekeys:
    order = QueueOrder(order).set(recency=QueueKeys(qk).free)
  counters = Counters(np.zeros(Counters.width(), np.int32)).set(
    head_key=1,  # smallest key in use; head insertions go below it
    tail_key=real,  # next tail key
    pin_key=0,
    order_exact=BIG,  # no lazy region (`eviction`: lazy order)
  )
  # the chain-feature columns only for a policy that reads them (`Layout.chain_features`)
  aux = np.tile(
    BlockAux.no_key(lay.chain_features, lay.eviction_clock, lay.access_history), (nb, 1)
  )
  rg = np.zeros((r, g, ReqGroup.width(lay.chain_features)), np.int32)
  rg = ReqGroup(rg).set(last=-1)
  lanes = HashLanes.width()
  state = CacheState(
    ref_cnt=np.zeros((nb,), np.int32),
    queue_key=qk,
    block_group=np.full((nb,), -1, np.int32),
    block_hash=np.zeros((nb, lanes), np.uint32),
    block_aux=aux,
    index_entry=np.full((lay.buckets, WAYS, IndexEntry.width()), -1, np.int32),
    index_hash=np.zeros((lay.buckets, WAYS, lanes), np.uint32),
    tables=np.zeros((r, g, lay.max_blocks), np.int32),
    req_hashes=np.zeros((r, lay.max_hashes, lanes), np.uint32),
    req_info=np.zeros((r, ReqInfo.width()), np.int32),
    req_group=rg,
    counters=counters,
    req_partial=np.zeros((r, g if lay.partial else 0), np.int32),
    params=runtime_params(config),
    policy_state=np.zeros(policy_state_shape(config, lay), np.int32),
    queue_order=order,
  )
  return jax.device_put(state)


def policy_columns(config: CacheConfig, lay: Layout) -> tuple[int, int, int, int]:
  """Columns of `policy_state` per recurrent group, in order: the admission policy's
  `STATE_SIZE`, a stateful placement policy's `state_size(lay)`, a retirement policy's
  `state_size(lay)`, the access history's (`access_history.width`, in row 0 only, with an
  eviction policy that reads it: `Layout.access_history`) (0 each for a seam without state)."""
  admission = policies.core_policy("admission", config.admission)
  placement = policies.core_policy("placement", config.placement)
  retirement = policies.core_policy("retirement", config.retirement)
  adm = 0 if admission is None else admission.STATE_SIZE
  place = placement.state_size(lay) if hasattr(placement, "state_size") else 0
  ret = 0 if retirement is None else retirement.state_size(lay)
  hist = access_history.width(lay.max_requests, lay.num_groups) if lay.access_history else 0
  return adm, place, ret, hist


def policy_state_shape(config: CacheConfig, lay: Layout) -> tuple[int, int]:
  """(R, S): the `policy_state` leaf's shape (`state` module docstring): the admission
  policy's `STATE_SIZE` columns, then a stateful placement policy's `state_size(lay)`, then
  a retirement policy's, then the access history's (`policy_columns`; R >= 1 with the
  history, whose columns are in row 0)."""
  size = sum(policy_columns(config, lay))
  if size == 0:
    return (0, 0)
  if lay.access_history:
    return (max(len(lay.recurrent_groups), 1), size)
  return (len(lay.recurrent_groups), size)
