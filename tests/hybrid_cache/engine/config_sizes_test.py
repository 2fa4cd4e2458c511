"""engine_config: partial hits and unequal group block sizes are accepted where the model can
serve them (the engine runs the copy-on-write, vLLM §2.5); one KV page size otherwise."""

import pytest

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.engine.config import cache_config_for
from hybrid_cache.engine.config import check_compatible
from hybrid_cache.engine.config import check_implementation
from hybrid_cache.engine.config import kv_block_size
from hybrid_cache.engine.config import resolve_model_config
from hybrid_cache.engine.config import state_block_size


def test_partial_hit_config_is_accepted():
  model = resolve_model_config("qwen35_tiny")
  cfg = cache_config_for(model, block_size=16, hash_block_size=8)
  assert cfg.partial_hits  # mamba align block 16 > hash block 8
  check_compatible(model, cfg)


def test_unequal_recurrent_block_size_is_accepted_and_aligns_to_the_lcm():
  model = resolve_model_config("hybrid3_tiny")
  cfg = cache_config_for(model, block_size=32, recurrent_block_size=16)
  check_compatible(model, cfg)
  assert cfg.group_block_sizes == (16, 32, 32)  # mamba, swa, full
  assert (kv_block_size(cfg), state_block_size(cfg), cfg.scheduler_block_size) == (32, 16, 32)


def test_unequal_attention_block_sizes_are_rejected_with_the_field():
  model = resolve_model_config("gemma3_tiny")
  cfg = CacheConfig(groups=(GroupSpec("swa", window=24), GroupSpec("full", block_size=32)),
                    block_size=16, num_blocks=32)  # fmt: skip
  with pytest.raises(ValueError, match=r"groups\[\].block_size must be equal across the attention"):
    check_compatible(model, cfg)


def test_all_mode_needs_a_recurrent_block_of_the_kernel_chunk():
  model = resolve_model_config("qwen35_tiny")
  check_compatible(model, cache_config_for(model, mode="all", recurrent_block_size=64))
  with pytest.raises(ValueError, match=r"mamba groups' block_size must be a multiple of 64"):
    check_compatible(model, cache_config_for(model, mode="all", recurrent_block_size=32))


def test_implementation_is_checked():
  assert [check_implementation(i) for i in ("xla", "pallas", "interpret", None)] == [
    "xla", "pallas", "interpret", None
  ]  # fmt: skip
  with pytest.raises(ValueError, match=r"implementation must be one of .* got 'cuda'"):
    check_implementation("cuda")
