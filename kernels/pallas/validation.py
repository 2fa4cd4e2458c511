"""Argument checks shared by every kernel's ``api.py`` (host side, before any tracing work).

Each check raises ``ValueError`` naming the argument, the offending value and what is allowed.
Value checks (index ranges, slot hazards) run only on concrete arrays: under ``jit`` with traced
indices they are skipped and the caller is responsible for the contract.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

FLOAT_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


def concrete(x) -> np.ndarray | None:
  """``x`` as a numpy array, or None when it is None or a tracer (values unknown)."""
  if x is None:
    return None
  try:
    return np.asarray(x)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return None


def check_float(name: str, x) -> None:
  """``x`` has a float16/bfloat16/float32 dtype (None is allowed: optional arguments)."""
  if x is not None and jnp.dtype(x.dtype) not in FLOAT_DTYPES:
    raise ValueError(f"{name} has dtype {x.dtype}; allowed: float32, bfloat16, float16")


def check_dtype(name: str, x, dtype) -> None:
  if x is not None and jnp.dtype(x.dtype) != jnp.dtype(dtype):
    raise ValueError(f"{name} has dtype {x.dtype}; expected {jnp.dtype(dtype).name}")


def check_shape(name: str, x, expected) -> None:
  """``x.shape == expected`` (entries of ``expected`` may be strings, which never match)."""
  if tuple(np.shape(x)) != tuple(expected):
    raise ValueError(f"{name} has shape {tuple(np.shape(x))}; expected {tuple(expected)}")


def check_int(name: str, x) -> None:
  dtype = np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype
  if not np.issubdtype(dtype, np.integer):
    raise ValueError(f"{name} must be an integer array (int32), got dtype {dtype}")


def is_pow2(value: int, minimum: int = 1) -> bool:
  """``value`` is a power of two >= ``minimum`` (Triton block shapes, kernels.md §6.3)."""
  return value >= max(minimum, 1) and not value & (value - 1)


def check_pow2(name: str, value: int, minimum: int = 16) -> None:
  if not is_pow2(value, minimum):
    raise ValueError(f"{name}={value} must be a power of two >= {minimum}")


def check_slot_indices(name: str, idx, n: int, num_slots: int) -> None:
  """``idx``: integer [n] with (when concrete) every value in [0, num_slots)."""
  check_shape(name, idx, (n,))
  check_int(name, idx)
  a = concrete(idx)
  if a is not None and n and (a.min() < 0 or a.max() >= num_slots):
    raise ValueError(
      f"{name} has values in [{a.min()}, {a.max()}]; allowed range [0, {num_slots - 1}]"
    )


def check_decode_slots(read_indices, write_indices) -> None:
  """In-place decode hazards (concrete indices only).

  Write slots must be distinct, and a write slot may be read only by the sequence that writes
  it (reading and writing the same slot is an in-place update); otherwise one sequence would
  overwrite a state another one still reads.
  """
  r, w = concrete(read_indices), concrete(write_indices)
  if w is None:
    return
  slots, counts = np.unique(w, return_counts=True)
  if np.any(counts > 1):
    raise ValueError(
      f"write_indices: slot {int(slots[np.argmax(counts > 1)])} is a destination more than "
      "once; write slots must be distinct"
    )
  if r is None:
    return
  clash = (w[:, None] == r[None, :]) & ~np.eye(w.shape[0], dtype=bool)  # [writer, reader]
  if clash.any():
    i, j = (int(a) for a in np.argwhere(clash)[0])
    raise ValueError(
      f"write_indices[{i}]={int(w[i])} is read by sequence {j} (read_indices); a slot may be "
      "both a source and a destination only for the same sequence"
    )


def check_pool(name: str, pool, inner: tuple, dtype=None) -> None:
  """``pool`` has shape [slots, *inner] (and ``dtype`` when given)."""
  if pool.ndim != 1 + len(inner) or tuple(pool.shape[1:]) != tuple(inner):
    raise ValueError(
      f"{name} has shape {tuple(pool.shape)}; expected (num_slots, {', '.join(map(str, inner))})"
    )
  if dtype is not None:
    check_dtype(name, pool, dtype)
