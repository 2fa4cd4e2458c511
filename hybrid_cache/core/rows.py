"""Row builders of the packed `CacheState` leaves: rows written by position from named columns.

`aux_columns` (`block_aux`), `group_columns` (`req_group`), `queue_rows` (`queue_key`), and the
row of an unkeyed block (`NO_KEY_AUX`, `no_key_aux`). The columns and their meaning: the
`hybrid_cache.core.state` module docstring. A builder stacks its columns in the order of their
constants, so no call site writes a raw column number.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_cache.core.state import AUX_CHAIN
from hybrid_cache.core.state import AUX_END
from hybrid_cache.core.state import AUX_HITS
from hybrid_cache.core.state import AUX_PINNED
from hybrid_cache.core.state import AUX_STEP
from hybrid_cache.core.state import NUM_AUX
from hybrid_cache.core.state import NUM_AUX_CHAIN
from hybrid_cache.core.state import NUM_RG
from hybrid_cache.core.state import NUM_RG_CHAIN
from hybrid_cache.core.state import Q_FREE
from hybrid_cache.core.state import Q_PINNED
from hybrid_cache.core.state import RG_CHAIN
from hybrid_cache.core.state import RG_LAST
from hybrid_cache.core.state import RG_LEN
from hybrid_cache.core.state import RG_NCACHED


def _by_position(columns: dict[int, jax.Array], axis: int) -> jax.Array:
  """`columns` ({position: array}, every position once) stacked along `axis` in position order."""
  return jnp.stack([columns[i] for i in range(len(columns))], axis=axis)


def aux_columns(step, pinned, end, hits=None, chain=None) -> jax.Array:
  """`block_aux` rows from their columns (each i32[...], `AUX_*` order): i32[..., NUM_AUX]
  without `hits` / `chain`, i32[..., NUM_AUX_CHAIN] with both (a chain-feature state)."""
  cols = {AUX_STEP: step, AUX_PINNED: pinned, AUX_END: end}
  if (hits is None) != (chain is None):
    raise ValueError("aux_columns: give both hits and chain (chain features) or neither")
  if hits is not None:
    cols.update({AUX_HITS: hits, AUX_CHAIN: chain})
  return _by_position(cols, axis=1)


def group_columns(length, ncached, last, chain=None) -> jax.Array:
  """A `req_group` row from its columns (each i32[G], `RG_*` order): i32[G, NUM_RG] without
  `chain`, i32[G, NUM_RG_CHAIN] with it (a chain-feature state)."""
  cols = {RG_LEN: length, RG_NCACHED: ncached, RG_LAST: last}
  if chain is not None:
    cols[RG_CHAIN] = chain
  return _by_position(cols, axis=1)


def queue_rows(free, pinned) -> jax.Array:
  """i32[NUM_QUEUES, NB]: `queue_key` from its rows (each i32[NB], `Q_*` order)."""
  return _by_position({Q_FREE: free, Q_PINNED: pinned}, axis=0)


# an unkeyed, unpinned block's `block_aux` row in a chain-feature state; its first `NUM_AUX`
# entries are the row of a state without them (`no_key_aux`)
NO_KEY_AUX = np.zeros(NUM_AUX_CHAIN, np.int32)
NO_KEY_AUX[[AUX_STEP, AUX_END, AUX_CHAIN]] = -1
NO_KEY_AUX.flags.writeable = False


def no_key_aux(chain: bool) -> np.ndarray:
  """i32[NUM_AUX] (i32[NUM_AUX_CHAIN] with the chain features): an unkeyed, unpinned block's
  `block_aux` row."""
  return NO_KEY_AUX[: NUM_AUX_CHAIN if chain else NUM_AUX]


def num_rg(chain: bool) -> int:
  """The width of `req_group`'s last axis (`NUM_RG_CHAIN` with the chain features)."""
  return NUM_RG_CHAIN if chain else NUM_RG
