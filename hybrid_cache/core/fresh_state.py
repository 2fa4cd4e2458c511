"""A config's fresh `CacheState`: every leaf at its initial value (`init_state`), the `params`
leaf from the config's runtime fields (`runtime_params`).

The leaves and their `*` column constants are documented in `state`; the shapes come from the
config's `layout.Layout` (padded pool, bucketed widths).
"""

from __future__ import annotations

import jax
import numpy as np

from hybrid_cache import policies
from hybrid_cache.config import CacheConfig
from hybrid_cache.core.layout import WAYS
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.layout import derive_layout
from hybrid_cache.core.layout import layout
from hybrid_cache.core.params import NUM_PARAMS
from hybrid_cache.core.params import P_ALL_TAIL
from hybrid_cache.core.params import P_BYTE_BUDGET
from hybrid_cache.core.params import P_FIRST_SLOT
from hybrid_cache.core.params import P_FULL_FIT
from hybrid_cache.core.params import P_JUNCTION
from hybrid_cache.core.params import P_MAX_BATCHED
from hybrid_cache.core.params import P_MAX_MODEL_LEN
from hybrid_cache.core.params import P_NUM_BLOCKS
from hybrid_cache.core.params import P_PAGE_BYTES
from hybrid_cache.core.params import P_PIN_MIN_DROP
from hybrid_cache.core.params import P_RETENTION
from hybrid_cache.core.params import P_SLOT_BYTES
from hybrid_cache.core.params import P_WATERMARK
from hybrid_cache.core.params import RETENTION_NONE
from hybrid_cache.core.rows import no_key_aux
from hybrid_cache.core.rows import num_rg
from hybrid_cache.core.state import BIG
from hybrid_cache.core.state import C_HEAD
from hybrid_cache.core.state import C_PIN
from hybrid_cache.core.state import C_TAIL
from hybrid_cache.core.state import HASH_LANES
from hybrid_cache.core.state import NUM_COUNTERS
from hybrid_cache.core.state import NUM_IDX
from hybrid_cache.core.state import NUM_INFO
from hybrid_cache.core.state import NUM_QUEUES
from hybrid_cache.core.state import Q_FREE
from hybrid_cache.core.state import RG_LAST
from hybrid_cache.core.state import CacheState


def runtime_params(config: CacheConfig) -> np.ndarray:
  """i32[NUM_PARAMS]: the `params` leaf of `config` (`P_*` columns, `state` module
  docstring)."""
  p = np.zeros(NUM_PARAMS, np.int32)
  r = config.retention_interval
  p[P_NUM_BLOCKS] = config.pool_size
  p[P_FIRST_SLOT] = config.num_blocks
  if config.byte_budget is not None:
    p[P_PAGE_BYTES] = config.page_bytes
    p[P_SLOT_BYTES] = config.slot_bytes
    p[P_BYTE_BUDGET] = config.byte_budget
  p[P_MAX_BATCHED] = config.max_num_batched_tokens
  p[P_MAX_MODEL_LEN] = config.max_model_len
  p[P_WATERMARK] = config.watermark_blocks
  p[P_FULL_FIT] = int(config.full_sequence_must_fit)
  p[P_RETENTION] = RETENTION_NONE if r is None else r
  p[P_PIN_MIN_DROP] = config.pin_min_drop_size
  p[P_JUNCTION] = int(config.marconi_junction)
  p[P_ALL_TAIL] = int(config.free_order == "all_tail")
  return p


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
  qk = np.full((NUM_QUEUES, nb), BIG, np.int32)
  qk[Q_FREE, 1:real] = np.arange(1, real, dtype=np.int32)
  counters = np.zeros(NUM_COUNTERS, np.int32)
  counters[C_HEAD] = 1  # smallest key in use; head insertions go below it
  counters[C_TAIL] = real  # next tail key
  counters[C_PIN] = 0
  # the chain-feature columns only for a policy that reads them (`Layout.chain_features`)
  aux = np.tile(no_key_aux(lay.chain_features), (nb, 1))
  rg = np.zeros((r, g, num_rg(lay.chain_features)), np.int32)
  rg[:, :, RG_LAST] = -1
  state = CacheState(
    ref_cnt=np.zeros((nb,), np.int32),
    queue_key=qk,
    block_group=np.full((nb,), -1, np.int32),
    block_hash=np.zeros((nb, HASH_LANES), np.uint32),
    block_aux=aux,
    index_entry=np.full((lay.buckets, WAYS, NUM_IDX), -1, np.int32),
    index_hash=np.zeros((lay.buckets, WAYS, HASH_LANES), np.uint32),
    tables=np.zeros((r, g, lay.max_blocks), np.int32),
    req_hashes=np.zeros((r, lay.max_hashes, HASH_LANES), np.uint32),
    req_info=np.zeros((r, NUM_INFO), np.int32),
    req_group=rg,
    counters=counters,
    req_partial=np.zeros((r, g if lay.partial else 0), np.int32),
    params=runtime_params(config),
    policy_state=np.zeros(policy_state_shape(config, lay), np.int32),
  )
  return jax.device_put(state)


def policy_state_shape(config: CacheConfig, lay: Layout) -> tuple[int, int]:
  """(R, S): the `policy_state` leaf's shape (`state` module docstring)."""
  policy = policies.core_policy("admission", config.admission)
  if policy is None:
    return (0, 0)
  return (len(lay.recurrent_groups), policy.STATE_SIZE)
