"""Our architectures against `transformers`, output for output (the model side's oracle).

For each supported `model_type` (and the sparse MoE variants of Qwen3-Next and Nemotron-H), a
tiny random checkpoint built and saved by `transformers` itself (`hf_checkpoints`) is loaded with
`models.pretrained` and run on a 216-token prompt in two chunks (64 + 152 tokens: across the
kernels' 64-token chunk and, for Gemma 3, many 24-token sliding windows): logits within 1e-4
relative of `transformers`' uncached forward pass, and 16 greedy tokens served by
`Engine.from_pretrained` with prefix caching on equal `transformers`' greedy continuation. For the
MoE checkpoints, `transformers`' own routers spread the prompt's tokens over every expert (so
the parity covers real routing, not one expert). Skips without the `hf` extra (transformers + CPU
torch).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from hybrid_cache.engine.engine import Engine  # noqa: E402
from models.pretrained import load_pretrained  # noqa: E402
from models.testing import ToyDriver  # noqa: E402
from models.testing import max_rel_diff  # noqa: E402
from tests.models import hf_checkpoints  # noqa: E402

PROMPT_LEN = 216
NEW_TOKENS = 16


@functools.cache
def _prompt() -> list[int]:
  return np.random.RandomState(27).randint(0, 256, PROMPT_LEN).tolist()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """model_type -> (the transformers model, the directory it was saved to)."""
  out = {}
  for model_type in hf_checkpoints.MODEL_TYPES:
    model = hf_checkpoints.tiny_model(model_type)
    directory = tmp_path_factory.mktemp(model_type)
    model.save_pretrained(directory)
    out[model_type] = (model, directory)
  return out


@pytest.mark.parametrize("model_type", hf_checkpoints.MODEL_TYPES)
def test_logits_match_transformers(checkpoints, model_type):
  reference, directory = checkpoints[model_type]
  loaded = load_pretrained(directory)
  want = hf_checkpoints.reference_logits(reference, _prompt())
  driver = ToyDriver(loaded.model, num_blocks=40, block_size=16, max_blocks=16)
  req = driver.new_request(_prompt())
  got = np.concatenate([driver.step([(req, 64)])[0], driver.step([(req, PROMPT_LEN - 64)])[0]])
  assert got.shape == want.shape
  assert max_rel_diff(got, want) <= 1e-4, max_rel_diff(got, want)


@pytest.mark.parametrize("model_type", hf_checkpoints.MODEL_TYPES)
def test_greedy_tokens_match_transformers(checkpoints, model_type):
  reference, directory = checkpoints[model_type]
  want = hf_checkpoints.reference_greedy(reference, _prompt(), NEW_TOKENS)
  engine = Engine.from_pretrained(
    directory,
    block_size=16,
    num_blocks=64,
    max_model_len=256,
    max_num_batched_tokens=128,
    token_buckets=(128,),
    seq_buckets=(4,),
  )
  (out,) = engine.generate([_prompt()], NEW_TOKENS)
  assert out.finished, out.error
  assert out.output_tokens == want


def test_multimodal_qwen3_5_loads_the_language_model_only(checkpoints):
  _, directory = checkpoints["qwen3_5"]
  loaded = load_pretrained(directory)
  assert loaded.arch.model_type == "qwen3_5_text"
  assert loaded.arch.skipped == ("model.visual.", "mtp.")
  assert any("skipped" in note for note in loaded.arch.notes)


def test_multimodal_qwen3_5_moe_loads_the_language_model_only(checkpoints):
  _, directory = checkpoints["qwen3_5_moe"]
  loaded = load_pretrained(directory)
  assert loaded.arch.model_type == "qwen3_5_moe_text"
  assert loaded.arch.skipped == ("model.visual.", "mtp.")
  assert loaded.config.moe_layers == (0, 1, 2, 3) and loaded.config.moe_shared_gate


@pytest.mark.parametrize("model_type", hf_checkpoints.MOE_MODEL_TYPES)
def test_moe_routing_is_spread_over_the_experts(checkpoints, model_type):
  reference, directory = checkpoints[model_type]
  cfg = load_pretrained(directory).config
  picked = hf_checkpoints.reference_routing(reference, _prompt())
  assert len(picked) == len(cfg.moe_layers)
  for experts in picked:
    assert experts.shape == (PROMPT_LEN, cfg.moe_top_k)
    share = np.bincount(experts.ravel(), minlength=cfg.moe_num_experts) / experts.size
    # every expert serves tokens, none more than twice its even share
    assert share.min() > 0 and share.max() < 2 / cfg.moe_num_experts, share
