"""Implementation selection shared by every kernel's ``api.py``.

Each op has three implementations:

* ``"xla"``: pure-JAX (chunked) reference, runs anywhere.
* ``"pallas"``: the compiled Pallas kernel for the current accelerator backend.
* ``"interpret"``: the same Pallas kernel run with ``interpret=True`` (CPU testing).
"""

from __future__ import annotations

import jax

IMPLEMENTATIONS = ("xla", "pallas", "interpret")
_PALLAS_BACKENDS = ("gpu", "cuda")


def resolve_implementation(implementation: str | None) -> str:
  """Returns the implementation to use: ``"xla"``, ``"pallas"`` or ``"interpret"``.

  Args:
    implementation: one of ``IMPLEMENTATIONS`` or None. None picks ``"pallas"`` when
      ``jax.default_backend()`` is a GPU backend with a Pallas kernel, else ``"xla"``.

  Raises:
    ValueError: ``implementation`` is not None and not one of ``IMPLEMENTATIONS``.
  """
  if implementation is None:
    return "pallas" if jax.default_backend() in _PALLAS_BACKENDS else "xla"
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
      f"implementation={implementation!r} is not supported; allowed values: "
      f"{', '.join(IMPLEMENTATIONS)} or None"
    )
  return implementation
