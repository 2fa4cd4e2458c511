"""The Pallas path end to end (issue 16): the engine serves through the Pallas kernels.

Models pick the Pallas kernels only on a GPU, so on CPU the engine is forced into the Pallas
interpreter (`implementation="interpret"`: the same kernel bodies, run by the interpreter) and
compared with the XLA path on the same workload and cache config: a shared prefix (hits,
recurrent state copies through the state-copy kernel), chunked prefill (prefill kernels with an
initial state) and decode steps (decode kernels). On a GPU the same tests run `"pallas"`.
"""

from __future__ import annotations

import json
import pathlib

import gin
import jax
import numpy as np
import pytest

from experiments import run as run_lib
from hybrid_cache.engine.config import cache_config_for
from hybrid_cache.engine.engine import Engine

PRESETS = ("qwen35_tiny", "nemotron_h_tiny", "gemma3_tiny", "hybrid3_tiny")
_QUICKSTART = pathlib.Path(__file__).resolve().parents[3] / "configs/experiments/quickstart.gin"
KERNELS = "pallas" if jax.default_backend() == "gpu" else "interpret"


def _prompts():
  rng = np.random.RandomState(2)
  prefix = rng.randint(0, 256, 40).tolist()
  return [prefix + rng.randint(0, 256, 9).tolist() for _ in range(2)]


def _serve(preset, implementation, **cache):
  kw = dict(block_size=16, num_blocks=32, max_model_len=128, max_num_batched_tokens=32)
  cfg = cache_config_for(preset, max_requests=2, **{**kw, **cache})
  budget = cfg.max_num_batched_tokens
  eng = Engine(
    preset,
    cfg,
    cache_manager="reference",
    implementation=implementation,
    token_buckets=(budget,),
    seq_buckets=(4,),
  )
  return eng.generate(_prompts(), 3, return_logits=True), eng


def _assert_same(got, want):
  for g, w in zip(got, want, strict=True):
    assert g.finished and w.finished
    assert g.output_tokens == w.output_tokens, (g.request_id, g.output_tokens, w.output_tokens)
    rel = float(np.max(np.abs(g.logits - w.logits)) / np.max(np.abs(w.logits)))
    assert rel <= 1e-5, (g.request_id, rel)


@pytest.mark.parametrize("preset", PRESETS)
def test_pallas_kernels_serve_like_xla(preset):
  xla, _ = _serve(preset, "xla")
  pallas, eng = _serve(preset, KERNELS)
  assert eng.implementation == KERNELS
  _assert_same(pallas, xla)
  assert [o.num_cached_tokens for o in pallas] == [0, 32]
  assert eng.stats.decode_tokens > 0


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["qwen35_tiny", "nemotron_h_tiny"])
def test_pallas_kernels_serve_like_xla_in_all_mode(preset):
  # "all" mode: the chunked kernels write a checkpoint every 64 tokens.
  cache = dict(mode="all", block_size=64, max_num_batched_tokens=64, num_blocks=16)
  xla, _ = _serve(preset, "xla", **cache)
  pallas, eng = _serve(preset, KERNELS, **cache)
  _assert_same(pallas, xla)


def test_bad_implementation_names_the_field():
  with pytest.raises(ValueError, match=r"implementation must be one of .* got 'triton'"):
    Engine("qwen35_tiny", implementation="triton")


def test_gin_binding_reaches_the_engine(tmp_path):
  gin.clear_config()
  binds = [
    f"quickstart.run.{b}"
    for b in (
      f"implementation = '{KERNELS}'",
      "num_prompts = 2",
      "prefix_len = 40",
      "suffix_len = 5",
      "max_new_tokens = 1",
      "cache_manager = 'reference'",
      "progress = False",
      "max_num_batched_tokens = 32",
      "max_model_len = 128",
      "token_buckets = (32,)",
      "arms = ('off', 'vllm_default')",  # two arms of the gin's four, on blocks of 16
      "block_size = 16",
    )
  ]
  try:
    run_lib.execute([str(_QUICKSTART)], binds, str(tmp_path))
  finally:
    gin.clear_config()
  saved = json.loads((tmp_path / "results.json").read_text())
  assert saved["setup"]["implementation"] == KERNELS
  assert all(a["outputs_equal_to_off"] for a in saved["arms"].values())
  assert saved["arms"]["vllm_default"]["cached_tokens"] > 0
