"""`make_manager`: the one way to build a cache manager (engine, replay, simulator, tests).

Both backends implement the `types.CacheManager` protocol with the same vLLM 0.33 semantics:

  "jax"        `manager.JaxCacheManager`: the jitted core (`hybrid_cache.core`), pure functions
               over one `CacheState` pytree; the backend for speed and for the engine.
  "reference"  `twin.python_manager.PythonCacheManager`: the plain-Python twin, obviously
               correct; the backend differential tests compare the jitted core with.

The backend string "reference" (`make_manager(cfg, "reference")`, `--backend reference` on the
replay, simulator and experiment command lines, `Engine(cache_manager="reference")`) names the
plain-Python twin `PythonCacheManager` (package `hybrid_cache.twin`); it keeps its old name so
that saved command lines and configs still run.

Imports are deferred so that the reference backend never imports jax.
"""

from __future__ import annotations

from hybrid_cache.config import CacheConfig
from hybrid_cache.types import CacheManager

BACKENDS = ("jax", "reference")


def make_manager(config: CacheConfig, backend: str = "jax") -> CacheManager:
  """A fresh manager for `config` on `backend` (one of `BACKENDS`); ValueError otherwise."""
  if backend == "jax":
    from hybrid_cache.manager import JaxCacheManager

    return JaxCacheManager(config)
  if backend == "reference":
    from hybrid_cache.twin.python_manager import PythonCacheManager

    return PythonCacheManager(config)
  raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
