"""hybrid-cache: prefix caching for hybrid LLMs in JAX.

The public API (everything else is reached through its package):

  config = CacheConfig(groups=(GroupSpec("full"), GroupSpec("mamba", mode="align")),
                       num_blocks=64, block_size=16)
  manager = make_manager(config, backend="jax")  # or "reference" (the plain-Python twin)
  manager.add_request("r0", prompt_tokens)
  step = manager.schedule([ScheduleEntry("r0")])  # StepResult: hits, chunks, blocks, slots, copies

Packages: `core` (the jitted rules), `twin` (their plain-Python twin), `replay`
(scenario CLI), `engine` (serving a real model), `sim` (trace simulator and bounds).
"""

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.factory import BACKENDS
from hybrid_cache.factory import make_manager
from hybrid_cache.hashing import RequestExtras
from hybrid_cache.types import CacheManager
from hybrid_cache.types import EntryResult
from hybrid_cache.types import HitInfo
from hybrid_cache.types import PoolStats
from hybrid_cache.types import RecurrentSlots
from hybrid_cache.types import RequestView
from hybrid_cache.types import ScheduleEntry
from hybrid_cache.types import StateCopy
from hybrid_cache.types import StepResult

__version__ = "0.1.0"

__all__ = [
  "BACKENDS",
  "CacheConfig",
  "CacheManager",
  "EntryResult",
  "GroupSpec",
  "HitInfo",
  "PoolStats",
  "RecurrentSlots",
  "RequestExtras",
  "RequestView",
  "ScheduleEntry",
  "StateCopy",
  "StepResult",
  "make_manager",
]
