"""Public entry point: batched (layer, src slot) -> (layer, dst slot) state copies, in place.

Call this inside the caller's ``jit`` with the pool(s) donated
(``jax.jit(step, donate_argnums=...)``): both implementations then update the pool buffers in place
(XLA: gather + scatter with input/output aliasing; Pallas: ``input_output_aliases``). Without
donation XLA copies each whole pool on every call.
"""

from __future__ import annotations

import jax
import numpy as np

from kernels.pallas import validation
from kernels.pallas.common import resolve_implementation
from kernels.pallas.state_copy import pallas_gpu
from kernels.pallas.state_copy import reference


def _check_index_array(name, x, n):
  shape = np.shape(x)
  if len(shape) != 1 or (n is not None and shape[0] != n):
    want = "[n]" if n is None else f"[{n}]"
    raise ValueError(f"{name} must have shape {want} (one entry per copy), got shape {shape}")
  validation.check_int(name, x)


def _check_range(name, values, mask, lo, hi):
  bad = mask & ((values < lo) | (values >= hi))
  if np.any(bad):
    k = int(np.argmax(bad))
    raise ValueError(f"{name}[{k}]={int(values[k])} is out of range; allowed range is [{lo}, {hi})")


def _validate_concrete(src, dst, layers, shifts, num_layers, num_slots, num_rows):
  """Checks concrete index values; see ``copy_state_slots`` for the rules."""
  s, d = validation.concrete(src), validation.concrete(dst)
  if s is None or d is None:
    return
  pad = (s == -1) & (d == -1)
  real = ~pad
  _check_range("src", s, real, 0, num_slots)
  _check_range("dst", d, real, 0, num_slots)
  lay = validation.concrete(layers)
  if layers is not None and lay is not None:
    _check_range("layers", lay, real, 0, num_layers)
  for k, sh in enumerate(shifts):
    c = validation.concrete(sh)
    if sh is not None and c is not None:
      c = np.broadcast_to(c, s.shape)
      _check_range(f"conv_shift (pool {k})", c, real, 0, num_rows[k])
  if layers is not None and lay is None:
    return
  if layers is None:
    srcs = {int(x) for x in s[real]}
    dsts = [int(x) for x in d[real]]
  else:
    srcs = {(int(a), int(b)) for a, b in zip(lay[real], s[real])}
    dsts = [(int(a), int(b)) for a, b in zip(lay[real], d[real])]
  what = "slot" if layers is None else "(layer, slot)"
  both = srcs.intersection(dsts)
  if both:
    raise ValueError(
      f"src/dst: {what} {sorted(both)[0]} is both a source and a destination in one batch; "
      "split the batch into two calls"
    )
  if len(set(dsts)) != len(dsts):
    dup = next(x for x in dsts if dsts.count(x) > 1)
    raise ValueError(f"dst: {what} {dup} is a destination more than once in one batch")


