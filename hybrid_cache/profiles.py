"""Named cache profiles: one name per configuration of the cache core.

A profile fixes the policy switches of a `CacheConfig` (recurrent mode of the mamba groups, the
shared-prefix junction, the retention interval, eviction); sizes (blocks, budgets, lengths) stay
with the workload. The same names serve the engine's arms (`engine.workload.STANDARD_ARMS`),
the simulator's `--policy` (`sim.core_sim.CORE_POLICY_CONFIGS`) and the gin configs.

  name                     mode   junction  retention  eviction    what it is
  vllm_default             align  on        0          lru         vLLM 0.33's serving default
  vllm_align_dense         align  on        dense      lru         vLLM 0.33 with
                                                                   prefix_cache_retention_interval
                                                                   = None (a state per block)
  vllm_none                none   off       dense      lru         vLLM's mamba_cache_mode "none":
                                                                   no recurrent state is cached, so
                                                                   a hybrid model never hits
  align_dense_no_junction  align  off       dense      lru         vLLM before the junction; not a
                                                                   vLLM 0.33 setting
  all_dense_no_junction    all    off       dense      lru         a state at every block boundary
                                                                   (Marconi's vLLM+ in block terms);
                                                                   not a vLLM 0.33 setting (its
                                                                   modes are "align" and "none")
  flop_aware               align  on        0          flop_aware  vllm_default with Marconi's
                                                                   FLOP-aware eviction (SPEC B2)
  <eviction>               align  on        0          <eviction>  vllm_default with any other
                                                                   registered eviction policy
  adaptive                 align  on        dense      tuned       placement `adaptive`, retirement
                                                                   `superseded`, pages of U (issue
                                                                   28): a state at the branch point
                                                                   and at one continuation point on
                                                                   a learned alignment, at any
                                                                   multiple of U; states superseded
                                                                   by a deeper one of the same
                                                                   request dropped while rarely
                                                                   reused; GreedyDual or LRU-2 on
                                                                   chains; not a vLLM setting

`adaptive` runs every group on blocks of the checkpoint unit U (`Profile.unit_pages`: the
workload sets `block_size` = U, `engine.workload.arm`), so every state it keeps is hittable, and
align mode computes its states where the placement cuts the chunks (`core/policies/adaptive.py`
`chunk_cuts`). vLLM pads a page to hold a state (500-2,000 tokens for real models); with state
slots apart from the pages (the simulator's `--page-layout pools`) pages need not. Its eviction
`tuned` (`core/policies/tuned.py`) ranks by GreedyDual or by LRU-2 with KV owners, one counter
choosing: the simulator's scan re-tunes it online with shadow replays (`python -m
hybrid_cache.sim --policy adaptive`, pools and pages of --block-size by default); the engine has
no shadows and serves the weighting its manager is set to (`set_eviction_weighting`, GreedyDual
until set).
`vllm_default` is exactly what vLLM 0.33 serves a hybrid model with (`VLLM_DEFAULT` lists every
`CacheConfig` field it fixes, and where vLLM sets it). `CacheConfig`'s own defaults are not that
profile: its `retention_interval` defaults to None (dense).

Old names stay as aliases (`ALIASES`): `resolve` maps one to its profile and warns once with
its meaning (FutureWarning), e.g. "vllm_align is an alias of vllm_default: mode=align,
marconi_junction=True, retention_interval=0, eviction=lru".
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from hybrid_cache.policies import EVICTION_POLICIES


@dataclasses.dataclass(frozen=True)
class Profile:
  """The policy switches of one named configuration (`CacheConfig` field values).

  Attributes:
    mode: recurrent mode of every mamba group ("none" | "align" | "all").
    marconi_junction: `CacheConfig.marconi_junction` (vLLM 0.33's shared-prefix junction).
    retention_interval: `CacheConfig.retention_interval` (None = dense, 0 = replay boundaries
      and junctions only).
    eviction: `CacheConfig.eviction` (a registered eviction policy).
    placement: `CacheConfig.placement` (a registered placement policy).
    fine_keys: `CacheConfig.fine_keys` (full attention keyed at every hash block U; the
      workload gives the recurrent block U, see the module doc).
    retirement: `CacheConfig.retirement` (a registered retirement policy).
    unit_pages: every group's block (the KV page and the recurrent block) is the workload's
      checkpoint unit U (`engine.workload.arm` sets `block_size`), not a size padded to hold a
      state as vLLM's pages are: a state kept at any multiple of U is then hittable. Not a
      `CacheConfig` field; the simulator replays it with `--block-size U --page-layout pools`.
  """

  mode: str
  marconi_junction: bool
  retention_interval: int | None
  eviction: str = "lru"
  placement: str = "vllm"
  fine_keys: bool = False
  retirement: str = "none"
  unit_pages: bool = False

  def describe(self) -> str:
    """One line of its fields, e.g. "mode=align, marconi_junction=True, ..."."""
    fields = self.cache_overrides() | ({"unit_pages": True} if self.unit_pages else {})
    return ", ".join(f"{k}={v}" for k, v in fields.items())

  def cache_overrides(self) -> dict[str, Any]:
    """Keyword arguments of `engine.config.cache_config_for` (mode + `CacheConfig` fields);
    placement, fine_keys and retirement only where they are not vLLM's (`unit_pages` is the
    workload's block size: `engine.workload.arm`)."""
    return {
      f.name: getattr(self, f.name)
      for f in dataclasses.fields(self)
      if f.name != "unit_pages"
      and (f.name not in _NAMED_IF_SET or getattr(self, f.name) != f.default)
    }


# `cache_overrides` omits these at vLLM's value
_NAMED_IF_SET = ("placement", "fine_keys", "retirement")


# vLLM 0.33.0's configuration for a hybrid (attention + Mamba/GDN) model, as `CacheConfig` field
# values; read from vLLM 0.33.0's source (wheel vllm-0.33.0, files under vllm/):
#   enable_prefix_caching=True       config/cache.py CacheConfig.enable_prefix_caching = True
#   mode="align"                     config/cache.py mamba_cache_mode (Literal["align", "none"],
#                                    default "none") is set to "align" when prefix caching is on:
#                                    model_executor/models/config.py
#                                    MambaModelConfig.verify_and_update_config
#   retention_interval=0             config/cache.py prefix_cache_retention_interval = 0
#   marconi_junction=True            v1/core/kv_cache_manager.py get_computed_blocks always returns
#                                    the shared_prefix_boundary (no switch)
#   eviction="lru"                   v1/core/block_pool.py: the free queue (no other policy)
#   free_order="scratch_first"       v1/core/block_pool.py free_blocks: blocks without a hash are
#                                    prepended (reused first), cached ones appended
#   watermark_blocks=0               config/scheduler.py SchedulerConfig.watermark = 0.0
#   full_sequence_must_fit=True      config/scheduler.py scheduler_reserve_full_isl = True
#   hash_block_size=None             config/cache.py prefix_match_unit = None (hash = block)
#   recurrent block = KV block       platforms/interface.py update_block_size_for_backend: in align
#                                    mode mamba_block_size = block_size (raised so that one KV
#                                    page >= one state)
#   pinning=False, placement="vllm", admission="all", retention="prefix", retirement="none":
#                                    vLLM has none of these seams (our defaults are its
#                                    behaviour)
VLLM_DEFAULT: dict[str, Any] = {
  "enable_prefix_caching": True,
  "mode": "align",
  "retention_interval": 0,
  "marconi_junction": True,
  "eviction": "lru",
  "free_order": "scratch_first",
  "watermark_blocks": 0,
  "full_sequence_must_fit": True,
  "hash_block_size": None,
  "pinning": False,
  "placement": "vllm",
  "admission": "all",
  "retention": "prefix",
  "retirement": "none",
}

PROFILES: dict[str, Profile] = {
  "vllm_default": Profile("align", True, 0),
  "vllm_align_dense": Profile("align", True, None),
  "vllm_none": Profile("none", False, None),
  "align_dense_no_junction": Profile("align", False, None),
  "all_dense_no_junction": Profile("all", False, None),
  # vllm_default with another registered eviction policy, named after it
  **{p: Profile("align", True, 0, p) for p in EVICTION_POLICIES if p != "lru"},
  # the simulator's unit-cache `adaptive` on the core's seams (issue 28): its placement,
  # retirement and eviction tuning, on pages of U: 1.27-1.57x vLLM best on agentic, 1.35-1.51x
  # on real ShareGPT, at or above the unit cache on all 12 points (BENCHMARKS.md section 3,
  # 2026-11-29); mode all or 512-token pages with fine keys saved less (0.66-1.05x on ShareGPT)
  "adaptive": Profile(
    "align",
    True,
    None,
    "tuned",
    placement="adaptive",
    retirement="superseded",
    unit_pages=True,
  ),
}

# Old name -> profile. Kept so that old commands and recorded results still read.
ALIASES: dict[str, str] = {
  "vllm_align": "vllm_default",  # the simulator's name for it
  "vllm_align_marconi": "vllm_default",  # the same configuration, named after the admission
  "lru": "vllm_default",  # the baseline of flop_aware (vllm_default's eviction is lru)
  "align_marconi": "vllm_align_dense",  # the engine's arm (junction on, retention unset = dense)
  "align_dense": "align_dense_no_junction",  # the simulator's name for it
  "vllm_all": "all_dense_no_junction",  # vLLM 0.33 has no mode "all"
}
# The engine's old arm "align" (align_dense_no_junction) is gone: "align" is a recurrent mode.

_warned: set[str] = set()


def alias_note(name: str) -> str:
  """The line that explains alias `name` (KeyError if it is not one)."""
  target = ALIASES[name]
  return f"{name} is an alias of {target}: {PROFILES[target].describe()}"


def resolve(name: str) -> str:
  """The profile name of `name`: itself, or the profile an alias stands for.

  An alias warns (FutureWarning, once per name and process) with `alias_note`. ValueError for
  a name that is neither a profile nor an alias.
  """
  if name in PROFILES:
    return name
  if name in ALIASES:
    if name not in _warned:
      _warned.add(name)
      warnings.warn(alias_note(name), FutureWarning, stacklevel=2)
    return ALIASES[name]
  raise ValueError(
    f"profile must be one of {tuple(PROFILES)} (or an alias {tuple(ALIASES)}), got {name!r}"
  )


def get(name: str) -> Profile:
  """The `Profile` of a profile name or alias (see `resolve`)."""
  return PROFILES[resolve(name)]
