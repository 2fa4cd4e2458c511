"""Warm-cache checkpoints: a restored engine hits the saved prefixes and serves exactly."""

from __future__ import annotations

import numpy as np
import pytest

from hybrid_cache.engine import checkpoint
from hybrid_cache.engine.engine import Engine
from hybrid_cache.engine.config import cache_config_for

BUDGET = 32


def _engine(seed=0, manager="jax"):
  cfg = cache_config_for(
    "qwen35_tiny",
    block_size=16,
    num_blocks=96,
    max_model_len=256,
    max_num_batched_tokens=BUDGET,
    max_requests=4,
  )
  return Engine(
    "qwen35_tiny",
    cfg,
    seed=seed,
    cache_manager=manager,
    max_num_seqs=1,
    token_buckets=(BUDGET,),
    seq_buckets=(8,),
  )


def test_restored_engine_hits_saved_prefix_and_matches_warm_engine(tmp_path):
  rng = np.random.RandomState(0)
  prefix = rng.randint(0, 256, 48).tolist()
  first = prefix + rng.randint(0, 256, 9).tolist()
  second = prefix + rng.randint(0, 256, 7).tolist()
  warm = _engine()
  warm.generate([first], 2)
  checkpoint.save_warm_cache(warm, str(tmp_path / "warm"))
  saved_stats = warm.manager.pool_stats()
  want = warm.generate([second], 3, return_logits=True)[0]
  restored = _engine()
  assert restored.manager.pool_stats() != saved_stats  # a fresh pool holds no cached blocks
  checkpoint.restore_warm_cache(restored, str(tmp_path / "warm"))
  # pool_stats reflects the restored state (cached blocks, free blocks), not the empty pool.
  assert restored.manager.pool_stats() == saved_stats
  assert sum(saved_stats.cached_blocks_per_group) > 0
  got = restored.generate([second], 3, return_logits=True)[0]
  assert got.num_cached_tokens == want.num_cached_tokens == 48
  assert got.output_tokens == want.output_tokens
  np.testing.assert_array_equal(got.logits, want.logits)
  cold = _engine().generate([second], 3)[0]
  assert cold.num_cached_tokens == 0


def test_restore_checks_seed_and_idle_and_manager(tmp_path):
  eng = _engine()
  checkpoint.save_warm_cache(eng, str(tmp_path / "c"))
  with pytest.raises(ValueError, match="seed"):
    checkpoint.restore_warm_cache(_engine(seed=1), str(tmp_path / "c"))
  eng.add_request([1, 2, 3], 1)
  with pytest.raises(ValueError, match="idle"):
    checkpoint.save_warm_cache(eng, str(tmp_path / "d"))
  with pytest.raises(ValueError, match="JaxCacheManager"):
    checkpoint.save_warm_cache(_engine(manager="reference"), str(tmp_path / "e"))
