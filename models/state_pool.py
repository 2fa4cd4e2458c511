"""Gather initial states from, and scatter final/checkpoint states into, a block-indexed pool.

A pool is `[num_blocks, *state_shape]`; ids < 0 mean "none": reads give zeros, writes are
dropped. Writes use scatters with `mode="drop"` (an id of -1 is mapped past the end), so a
donated pool is updated in place.

`layer`: the model keeps every layer's pool in one stacked array `[L, num_blocks, *S]`; with
`layer = l` the functions read and write layer l's rows of the stacked array directly. Slicing
the layer out first (`pools[l]`) and writing it back (`pools.at[l].set(...)`) made XLA copy the
layer's whole pool twice per step: a fixed cost that grew with the pool, not with the step's
tokens (mid-size model on CPU, a 64-token step of a GDN-only model: 121 ms at 64 blocks, 364 ms
at 640; `BENCHMARKS.md`, "Serving").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def read_states(pool: jax.Array, ids: jax.Array, layer: int | None = None) -> jax.Array:
  """pool [NB, *S] (or [L, NB, *S] with `layer`), ids int32[N] -> [N, *S]; rows with id < 0
  are zeros."""
  rows = pool[jnp.maximum(ids, 0)] if layer is None else pool[layer, jnp.maximum(ids, 0)]
  mask = (ids >= 0).reshape((-1,) + (1,) * (rows.ndim - 1))
  return jnp.where(mask, rows, jnp.zeros_like(rows))


def _drop_index(ids: jax.Array, num_blocks: int) -> jax.Array:
  return jnp.where(ids >= 0, ids, num_blocks)


def write_states(
  pool: jax.Array,
  final_ids: jax.Array,
  final: jax.Array,
  ckpt_ids: jax.Array | None = None,
  ckpts: jax.Array | None = None,
  ckpt_counts: jax.Array | None = None,
  layer: int | None = None,
) -> jax.Array:
  """Writes checkpoints, then final states (a final state wins over a checkpoint on one id).

  Args:
    pool: [NB, *S], or the stacked [L, NB, *S] whose layer `layer` is written.
    final_ids: int32[N]; final: [N, *S].
    ckpt_ids: int32[N, M] (or None); ckpts: [N, M', *S] with M' >= M (extra columns are
      ignored); ckpt_counts: int32[N], checkpoints actually produced per sequence (columns
      j >= count are not written even if their id is set).
    layer: see the module docstring.
  Returns:
    The updated pool.
  """
  nb = pool.shape[0 if layer is None else 1]

  def scatter(pool, ids, vals):
    vals = vals.astype(pool.dtype)
    if layer is None:
      return pool.at[ids].set(vals, mode="drop")
    return pool.at[layer, ids].set(vals, mode="drop")

  if ckpt_ids is not None and ckpt_ids.shape[1] > 0:
    m = ckpt_ids.shape[1]
    if ckpts.shape[1] < m:
      raise ValueError(
        f"ckpt_write has {m} columns but the kernel produced {ckpts.shape[1]} checkpoints"
      )
    ids = ckpt_ids
    if ckpt_counts is not None:
      ids = jnp.where(jnp.arange(m)[None, :] < ckpt_counts[:, None], ids, -1)
    vals = ckpts[:, :m].reshape((-1,) + ckpts.shape[2:])
    pool = scatter(pool, _drop_index(ids.reshape(-1), nb), vals)
  return scatter(pool, _drop_index(final_ids, nb), final)


def slot_ids(n: int) -> jax.Array:
  """int32[n] = 0..n-1: read/write slots of a decode kernel run on a gathered [n, *S] pool."""
  return jnp.arange(n, dtype=jnp.int32)


def checkpoint_kwargs(ckpt_write: jax.Array, ckpt_every: int | None) -> dict:
  """Scan/conv kernel keywords for this step's `all`-mode checkpoints (none when M = 0)."""
  m = ckpt_write.shape[1]
  every = ckpt_every if m > 0 else None
  return {"checkpoint_every": every, "max_checkpoints": m if every else None}


def write_recurrent(
  state_pool: jax.Array,
  conv_pool: jax.Array,
  state_write: jax.Array,
  ckpt_write: jax.Array,
  state_out: tuple[jax.Array, tuple[jax.Array, jax.Array]],
  conv_out: tuple[jax.Array, tuple[jax.Array, jax.Array]],
  checkpointed: bool,
  layer: int | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Writes a recurrent layer's (final, (checkpoints, counts)) for its state and conv pools
  (stacked pools with `layer`: the module docstring).

  `checkpointed` is whether the kernels were asked for checkpoints (`checkpoint_kwargs`);
  without it (also a decode step, whose checkpoints are (None, None)) only the final states
  are written. Returns (state_pool, conv_pool).
  """
  pools = []
  for pool, (final, (ckpts, counts)) in ((state_pool, state_out), (conv_pool, conv_out)):
    if checkpointed:
      pools.append(write_states(pool, state_write, final, ckpt_write, ckpts, counts, layer=layer))
    else:
      pools.append(write_states(pool, state_write, final, layer=layer))
  return pools[0], pools[1]
