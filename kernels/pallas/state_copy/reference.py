"""Pure-JAX (XLA) state-slot copies: gather all sources, then scatter into destinations.

Layout: a pool is an array ``[L, S, *state]`` (layers, slots, per-slot state dims). A copy batch is
``n`` entries ``(layer, src, dst, shift)``; with ``layers=None`` each entry copies every layer.

Semantics of one entry (all indices already validated or sanitised, see ``sanitize``):
  * ``shift == 0``: ``pool[l, dst] = pool[l, src]``.
  * ``shift == a > 0`` (conv state, rows on axis 2, ``R = pool.shape[2]``):
    ``pool[l, dst, 0:R-a] = pool[l, src, a:R]``; rows ``[R-a:R]`` of ``dst`` are left unchanged.
Invalid entries (``valid == False``, e.g. padding with src = dst = -1) are skipped.

The gather-then-scatter form has snapshot semantics (every source is read before any destination
is written). Under ``jit`` XLA updates the pool in place only when the caller donates it
(``jax.jit(..., donate_argnums=...)``); otherwise the whole pool is copied on every call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sanitize(num_layers, num_slots, layers, src, dst, shift, num_rows):
  """Returns ``(valid, layers, src, dst, shift)`` with invalid entries clamped to index 0.

  An entry is valid iff every index is in range: ``0 <= src, dst < num_slots``,
  ``0 <= layer < num_layers`` (when ``layers`` is given) and ``0 <= shift < num_rows`` (when
  ``shift`` is given). ``layers`` and ``shift`` may be None and stay None.
  """
  src = jnp.asarray(src, jnp.int32)
  dst = jnp.asarray(dst, jnp.int32)
  valid = (src >= 0) & (src < num_slots) & (dst >= 0) & (dst < num_slots)
  if layers is not None:
    layers = jnp.asarray(layers, jnp.int32)
    valid &= (layers >= 0) & (layers < num_layers)
    layers = jnp.where(valid, layers, 0)
  if shift is not None:
    shift = jnp.broadcast_to(jnp.asarray(shift, jnp.int32), src.shape)
    valid &= (shift >= 0) & (shift < num_rows)
    shift = jnp.where(valid, shift, 0)
  return valid, layers, jnp.where(valid, src, 0), jnp.where(valid, dst, 0), shift


def _shift_rows(vals, old, shift, row_axis):
  """Row-shifted copy: out[..., r, ...] = vals[r + a] for r < R - a, else old[r]."""
  num_rows = vals.shape[row_axis]
  # Broadcast shift [n] against vals[n, (L,) R, ...].
  bshape = [1] * vals.ndim
  bshape[0] = shift.shape[0]
  a = shift.reshape(bshape)
  rshape = [1] * vals.ndim
  rshape[row_axis] = num_rows
  r = jnp.arange(num_rows, dtype=jnp.int32).reshape(rshape)
  take = jnp.minimum(r + a, num_rows - 1)  # broadcasts against vals on the other axes
  shifted = jnp.take_along_axis(vals, take, axis=row_axis)
  return jnp.where(r < num_rows - a, shifted, old)


def copy_leaf(pool, valid, layers, src, dst, shift=None):
  """Copies slots of one pool ``[L, S, *state]``; inputs come from ``sanitize``.

  Returns the updated pool (a new value; in place under a donating ``jit``).
  """
  num_slots = pool.shape[1]
  drop_dst = jnp.where(valid, dst, num_slots)  # out of range -> dropped by the scatter
  if layers is None:
    vals = pool[:, src]  # [L, n, *state]
    if shift is not None:
      vals = jnp.moveaxis(vals, 0, 1)  # [n, L, R, ...]
      old = jnp.moveaxis(pool[:, dst], 0, 1)
      vals = jnp.moveaxis(_shift_rows(vals, old, shift, row_axis=2), 1, 0)
    return pool.at[:, drop_dst].set(vals, mode="drop")
  vals = pool[layers, src]  # [n, *state]
  if shift is not None:
    vals = _shift_rows(vals, pool[layers, dst], shift, row_axis=1)
  return pool.at[layers, drop_dst].set(vals, mode="drop")


def copy_state_slots_reference(pools, src, dst, *, layers=None, shifts=None):
  """XLA copy of a list of pools sharing ``[L, S]``; ``shifts`` is a list (entries may be None).

  Returns the list of updated pools.
  """
  num_layers, num_slots = pools[0].shape[:2]
  if shifts is None:
    shifts = [None] * len(pools)
  out = []
  for pool, shift in zip(pools, shifts, strict=True):
    num_rows = pool.shape[2] if pool.ndim > 2 else 1
    valid, lay, s, d, sh = sanitize(num_layers, num_slots, layers, src, dst, shift, num_rows)
    out.append(copy_leaf(pool, valid, lay, s, d, sh))
  return out


copy_state_slots_reference_jit = jax.jit(copy_state_slots_reference)
