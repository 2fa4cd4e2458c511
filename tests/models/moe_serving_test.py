"""Sparse MoE checkpoints through the engine: caching on == off, a mesh == one device, both
expert layouts load alike, and one clear error line per bad MoE checkpoint.

The checkpoints are `hf_checkpoints`' tiny Qwen3.5-MoE (GDN + gated attention, softmax router,
gated shared expert) and Nemotron-H MoE (Mamba2 + attention, sigmoid grouped router, relu2);
their parity with `transformers` is `hf_parity_test.py`'s. Skips without the `hf` extra.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors.flax import load_file  # noqa: E402
from safetensors.flax import save_file  # noqa: E402

from hybrid_cache.engine import sharding as engine_sharding  # noqa: E402
from hybrid_cache.engine.engine import Engine  # noqa: E402
from models import hf_config  # noqa: E402
from models.pretrained import load_pretrained  # noqa: E402
from tests.models import hf_checkpoints  # noqa: E402

SERVED = ("qwen3_5_moe", "nemotron_h_moe")
# Three prompts sharing a 60-token prefix: the second and third hit the cache.
PROMPTS = [[5, 6, 7] * 20 + [i] * 5 for i in range(3)]
KW = dict(
  block_size=16,
  num_blocks=48,
  max_model_len=128,
  max_num_batched_tokens=64,
  token_buckets=(64,),
  seq_buckets=(4,),
)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  cache = {}

  def get(name: str, fused: bool = False) -> str:
    if (name, fused) not in cache:
      directory = tmp_path_factory.mktemp(f"{name}_fused" if fused else name)
      cache[name, fused] = hf_checkpoints.save_tiny(name, directory, fused=fused)
    return cache[name, fused]

  return get


def _close(got, want):
  for a, b in zip(got, want, strict=True):
    assert a.finished and b.finished, (a.error, b.error)
    assert a.output_tokens == b.output_tokens
    np.testing.assert_allclose(a.logits, b.logits, rtol=0, atol=1e-5 * np.abs(b.logits).max())


@pytest.mark.parametrize("name", SERVED)
def test_caching_on_equals_off_and_a_mesh_equals_one_device(ckpt, name):
  directory = ckpt(name)
  on = Engine.from_pretrained(directory, **KW).generate(PROMPTS, 4, return_logits=True)
  off = Engine.from_pretrained(directory, enable_prefix_caching=False, **KW)
  _close(on, off.generate(PROMPTS, 4, return_logits=True))
  assert sum(o.num_cached_tokens for o in on) > 0  # the shared prefix was reused
  mesh = Engine.from_pretrained(directory, mesh=engine_sharding.heads_mesh(2), **KW)
  layer = load_pretrained(directory).config.moe_layers[0]
  w_up = mesh.params["blocks"][layer]["mlp"]["w_up"][...]
  assert w_up.addressable_shards[0].data.shape[2] == w_up.shape[2] // 2  # experts' width split
  _close(mesh.generate(PROMPTS, 4, return_logits=True), on)


@pytest.mark.parametrize("name", hf_checkpoints.MOE_MODEL_TYPES)
def test_fused_experts_load_as_the_per_expert_tensors(ckpt, name):
  per_expert, fused = load_pretrained(ckpt(name)), load_pretrained(ckpt(name, fused=True))
  tensors = load_file(os.path.join(ckpt(name, fused=True), "model.safetensors"))
  assert any(n.endswith(("experts.gate_up_proj", "experts.up_proj")) for n in tensors)
  want = _flat(per_expert.model)
  got = _flat(fused.model)
  assert want.keys() == got.keys()
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def _flat(model) -> dict:
  from flax import nnx

  return {".".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(nnx.state(model))}


def _edit(directory, tensors=None, **config) -> None:
  if tensors is not None:
    path = os.path.join(directory, "model.safetensors")
    all_tensors = load_file(path)
    tensors(all_tensors)
    save_file(all_tensors, path)
  if config:
    path = os.path.join(directory, "config.json")
    with open(path) as f:
      raw = json.load(f)
    raw.update(config)
    with open(path, "w") as f:
      json.dump(raw, f)


def test_bad_moe_checkpoints_are_one_clear_error(ckpt, tmp_path):
  import shutil

  nemotron = "backbone.layers.1.mixer"  # save_pretrained restores the original prefix
  cases = {
    "missing_expert": (
      dict(tensors=lambda t: t.pop(f"{nemotron}.experts.5.up_proj.weight")),
      f"missing tensor '{nemotron}.experts.5.up_proj.weight'",
    ),
    "odd_expert_shape": (
      dict(
        tensors=lambda t: t.update(
          {f"{nemotron}.experts.2.down_proj.weight": np.zeros((64, 8), np.float32)}
        )
      ),
      rf"tensor '{nemotron}.experts.2.down_proj.weight' has shape \(64, 8\)",
    ),
    "latent_moe": (dict(moe_latent_size=16), "config field moe_latent_size=16 is not supported"),
    "too_many_experts": (
      dict(num_experts_per_tok=9),
      r"moe_top_k must be in \[1, moe_num_experts=8\], got 9",
    ),
  }
  for case, (edit, message) in cases.items():
    broken = os.path.join(tmp_path, case)
    shutil.copytree(ckpt("nemotron_h_moe"), broken)
    _edit(broken, **edit)
    with pytest.raises(ValueError, match=message) as err:
      load_pretrained(broken)
    assert "\n" not in str(err.value), case


def test_sparse_layers_follow_decoder_sparse_step_and_mlp_only_layers():
  raw = {
    "model_type": "qwen3_next",
    "vocab_size": 32,
    "hidden_size": 16,
    "intermediate_size": 24,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 8,
    "num_hidden_layers": 8,
    "linear_num_key_heads": 1,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 8,
    "shared_expert_intermediate_size": 0,
    "decoder_sparse_step": 2,
    "mlp_only_layers": [5],
  }
  cfg = hf_config.from_hf_config(raw).config
  assert cfg.moe_layers == (1, 3, 7)  # every 2nd layer, 5 kept dense
  assert cfg.moe_shared_hidden == 0 and not cfg.moe_shared_gate
  dense = hf_config.from_hf_config({**raw, "mlp_only_layers": list(range(8))}).config
  assert dense.moe_layers == () and dense.moe_num_experts == 0
