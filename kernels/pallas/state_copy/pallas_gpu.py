"""Pallas (GPU, Triton backend) batched state-slot copy: one launch, pools aliased in place.

Every pool ``[L, S, *state]`` is viewed as ``[L, S, F]`` (F = per-slot elements). The grid is
``(m, tiles)`` over ``m`` copy entries ``(layer, src, dst, shift)`` and tiles of the flattened slot;
program ``(i, t)`` copies tile ``t`` of every pool for entry ``i``: ``F``-elements
``[t*T, t*T+T)`` of ``pool[layer, dst]`` <- the same range shifted by ``shift * F / R`` elements
of ``pool[layer, src]`` (``R = shape[2]``, conv rows), masked to the valid range. Each pool gets its
own power-of-two tile ``T`` so all pools use about the same number of tiles. Invalid entries
(out-of-range indices, e.g. padding with -1) are fully masked. Only the payload is read and
written (no staging copy); pools are ``input_output_aliases`` so the kernel updates them in place
when the caller donates them (otherwise XLA inserts a full copy of each pool first).

Hazard: entries whose source is another entry's destination race (no ordering between
programs). ``api.copy_state_slots`` rejects this for concrete indices.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

DEFAULT_MAX_TILE = 4096
DEFAULT_NUM_WARPS = 4


def _next_pow2(x: int) -> int:
  return 1 << max(0, (x - 1).bit_length())


def plan_tiles(flat_sizes, max_tile: int = DEFAULT_MAX_TILE, min_tile: int = 128):
  """Returns ``(tiles, num_tiles)``: a power-of-two tile per pool and the shared tile count."""
  if max_tile < 1 or max_tile & (max_tile - 1):
    raise ValueError(f"max_tile={max_tile} must be a positive power of two")
  num_tiles = max(pl.cdiv(f, max_tile) for f in flat_sizes)
  tiles = []
  for f in flat_sizes:
    t = min(max_tile, max(min(min_tile, _next_pow2(f)), _next_pow2(pl.cdiv(f, num_tiles))))
    tiles.append(t)
  num_tiles = max(pl.cdiv(f, t) for f, t in zip(flat_sizes, tiles))
  return tuple(tiles), num_tiles


def _kernel(
  *refs, num_pools, tiles, num_tiles, flat_sizes, row_sizes, num_layers, num_slots, num_rows
):
  idx_refs = refs[:4]
  in_refs = refs[4 : 4 + num_pools]
  out_refs = refs[4 + num_pools :]
  lay_ref, src_ref, dst_ref, shift_ref = idx_refs
  i = pl.program_id(0)
  t = pl.program_id(1)
  layer = lay_ref[i]
  src = src_ref[i]
  dst = dst_ref[i]
  shift = shift_ref[i]
  valid = (layer >= 0) & (layer < num_layers) & (src >= 0) & (src < num_slots)
  valid &= (dst >= 0) & (dst < num_slots)
  layer = jnp.where(valid, layer, 0)
  src = jnp.where(valid, src, 0)
  dst = jnp.where(valid, dst, 0)
  for p in range(num_pools):
    tile, f, row = tiles[p], flat_sizes[p], row_sizes[p]
    if row is None:  # not shifted
      off = 0
      ok = valid
    else:
      ok = valid & (shift >= 0) & (shift < num_rows[p])
      off = jnp.where(ok, shift, 0) * row
    start = t * tile
    if row is None and f == num_tiles * tile:
      # Every program has a full tile: a uniform mask keeps accesses vectorised.
      mask = jnp.broadcast_to(ok, (tile,))
    else:
      offs = start + jnp.arange(tile, dtype=jnp.int32)
      mask = ok & (offs < f - off)
    vals = plgpu.load(in_refs[p].at[layer, src, pl.ds(start + off, tile)], mask=mask, other=0)
    plgpu.store(out_refs[p].at[layer, dst, pl.ds(start, tile)], vals, mask=mask)


@functools.partial(
  jax.jit, static_argnames=("shifted", "interpret", "max_tile", "num_warps", "layers_given")
)
def copy_state_slots_pallas(
  pools,
  layers,
  src,
  dst,
  shift,
  *,
  shifted,
  layers_given,
  interpret=False,
  max_tile=DEFAULT_MAX_TILE,
  num_warps=DEFAULT_NUM_WARPS,
):
  """Copies slots of every pool in ``pools`` (a list sharing ``[L, S]``) in one ``pallas_call``.

  Args:
    pools: list of arrays ``[L, S, *state]`` (any dtypes; same ``L`` and ``S``).
    layers: int32[n] layer per entry (ignored unless ``layers_given``).
    src, dst: int32[n] slots. Entries with any index out of range are skipped.
    shift: int32[n] conv row shift per entry (ignored for pools whose ``shifted`` flag is False).
    shifted: tuple of bools, one per pool: apply the row shift along axis 2.
    layers_given: if False every entry is expanded to all ``L`` layers.
    interpret: run in Pallas interpret mode (CPU).
    max_tile: largest per-program tile in elements (power of two).
    num_warps: Triton warps per program.

  Returns:
    The list of updated pools (aliased to the inputs).
  """
  num_layers, num_slots = pools[0].shape[:2]
  src = jnp.asarray(src, jnp.int32)
  dst = jnp.asarray(dst, jnp.int32)
  n = src.shape[0]
  shift = jnp.broadcast_to(jnp.asarray(shift, jnp.int32), (n,))
  if layers_given:
    layers = jnp.asarray(layers, jnp.int32)
  else:
    layers = jnp.tile(jnp.arange(num_layers, dtype=jnp.int32), n)
    src, dst, shift = (jnp.repeat(x, num_layers) for x in (src, dst, shift))
  m = src.shape[0]
  flat = [x.reshape(num_layers, num_slots, -1) for x in pools]
  flat_sizes = tuple(x.shape[2] for x in flat)
  num_rows = tuple(x.shape[2] if x.ndim > 2 else 1 for x in pools)
  row_sizes = tuple(
    (f // r) if s else None for f, r, s in zip(flat_sizes, num_rows, shifted, strict=True)
  )
  tiles, num_tiles = plan_tiles(flat_sizes, max_tile)
  if m == 0:
    return list(pools)
  kernel = functools.partial(
    _kernel,
    num_pools=len(pools),
    tiles=tiles,
    num_tiles=num_tiles,
    flat_sizes=flat_sizes,
    row_sizes=row_sizes,
    num_layers=num_layers,
    num_slots=num_slots,
    num_rows=num_rows,
  )
  num_idx = 4
  out = pl.pallas_call(
    kernel,
    grid=(m, num_tiles),
    out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in flat],
    input_output_aliases={num_idx + k: k for k in range(len(flat))},
    compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
    interpret=interpret,
    name="copy_state_slots",
  )(layers, src, dst, shift, *flat)
  return [o.reshape(x.shape) for o, x in zip(out, pools, strict=True)]
