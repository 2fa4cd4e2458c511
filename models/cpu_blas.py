"""Single-threaded OpenBLAS for XLA:CPU's LAPACK custom calls (a CPU speed fix, same results).

On CPU, `jax.scipy.linalg.solve_triangular` (used by the GDN chunk kernel's reference form)
lowers to a LAPACK `trsm` custom call whose BLAS is SciPy's bundled OpenBLAS. That OpenBLAS
starts one worker thread per core and hands every small call to them; on a loaded host the
hand-off costs far more than the work (measured on the 2-core CI host: 36 triangular solves
of 64x64 took ~290 ms with the default threads, ~0.7 ms with one). XLA already runs
independent ops in parallel, so the BLAS threads only add hand-offs.

`limit_lapack_threads()` sets SciPy's OpenBLAS to one thread at run time (the library reads
`OPENBLAS_NUM_THREADS` only when loaded, usually before any of our code runs). It is
idempotent, leaves NumPy's own OpenBLAS alone, and does nothing when `OPENBLAS_NUM_THREADS`
is set (the user's choice wins) or when SciPy's OpenBLAS cannot be found.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os

_DONE = False


def _scipy_openblas_paths() -> list[str]:
  spec = importlib.util.find_spec("scipy")
  if spec is None or not spec.submodule_search_locations:
    return []
  root = os.path.dirname(list(spec.submodule_search_locations)[0])
  return sorted(glob.glob(os.path.join(root, "scipy.libs", "libscipy_openblas*.so*")))


def limit_lapack_threads() -> int | None:
  """Sets SciPy's OpenBLAS (the BLAS of jaxlib's CPU LAPACK kernels) to one thread.

  Returns the thread count now in effect, or None when nothing was changed (already done,
  `OPENBLAS_NUM_THREADS` set, or no SciPy OpenBLAS found).
  """
  global _DONE
  if _DONE or "OPENBLAS_NUM_THREADS" in os.environ:
    return None
  _DONE = True
  for path in _scipy_openblas_paths():
    try:
      lib = ctypes.CDLL(path)
      setter = lib.scipy_openblas_set_num_threads
      getter = lib.scipy_openblas_get_num_threads
    except (OSError, AttributeError):
      continue
    setter(1)
    return int(getter())
  return None
