"""`Engine.from_pretrained` without cache arguments serves the cache vLLM 0.33 would build."""

from __future__ import annotations

import numpy as np
import pytest

from hybrid_cache.engine.config import cache_config_for
from hybrid_cache.geometry import derive

pytest.importorskip("torch")
pytest.importorskip("transformers")

from hybrid_cache.engine.engine import Engine  # noqa: E402
from tests.models import hf_checkpoints  # noqa: E402

PROMPTS = [list(range(1, 150)), list(range(1, 140)) + [7, 9, 11]]


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
  return hf_checkpoints.save_tiny("qwen3_5_text", tmp_path_factory.mktemp("qwen"))


def test_from_pretrained_takes_vllms_geometry(qwen_dir):
  want = derive(qwen_dir, "sm80")
  eng = Engine.from_pretrained(qwen_dir, target="sm80", num_blocks=64, max_model_len=256)
  cfg = eng.cache_config
  assert eng.vllm_geometry == want
  assert cfg.block_size == want.block_size
  assert {g.kind: g.block_size for g in cfg.groups}["mamba"] == want.mamba_block_size
  assert (cfg.retention_interval, cfg.marconi_junction) == (0, True)  # vLLM 0.33's defaults
  assert cfg.max_num_batched_tokens == want.max_num_batched_tokens
  # the tiny model's state is small: vLLM still aligns its block to the kernels' 16 tokens
  assert want.block_size % 16 == 0 and want.mamba_block_size == want.block_size


def test_explicit_arguments_override_the_geometry(qwen_dir):
  g = derive(qwen_dir, "sm90")
  cfg = cache_config_for(
    "qwen35_tiny", vllm_geometry=g, block_size=32, retention_interval=None, num_blocks=64
  )
  assert cfg.block_size == 32
  assert {grp.kind: grp.block_size for grp in cfg.groups}["mamba"] is None  # follows 32
  assert cfg.retention_interval is None and cfg.marconi_junction


def test_geometry_served_cached_equals_uncached(qwen_dir):
  kw = dict(target="sm80", num_blocks=64, max_model_len=256, max_num_batched_tokens=256)
  on = Engine.from_pretrained(qwen_dir, **kw).generate(PROMPTS, 4, return_logits=True)
  off = Engine.from_pretrained(qwen_dir, enable_prefix_caching=False, **kw).generate(
    PROMPTS, 4, return_logits=True
  )
  assert on[1].num_cached_tokens > 0
  for a, b in zip(on, off):
    assert a.output_tokens == b.output_tokens
    np.testing.assert_allclose(a.logits, b.logits, rtol=1e-5, atol=1e-5)
