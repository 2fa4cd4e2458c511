"""The policy registry: the names `CacheConfig` accepts, and where each policy's two twins live.

A policy is one core file + its oracle twin + one line here:

  eviction  `hybrid_cache/core/policies/<name>.py`   `priority(lay, config, state, blocks)`
            `hybrid_cache/oracle/policies/<name>.py` `priority(config, blocks, policy_state)`
            Both give, for every eviction candidate (a keyed free block that can still be hit),
            an integer priority: lower is evicted first; ties go least recently freed first.
            `lru` is vLLM's free queue itself (no re-ordering, no file).

`CacheConfig(eviction=name)` selects one; the simulator's `--policy` runs each registered
eviction policy over the core's `lru` profile; the differential machines in
`tests/hybrid_cache/policies_test.py` compare every registered policy's twins. This module
imports nothing heavy (the config validates names without importing jax).
"""

from __future__ import annotations

import importlib
from types import ModuleType

# name -> whether the policy reads the config's eviction cost fields (FLOPs, bytes per block);
# the compile key keeps those fields (and an exact max_model_len) only for such policies
EVICTION: dict[str, bool] = {
  "lru": False,  # vLLM 0.33's free queue (built in: no re-ordering)
  "flop_aware": True,  # Marconi's FLOPs-per-byte utility with recency (SPEC B2)
  "deepest_first": False,  # the README's worked example: deepest prefix position first
}
EVICTION_POLICIES = tuple(EVICTION)


def reads_costs(eviction: str) -> bool:
  """Whether `eviction` reads `CacheConfig.eviction_*` cost fields."""
  return EVICTION[eviction]


def core_eviction(name: str) -> ModuleType | None:
  """The jitted twin of eviction policy `name` (None for `lru`)."""
  return None if name == "lru" else importlib.import_module(f"hybrid_cache.core.policies.{name}")


def oracle_eviction(name: str) -> ModuleType | None:
  """The plain-Python twin of eviction policy `name` (None for `lru`)."""
  if name == "lru":
    return None
  return importlib.import_module(f"hybrid_cache.oracle.policies.{name}")
