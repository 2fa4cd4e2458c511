"""Loading Hugging Face checkpoints (`models.pretrained`, `models.hf_config`): shards, dtypes,
and one clear error line for every bad checkpoint. Builds tiny checkpoints with `transformers`
(`hf_checkpoints`); skips without the `hf` extra."""

from __future__ import annotations

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors.flax import load_file  # noqa: E402
from safetensors.flax import save_file  # noqa: E402

from hybrid_cache.engine.engine import Engine  # noqa: E402
from models import hf_config  # noqa: E402
from models.pretrained import load_pretrained  # noqa: E402
from tests.models import hf_checkpoints  # noqa: E402


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
  return hf_checkpoints.save_tiny("qwen3_5_text", tmp_path_factory.mktemp("qwen"))


def _copy(src, tmp_path) -> str:
  dst = os.path.join(tmp_path, "ckpt")
  shutil.copytree(src, dst)
  return dst


def _edit_tensors(directory, edit) -> None:
  path = os.path.join(directory, "model.safetensors")
  tensors = load_file(path)
  edit(tensors)
  save_file(tensors, path)


def _edit_config(directory, **changes) -> None:
  path = os.path.join(directory, "config.json")
  with open(path) as f:
    raw = json.load(f)
  raw.update(changes)
  with open(path, "w") as f:
    json.dump(raw, f)


def _params(model) -> dict:
  from flax import nnx

  return {".".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(nnx.state(model))}


def test_config_maps_to_the_layer_pattern_and_cache_groups(qwen_dir):
  cfg = load_pretrained(qwen_dir).config
  assert cfg.layer_pattern == "GGGA" and cfg.cache_groups == ("mamba", "full")
  assert cfg.norm_offset and cfg.attn_output_gate and cfg.qk_norm and cfg.rope_dim == 4
  gemma = hf_config.from_hf_config(
    {
      "model_type": "gemma3_text",
      "vocab_size": 32,
      "hidden_size": 16,
      "intermediate_size": 32,
      "num_attention_heads": 2,
      "num_key_value_heads": 1,
      "head_dim": 8,
      "num_hidden_layers": 3,
      "sliding_window": 5,
      "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
      "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
      },
    }
  ).config
  assert gemma.layer_pattern == "SSA" and gemma.cache_groups == ("swa", "full")
  assert gemma.window == 5 and gemma.rope_factor == 8.0 and gemma.tie_word_embeddings
  nemotron = hf_config.from_hf_config(
    {
      "model_type": "nemotron_h",
      "vocab_size": 32,
      "hidden_size": 16,
      "intermediate_size": 32,
      "num_attention_heads": 2,
      "num_key_value_heads": 1,
      "head_dim": 8,
      "hybrid_override_pattern": "M-M*-",
      "mamba_num_heads": 4,
      "mamba_head_dim": 4,
      "ssm_state_size": 8,
    }
  ).config
  assert nemotron.layer_pattern == "M-MA-" and nemotron.cache_groups == ("mamba", "full")
  assert nemotron.layer_group == (0, -1, 0, 1, -1)