def copy_state_slots(
  pool,
  src,
  dst,
  *,
  layers=None,
  conv_shift=None,
  implementation=None,
  max_tile=pallas_gpu.DEFAULT_MAX_TILE,
  num_warps=pallas_gpu.DEFAULT_NUM_WARPS,
):
  """Copies state slots ``(layer, src[i]) -> (layer, dst[i])`` for every entry, in one launch.

  Args:
    pool: an array ``[L, S, *state]`` (layers, slots, per-slot state), or a pytree of such arrays
      sharing ``L`` and ``S`` and the slot indexing (e.g. ``(ssm_state, conv_state)``); every leaf
      gets the same copies. Donate it in the enclosing ``jit`` (see the module docstring).
    src: int32[n] source slots in ``[0, S)``.
    dst: int32[n] destination slots in ``[0, S)``. Entries with ``src == dst == -1`` are padding
      and ignored (pad batches to static sizes to avoid recompiles).
    layers: optional int32[n] layer per entry in ``[0, L)``; None copies every layer per entry.
    conv_shift: optional conv-window shift ``a`` (vLLM align mode, spec decode): rows ``[a:R]``
      (axis 2, ``R = shape[2]``) of the source go to rows ``[0:R-a]`` of the destination, rows
      ``[R-a:R]`` of the destination are unchanged. Either an int32[n] (or scalar) applied to every
      leaf, or a pytree with the structure of ``pool`` whose leaves are int32[n] or None (None: no
      shift for that pool). Values in ``[0, R)``.
    implementation: ``"xla" | "pallas" | "interpret"`` or None (Pallas on GPU, else XLA).
    max_tile, num_warps: Pallas tuning (elements per program, power of two; Triton warps).

  Returns:
    The updated pool, same structure, shapes and dtypes.

  Raises:
    ValueError: bad shapes/dtypes, or (when the index values are concrete) an index out of range,
      a half-padded entry, a slot (a (layer, slot) when ``layers`` is given) that is both a source
      and a destination in the batch, or a destination used twice.

  Concrete checks read the index values on the host (a device sync for device arrays; pass
  numpy indices or call under ``jit`` to avoid it). Traced indices are not checked. Then entries
  with any index out of range are skipped (so -1 padding works), a slot that is both a source and
  a destination reads the pre-batch value in the XLA path (gather before scatter) but races in the
  Pallas path (unspecified result), and duplicate destinations give an unspecified one of the
  sources.
  """
  impl = resolve_implementation(implementation)
  leaves, treedef = jax.tree.flatten(pool)
  if not leaves:
    raise ValueError("pool must contain at least one array")
  for k, x in enumerate(leaves):
    if np.ndim(x) < 2:
      raise ValueError(f"pool leaf {k} must have shape [L, S, ...], got shape {np.shape(x)}")
  num_layers, num_slots = leaves[0].shape[:2]
  for k, x in enumerate(leaves):
    if x.shape[:2] != (num_layers, num_slots):
      raise ValueError(
        f"pool leaf {k} has leading dims {x.shape[:2]}; all leaves must share "
        f"[L, S] = {(num_layers, num_slots)}"
      )
  _check_index_array("src", src, None)
  n = np.shape(src)[0]
  _check_index_array("dst", dst, n)
  if layers is not None:
    _check_index_array("layers", layers, n)
  if conv_shift is None:
    shifts = [None] * len(leaves)
  elif isinstance(conv_shift, (int, np.integer)) or hasattr(conv_shift, "shape"):
    shifts = [conv_shift] * len(leaves)
  else:
    shift_leaves, shift_def = jax.tree.flatten(conv_shift, is_leaf=lambda x: x is None)
    if shift_def != jax.tree.structure(pool, is_leaf=lambda x: x is None) or len(
      shift_leaves
    ) != len(leaves):
      raise ValueError(
        f"conv_shift must be an int32[n] array or a pytree matching pool ({treedef}), "
        f"got {shift_def}"
      )
    shifts = list(shift_leaves)
  num_rows = []
  for k, (x, sh) in enumerate(zip(leaves, shifts, strict=True)):
    if sh is not None:
      if x.ndim < 3:
        raise ValueError(
          f"conv_shift given for pool leaf {k} of shape {x.shape}; needs [L, S, R, ...]"
        )
      if np.ndim(sh) not in (0, 1) or (np.ndim(sh) == 1 and np.shape(sh)[0] != n):
        raise ValueError(f"conv_shift must be a scalar or shape [{n}], got shape {np.shape(sh)}")
    num_rows.append(x.shape[2] if x.ndim > 2 else 1)
  _validate_concrete(src, dst, layers, shifts, num_layers, num_slots, num_rows)

  if impl == "xla":
    out = reference.copy_state_slots_reference_jit(leaves, src, dst, layers=layers, shifts=shifts)
  else:
    # One launch: a shared shift vector; pools without a shift ignore it.
    shift_arrays = [sh for sh in shifts if sh is not None]
    shared = shift_arrays[0] if shift_arrays else 0
    if any(sh is not shared for sh in shift_arrays):
      out = _pallas_per_shift(leaves, src, dst, layers, shifts, impl, max_tile, num_warps)
    else:
      out = pallas_gpu.copy_state_slots_pallas(
        leaves,
        layers,
        src,
        dst,
        shared,
        shifted=tuple(sh is not None for sh in shifts),
        layers_given=layers is not None,
        interpret=impl == "interpret",
        max_tile=max_tile,
        num_warps=num_warps,
      )
  return jax.tree.unflatten(treedef, out)


def _pallas_per_shift(leaves, src, dst, layers, shifts, impl, max_tile, num_warps):
  """Different shift arrays per pool: one launch per distinct shift array (rare)."""
  out = list(leaves)
  groups = {}
  for k, sh in enumerate(shifts):
    groups.setdefault(id(sh), []).append(k)
  for ks in groups.values():
    sh = shifts[ks[0]]
    res = pallas_gpu.copy_state_slots_pallas(
      [leaves[k] for k in ks],
      layers,
      src,
      dst,
      0 if sh is None else sh,
      shifted=tuple(sh is not None for _ in ks),
      layers_given=layers is not None,
      interpret=impl == "interpret",
      max_tile=max_tile,
      num_warps=num_warps,
    )
    for k, r in zip(ks, res, strict=True):
      out[k] = r
  return out
