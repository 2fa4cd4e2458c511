"""`make_manager`: the one way to build a cache manager (engine, replay, simulator, tests).

Both backends implement the `types.CacheManager` protocol with the same vLLM 0.33 semantics:

  "jax"        `manager.JaxCacheManager`: the jitted core (`hybrid_cache.core`), pure functions
               over one `CacheState` pytree; the backend for speed and for the engine.
  "reference"  `oracle.reference_policy.ReferencePolicy`: the plain-Python twin, obviously
               correct; the backend differential tests compare the jitted core with.

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
    from hybrid_cache.oracle.reference_policy import ReferencePolicy

    return ReferencePolicy(config)
  raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
