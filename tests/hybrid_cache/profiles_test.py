"""Named profiles: `vllm_default` is vLLM 0.33's configuration, one name per profile, aliases."""

import dataclasses
import pathlib
import re
import warnings

import pytest

from hybrid_cache import profiles
from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.engine import workload
from hybrid_cache.sim import core_sim
from hybrid_cache.sim.policies import parse_policy
from hybrid_cache.sim.testing import TINY
from hybrid_cache.sim.testing import small_chat

_ROOT = pathlib.Path(__file__).resolve().parents[2]

# vLLM 0.33.0's serving configuration for a hybrid model with prefix caching, read from the
# source of the vllm-0.33.0 wheel (PyPI), files under vllm/:
VLLM_0_33 = {
  # config/cache.py: `enable_prefix_caching: bool = True`
  "enable_prefix_caching": True,
  # config/cache.py: `mamba_cache_mode: MambaCacheMode = "none"` with
  # `MambaCacheMode = Literal["align", "none"]`; model_executor/models/config.py
  # MambaModelConfig.verify_and_update_config sets it to "align" when prefix caching is on.
  "mode": "align",
  # config/cache.py: `prefix_cache_retention_interval: int | None = Field(default=0, ge=0)`
  # ("0 retains only semantic checkpoints, including the latest replay boundary and
  # shared-prefix junctions"; None = dense).
  "retention_interval": 0,
  # v1/core/kv_cache_manager.py: get_computed_blocks always returns `shared_prefix_boundary`
  # (the junction); there is no switch.
  "marconi_junction": True,
  # v1/core/block_pool.py: one free queue, LRU order.
  "eviction": "lru",
  # v1/core/block_pool.py free_blocks: blocks without a hash `prepend_n` (reused first),
  # cached ones `append_n`.
  "free_order": "scratch_first",
  # config/scheduler.py: `watermark: float = Field(default=0.0, ...)`.
  "watermark_blocks": 0,
  # config/scheduler.py: `scheduler_reserve_full_isl: bool = True`.
  "full_sequence_must_fit": True,
  # config/cache.py: `prefix_match_unit: int | None = None` (hashes per block).
  "hash_block_size": None,
  # vLLM has no pinned tier, no placement / admission / retention / retirement seams.
  "pinning": False,
  "placement": "vllm",
  "admission": "all",
  "retention": "prefix",
  "retirement": "none",
}
# platforms/interface.py update_block_size_for_backend: in align mode
# `cache_config.mamba_block_size = cache_config.block_size` (recurrent block = KV block).


def test_vllm_default_is_vllm_0_33():
  assert profiles.VLLM_DEFAULT == VLLM_0_33
  p = profiles.PROFILES["vllm_default"]
  for field in ("mode", "marconi_junction", "retention_interval", "eviction"):
    assert getattr(p, field) == VLLM_0_33[field], field


def test_vllm_default_config_fields():
  over = {k: v for k, v in profiles.VLLM_DEFAULT.items() if k != "mode"}
  cfg = CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("mamba", mode=profiles.VLLM_DEFAULT["mode"])),
    num_blocks=64,
    **over,
  )
  g = cfg.resolved_groups
  assert g[0].block_size == g[1].block_size  # mamba_block_size = block_size
  assert not cfg.partial_hits
  for k, v in over.items():
    if k != "hash_block_size":
      assert getattr(cfg, k) == v, k
  assert (
    workload.STANDARD_ARMS["vllm_default"] == profiles.PROFILES["vllm_default"].cache_overrides()
  )


def test_one_name_per_profile():
  configs = [dataclasses.astuple(p) for p in profiles.PROFILES.values()]
  assert len(set(configs)) == len(configs)
  assert not set(profiles.ALIASES) & set(profiles.PROFILES)
  assert set(profiles.ALIASES.values()) <= set(profiles.PROFILES)


def test_engine_arms_and_simulator_share_the_names():
  assert set(workload.STANDARD_ARMS) - {"off"} <= set(profiles.PROFILES)
  assert set(core_sim.CORE_POLICY_CONFIGS) == set(profiles.PROFILES)


def test_alias_resolves_and_says_what_it_is(monkeypatch):
  monkeypatch.setattr(profiles, "_warned", set())
  with pytest.warns(FutureWarning, match="vllm_align is an alias of vllm_default: mode=align, "):
    assert profiles.resolve("vllm_align") == "vllm_default"
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert profiles.resolve("vllm_align") == "vllm_default"  # warns once per name
    assert profiles.resolve("vllm_default") == "vllm_default"
  with pytest.raises(ValueError, match="profile must be one of"):
    profiles.resolve("align")
  note = profiles.alias_note("align_marconi")
  assert note == (
    "align_marconi is an alias of vllm_align_dense: mode=align, marconi_junction=True,"
    " retention_interval=None, eviction=lru"
  )
  with pytest.warns(FutureWarning, match="align_marconi is an alias of vllm_align_dense"):
    over = workload.arm("align_marconi")
  assert over == profiles.PROFILES["vllm_align_dense"].cache_overrides()


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("old", sorted(profiles.ALIASES))
def test_simulator_alias_replays_its_profile(old):
  new = profiles.ALIASES[old]
  assert parse_policy(old).name == new
  trace = small_chat(5)
  assert core_sim.build_config(trace, TINY, 1e6, old, 4) == core_sim.build_config(
    trace, TINY, 1e6, new, 4
  )


def test_gin_configs_use_profile_names():
  for path in (_ROOT / "configs").rglob("*.gin"):
    for name in re.findall(r'"([a-z_]+)"', path.read_text()):
      assert name not in profiles.ALIASES, f"{path.name} uses the old name {name!r}"


def test_vllm_default_fits_an_attention_only_model():
  # vLLM's _validate_prefix_cache_retention_interval (v1/core/kv_cache_coordinator.py) accepts
  # 0 without sliding-window or Mamba groups and refuses any other interval.
  over = {k: v for k, v in profiles.VLLM_DEFAULT.items() if k != "mode"}
  cfg = CacheConfig(groups=(GroupSpec("full"),), num_blocks=8, block_size=4, **over)
  assert cfg.retention_interval == 0
  with pytest.raises(ValueError, match="retention_interval must be None or 0 without a swa"):
    CacheConfig(groups=(GroupSpec("full"),), num_blocks=8, block_size=4, retention_interval=4)
