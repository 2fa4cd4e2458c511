"""The engine rejects cache configs with partial (fine-grained) hits (vLLM §2.5)."""

import pytest

from hybrid_cache.engine.config import cache_config_for
from hybrid_cache.engine.config import check_compatible
from hybrid_cache.engine.config import resolve_model_config


def test_partial_hit_config_is_rejected_with_the_field():
  model = resolve_model_config("qwen35_tiny")
  cfg = cache_config_for(model, block_size=16, hash_block_size=8)
  assert cfg.partial_hits  # mamba align block 16 > hash block 8
  with pytest.raises(ValueError, match=r"hash_block_size must equal the block size.*8 < 16"):
    check_compatible(model, cfg)
  check_compatible(model, cache_config_for(model, block_size=16))  # hash block 16: accepted
