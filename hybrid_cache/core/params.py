"""The `params` leaf of `CacheState`: a config's runtime parameters, by name.

`CacheState.params` is i32[NUM_PARAMS], columns `P_*`, written once by `runtime_params` and
never changed; the core reads them inside jit instead of the config, so that configs differing
only in them share compiled programs (`compile_cache.compile_key`). Their meaning: the `state`
module docstring. This is the one module that uses the `P_*` positions: `runtime_params` packs
them, `ParamViews` names each column; `CacheState` inherits it (each view is `params[P_*]`).
"""

from __future__ import annotations

import jax
import numpy as np

from hybrid_cache.config import CacheConfig

# params columns (`runtime_params`)
(
  P_NUM_BLOCKS,
  P_MAX_BATCHED,
  P_MAX_MODEL_LEN,
  P_WATERMARK,
  P_FULL_FIT,
  P_RETENTION,
  P_PIN_MIN_DROP,
  P_JUNCTION,
  P_ALL_TAIL,
  P_FIRST_SLOT,
  P_PAGE_BYTES,
  P_SLOT_BYTES,
  P_BYTE_BUDGET,
) = range(13)
NUM_PARAMS = 13
RETENTION_NONE = -1  # params[P_RETENTION] for retention_interval None (dense)


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


class ParamViews:
  """Named views of the `params` leaf (i32 scalars, never changed after `init_state`)."""

  params: jax.Array

  @property
  def num_real_blocks(self) -> jax.Array:
    """The config's `pool_size` (`num_blocks` + `state_slots`): ids [0, num_real_blocks)
    are the real pool(s), the rest of the (padded) pool arrays is padding."""
    return self.params[P_NUM_BLOCKS]

  @property
  def first_slot(self) -> jax.Array:
    """The first state-slot id (`CacheConfig.num_blocks`): with a second pool
    (`Layout.state_pool`) ids [first_slot, num_real_blocks) are state slots."""
    return self.params[P_FIRST_SLOT]

  @property
  def page_bytes(self) -> jax.Array:
    """What a page occupies of `byte_budget` (`CacheConfig.page_bytes`)."""
    return self.params[P_PAGE_BYTES]

  @property
  def slot_bytes(self) -> jax.Array:
    """What a state slot occupies of `byte_budget` (`CacheConfig.slot_bytes`)."""
    return self.params[P_SLOT_BYTES]

  @property
  def byte_budget(self) -> jax.Array:
    """The budget the two pools share (`CacheConfig.byte_budget`), 0 = none."""
    return self.params[P_BYTE_BUDGET]

  @property
  def max_batched_tokens(self) -> jax.Array:
    """The token budget of a scheduler step (`max_num_batched_tokens`)."""
    return self.params[P_MAX_BATCHED]

  @property
  def max_model_len(self) -> jax.Array:
    """The config's `max_model_len`."""
    return self.params[P_MAX_MODEL_LEN]

  @property
  def watermark_blocks(self) -> jax.Array:
    """Blocks an admission must leave free while other requests run."""
    return self.params[P_WATERMARK]

  @property
  def full_sequence_must_fit(self) -> jax.Array:
    """1 = an admission needs blocks for its whole sequence, 0 = for its first chunk."""
    return self.params[P_FULL_FIT]

  @property
  def retention_interval(self) -> jax.Array:
    """The config's `retention_interval`, `RETENTION_NONE` (-1) for None (dense)."""
    return self.params[P_RETENTION]

  @property
  def pin_min_drop_size(self) -> jax.Array:
    """Fewest blocks a window drop must release for its blocks to be pinned."""
    return self.params[P_PIN_MIN_DROP]

  @property
  def marconi_junction(self) -> jax.Array:
    """1 = admissions record the shared-prefix boundary (`req_spb`), else 0."""
    return self.params[P_JUNCTION]

  @property
  def free_all_tail(self) -> jax.Array:
    """1 = `free_order="all_tail"`: blocks without a key are freed to the tail too."""
    return self.params[P_ALL_TAIL]
