"""Policy names of the simulator and how each one replays a trace.

marconi_compat          Marconi V2 (FLOP-aware eviction, alpha tuned once), block size 1.
marconi_compat_sglang   Marconi V1 (SGLang+: leaf + branch states, LRU leaves), block size 1.
marconi_compat_static:A Marconi V3 with alpha = A in [0, 100], block size 1.
marconi_compat_vllm     Marconi's vLLM+ baseline (a state per 32-token block, LRU leaves), block 32.
oracle                  infinite cache (every block and boundary state kept), any block size.
offline_bound           offline upper bound at the capacity (`offline_bound.py`): the block size
                        is the hit unit; the replayed hits are its clairvoyant schedule's.
adaptive                the cache core's profile `adaptive` (`hybrid_cache.profiles`, the one the
                        engine serves): placement `adaptive` (a state at the branch point and at a
                        continuation point on a learned alignment), retirement `superseded`,
                        eviction `tuned` (GreedyDual or LRU-2 on chains, chosen online by a shadow
                        tuner: `core_scan._replay_shadowed`), on pages of --block-size (its unit
                        U, default 64) with --page-layout pools by default (BENCHMARKS.md
                        section 3). Scan backend only (the shadow tuner).
ckpt_adaptive           the simulator's unit cache (`checkpoint_policies.py`, issue 15): the same
                        ideas on a trie of U-token units, chain-aware GreedyDual re-tuned online
                        among weightings; a fast model for sweeps (the full Mooncake conversation
                        trace in seconds), checked against the core by
                        `tests/hybrid_cache/sim/unit_cache_vs_core_test.py`. Named `adaptive`
                        until 2026-11-29.
ckpt_dense, ckpt_sparse:K, ckpt_branch
                        the unit cache with checkpoints every U, every K U, or at branch points
                        and leaves (Marconi at U granularity), LRU eviction
                        (`checkpoint_policies.py`).
vllm_default, vllm_align_dense, vllm_none, align_dense_no_junction, all_dense_no_junction,
flop_aware, deepest_first, ...
                        the named profiles of the cache core (`hybrid_cache.profiles`, the
                        engine's arms use the same names): `core_sim.py` replays them through
                        JaxCacheManager, or PythonCacheManager with --backend reference, any block
                        size. `vllm_default` = vLLM 0.33's serving default; an eviction policy's
                        name = `vllm_default` with that eviction.
vllm_align, vllm_align_marconi, lru, align_marconi, align_dense, vllm_all
                        old names, aliases of the profiles above (`profiles.ALIASES`): they
                        replay the same configuration under the new name and warn with its
                        meaning.
"""

from __future__ import annotations

import dataclasses
import importlib.util

from hybrid_cache import profiles

# the core profiles the simulator replays (`adaptive` among them)
CORE_POLICIES = tuple(profiles.PROFILES)
COMPAT_POLICIES = ("marconi_compat", "marconi_compat_sglang", "marconi_compat_vllm")
STATIC_PREFIX = "marconi_compat_static:"
CKPT_POLICIES = ("ckpt_adaptive", "ckpt_dense", "ckpt_sparse:<K>", "ckpt_branch")
# the unit cache's `adaptive` (its placement rule `checkpoint_placement.PLACEMENTS` "adaptive")
UNIT_ADAPTIVE = "ckpt_adaptive"
ALL_POLICIES = (
  COMPAT_POLICIES
  + (STATIC_PREFIX + "<alpha>", "oracle", "offline_bound")
  + CORE_POLICIES
  + CKPT_POLICIES
)


@dataclasses.dataclass(frozen=True)
class Policy:
  """A parsed policy name: `kind` in {"marconi", "vllm_plus", "oracle", "bound", "core",
  "ckpt"}; `placement`: a "ckpt" policy's placement rule (`checkpoint_placement.PLACEMENTS`)."""

  name: str
  kind: str
  version: int = 0
  alpha: float = 0.0
  required_block_size: int | None = None
  placement: str | None = None


def parse_policy(name: str) -> Policy:
  """Parses a policy name (see module docstring); ValueError for unknown names."""
  if name == "marconi_compat":
    return Policy(name, "marconi", 2, 0.0, 1)
  if name == "marconi_compat_sglang":
    return Policy(name, "marconi", 1, 0.0, 1)
  if name == "marconi_compat_vllm":
    return Policy(name, "vllm_plus", 0, 0.0, 32)
  if name.startswith(STATIC_PREFIX):
    raw = name[len(STATIC_PREFIX) :]
    try:
      alpha = float(raw)
    except ValueError:
      alpha = float("nan")
    if not 0.0 <= alpha <= 100.0:
      raise ValueError(f"policy alpha must be a number in [0, 100], got {raw!r} in {name!r}")
    return Policy(name, "marconi", 3, alpha, 1)
  if name == "oracle":
    return Policy(name, "oracle")
  if name == "offline_bound":
    return Policy(name, "bound")
  if name in CORE_POLICIES:
    return Policy(name, "core")
  if name in profiles.ALIASES:
    return Policy(profiles.resolve(name), "core")
  if name == UNIT_ADAPTIVE:
    return Policy(name, "ckpt", placement="adaptive")
  if name in ("ckpt_dense", "ckpt_branch") or name.startswith("ckpt_sparse:"):
    from hybrid_cache.sim.checkpoint_placement import parse_placement

    parse_placement(name)
    return Policy(name, "ckpt", placement=name)
  raise ValueError(f"policy must be one of {ALL_POLICIES}, got {name!r}")


def core_available() -> bool:
  return importlib.util.find_spec("hybrid_cache.manager") is not None
