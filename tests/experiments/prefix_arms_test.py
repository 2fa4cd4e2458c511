"""The shared-prefix experiments' shared setup (experiments/prefix_arms.py) and table."""

import dataclasses
import json

import pytest

from experiments import prefix_arms
from experiments import quickstart
from experiments import shared_prefix_divergence
from hybrid_cache.engine import workload as engine_workload


def test_make_setup_layers_defaults_and_params():
  s = prefix_arms.make_setup(shared_prefix_divergence.DEFAULTS, {"num_prompts": 3})
  assert s.num_prompts == 3  # caller wins
  assert s.prefix_len == 500 and s.token_buckets == (32, 512, 1024)  # experiment defaults
  assert s.block_size == prefix_arms.ArmsSetup().block_size  # shared defaults
  assert prefix_arms.make_setup({}, {}) == prefix_arms.ArmsSetup()


def test_divergence_defaults_are_setup_fields():
  names = {f.name for f in dataclasses.fields(prefix_arms.ArmsSetup)}
  assert set(shared_prefix_divergence.DEFAULTS) <= names


@pytest.mark.parametrize("params", [{"num_prompt": 3}, {"block": 8, "model": "x"}])
def test_unknown_parameter_raises(params):
  with pytest.raises(ValueError, match="unknown parameter"):
    prefix_arms.make_setup({}, params)
  with pytest.raises(ValueError, match="unknown parameter"):
    quickstart.run("/nonexistent", **params)


def test_quickstart_table():
  arm = dict(cached_tokens=0, prefill_tokens_computed=100, wall_s=2.0, outputs_equal_to_off=True)
  arms = {"off": arm, "vllm_default": dict(arm, cached_tokens=64, wall_s=1.0)}
  lines = quickstart.format_table(arms, engine_workload.STANDARD_ARMS).splitlines()
  assert lines[0].split() == ["arm", "cached", "computed", "wall_s", "speedup", "exact"]
  assert lines[2].split() == ["off", "0", "100", "2.000", "1.00", "True"]
  assert lines[3].split() == ["vllm_default", "64", "100", "1.000", "2.00", "True"]
  assert lines[4] == "off: enable_prefix_caching=False"
  assert lines[5] == (
    "vllm_default: mode=align, marconi_junction=True, retention_interval=0, eviction=lru"
  )


def test_setup_record_has_every_field_json_ready():
  s = prefix_arms.make_setup(shared_prefix_divergence.DEFAULTS, {"num_prompts": 3})
  rec = prefix_arms.setup_record(s)
  assert set(rec) == {f.name for f in dataclasses.fields(prefix_arms.ArmsSetup)}
  assert (
    rec["num_prompts"] == 3 and rec["prefix_len"] == shared_prefix_divergence.DEFAULTS["prefix_len"]
  )
  assert json.loads(json.dumps(rec)) == rec


def test_arms_are_off_then_profiles_and_unit_page_arms_get_the_checkpoint_unit():
  s = prefix_arms.make_setup({}, {"arms": ("off", "vllm_default", "adaptive")})
  over = s.arm_overrides()
  assert over["off"] == {"enable_prefix_caching": False}
  assert "recurrent_block_size" not in over["vllm_default"]
  assert over["adaptive"]["placement"] == "adaptive"
  assert over["adaptive"]["block_size"] == s.checkpoint_unit == 64
  for arms in [("vllm_default",), ("off", "off"), ()]:
    with pytest.raises(ValueError, match="arms must start with 'off'"):
      prefix_arms.make_setup({}, {"arms": arms})
  with pytest.raises(ValueError, match="profile must be one of"):
    prefix_arms.make_setup({}, {"arms": ("off", "nope")})