def test_sharded_checkpoint_loads_the_same_weights(qwen_dir, tmp_path):
  sharded = _copy(qwen_dir, tmp_path)
  tensors = load_file(os.path.join(sharded, "model.safetensors"))
  os.remove(os.path.join(sharded, "model.safetensors"))
  names = sorted(tensors)
  weight_map = {}
  for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
    file = f"model-0000{i + 1}-of-00002.safetensors"
    save_file({n: tensors[n] for n in part}, os.path.join(sharded, file))
    weight_map.update(dict.fromkeys(part, file))
  with open(os.path.join(sharded, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f)
  want, got = _params(load_pretrained(qwen_dir).model), _params(load_pretrained(sharded).model)
  assert want.keys() == got.keys()
  for k in want:
    np.testing.assert_array_equal(got[k], want[k])


def test_bfloat16_loads_bf16_weights_and_fp32_decays(qwen_dir):
  loaded = load_pretrained(qwen_dir, dtype="bfloat16")
  params = _params(loaded.model)
  assert loaded.config.dtype == "bfloat16"
  assert params["blocks.0.mixer.in_proj_qkv.kernel"].dtype == jnp.bfloat16
  assert params["blocks.0.mixer.A_log"].dtype == np.float32


def test_serves_with_caching_on_and_off_alike(qwen_dir):
  prompts = [[5, 6, 7] * 20 + [i] * 5 for i in range(3)]
  kw = dict(block_size=16, num_blocks=48, max_model_len=128, max_num_batched_tokens=64)
  on = Engine.from_pretrained(qwen_dir, **kw).generate(prompts, 4, return_logits=True)
  off = Engine.from_pretrained(qwen_dir, enable_prefix_caching=False, **kw).generate(
    prompts, 4, return_logits=True
  )
  assert sum(o.num_cached_tokens for o in on) > 0
  for a, b in zip(on, off, strict=True):
    assert a.output_tokens == b.output_tokens
    np.testing.assert_allclose(a.logits, b.logits, rtol=0, atol=1e-5 * np.abs(b.logits).max())


def test_generate_text_through_the_checkpoints_tokenizer(qwen_dir, tmp_path):
  from tokenizers import Tokenizer
  from tokenizers import models as tok_models
  from tokenizers import pre_tokenizers

  with_tokenizer = _copy(qwen_dir, tmp_path)
  vocab = {f"w{i}": i for i in range(256)}
  tok = Tokenizer(tok_models.WordLevel(vocab, unk_token="w0"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.save(os.path.join(with_tokenizer, "tokenizer.json"))
  engine = Engine.from_pretrained(with_tokenizer, block_size=16, num_blocks=32)
  prompt = " ".join(f"w{i}" for i in (3, 1, 4, 1, 5, 9, 2, 6))
  (text,) = engine.generate_text([prompt], 4)
  (want,) = engine.generate([[3, 1, 4, 1, 5, 9, 2, 6]], 4)
  assert text.split() == [f"w{t}" for t in want.output_tokens]
  with pytest.raises(ValueError, match="needs a tokenizer"):
    Engine.from_pretrained(qwen_dir, block_size=16, num_blocks=32).generate_text(["w1"], 1)


def test_mesh_shards_the_loaded_weights_and_serves_alike(qwen_dir):
  from hybrid_cache.engine import sharding as engine_sharding

  prompts = [[7, 8, 9] * 15 + [i] for i in range(2)]
  kw = dict(block_size=16, num_blocks=32, max_model_len=96, max_num_batched_tokens=64)
  one = Engine.from_pretrained(qwen_dir, **kw).generate(prompts, 3, return_logits=True)
  eng = Engine.from_pretrained(qwen_dir, mesh=engine_sharding.heads_mesh(2), **kw)
  two = eng.generate(prompts, 3, return_logits=True)
  assert len(eng.cache.k.sharding.device_set) == 2
  for a, b in zip(two, one, strict=True):
    assert a.output_tokens == b.output_tokens
    np.testing.assert_allclose(a.logits, b.logits, rtol=0, atol=1e-5 * np.abs(b.logits).max())


BAD = {
  "missing_tensor": (
    lambda d: _edit_tensors(d, lambda t: t.pop("model.layers.3.self_attn.q_norm.weight")),
    "missing tensor 'model.layers.3.self_attn.q_norm.weight'",
  ),
  "extra_tensor": (
    lambda d: _edit_tensors(
      d, lambda t: t.update({"model.layers.9.mlp.up_proj.weight": t["lm_head.weight"]})
    ),
    "unexpected tensor 'model.layers.9.mlp.up_proj.weight'",
  ),
  "wrong_shape": (
    lambda d: _edit_tensors(
      d, lambda t: t.update({"model.layers.0.mlp.up_proj.weight": jnp.zeros((7, 64))})
    ),
    r"tensor 'model.layers.0.mlp.up_proj.weight' has shape \(7, 64\)",
  ),
  "int_tensor": (
    lambda d: _edit_tensors(
      d, lambda t: t.update({"model.norm.weight": jnp.zeros((64,), jnp.int8)})
    ),
    "tensor 'model.norm.weight' has dtype int8",
  ),
  "unknown_model_type": (
    lambda d: _edit_config(d, model_type="llama"),
    "model_type must be one of .* got 'llama'",
  ),
  "unsupported_field": (
    lambda d: _edit_config(d, attention_bias=True),
    "config field attention_bias=True is not supported",
  ),
  "unsupported_layer": (
    lambda d: _edit_config(d, layer_types=["linear_attention"] * 3 + ["sliding_attention"]),
    r"config field layer_types\[3\]='sliding_attention' is not supported",
  ),
  "no_config": (lambda d: os.remove(os.path.join(d, "config.json")), "must hold a config.json"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_checkpoint_is_one_clear_error(qwen_dir, tmp_path, case):
  broken = _copy(qwen_dir, tmp_path)
  edit, message = BAD[case]
  edit(broken)
  with pytest.raises(ValueError, match=message) as err:
    Engine.from_pretrained(broken)
  assert "\n" not in str(err.value)
