"""Tiny random Hugging Face checkpoints built with `transformers` itself, for the parity and
serving tests (`hf_parity_test.py`, `tests/hybrid_cache/engine/pretrained_test.py`).

`save_tiny(model_type, directory)` builds the `transformers` model of that type from a tiny
config (the layer mix of the real architecture: GDN / Mamba2 / MLP-only / sliding-window /
full-attention layers), perturbs every parameter (norm weights start at 0 or 1, decays at their
init: noise makes a mapping mistake visible) and writes it with `save_pretrained`. Needs the
`hf` extra (transformers + CPU torch); callers skip without it.
"""

from __future__ import annotations

import os

import numpy as np

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128)
ATTN = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
GDN = dict(
  linear_key_head_dim=16,
  linear_value_head_dim=16,
  linear_num_key_heads=2,
  linear_num_value_heads=4,
  linear_conv_kernel_dim=4,
)
GDN_LAYERS = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
WINDOW = 24  # Gemma 3's sliding window in the tiny config: prompts cross it
MODEL_TYPES = ("qwen3_5_text", "qwen3_5", "qwen3_next", "nemotron_h", "gemma3_text")


def tiny_model(model_type: str, seed: int = 0):
  """The `transformers` model (fp32, eval mode, perturbed weights) of a tiny config."""
  import torch
  import transformers as tf

  torch.manual_seed(seed)
  if model_type == "qwen3_5_text":
    cfg = tf.Qwen3_5TextConfig(**TINY, **ATTN, **GDN, num_hidden_layers=4, layer_types=GDN_LAYERS)
    model = tf.Qwen3_5ForCausalLM(cfg)
  elif model_type == "qwen3_5":
    text = dict(**TINY, **ATTN, **GDN, num_hidden_layers=4, layer_types=GDN_LAYERS)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
    cfg = tf.Qwen3_5Config(text_config=text, vision_config=vision)
    model = tf.Qwen3_5ForConditionalGeneration(cfg)
  elif model_type == "qwen3_next":
    cfg = tf.Qwen3NextConfig(
      **TINY, **ATTN, **GDN, num_hidden_layers=4, layer_types=GDN_LAYERS, num_experts=0
    )
    model = tf.Qwen3NextForCausalLM(cfg)
  elif model_type == "nemotron_h":
    cfg = tf.NemotronHConfig(
      **TINY,
      **ATTN,
      layers_block_type=["linear_attention", "mlp", "linear_attention", "full_attention", "mlp"],
      ssm_state_size=16,
      mamba_num_heads=8,
      mamba_head_dim=8,
      n_groups=2,
      conv_kernel=4,
      chunk_size=64,
    )
    model = tf.NemotronHForCausalLM(cfg)
  elif model_type == "gemma3_text":
    cfg = tf.Gemma3TextConfig(
      **TINY,
      **ATTN,
      num_hidden_layers=6,
      query_pre_attn_scalar=16,
      sliding_window=WINDOW,
      layer_types=["sliding_attention"] * 5 + ["full_attention"],
    )
    model = tf.Gemma3ForCausalLM(cfg)
  else:
    raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith(("A_log", "dt_bias")):
        p.add_(0.3 * torch.randn_like(p))
      elif p.ndim == 1:  # norm weights, D, conv bias
        p.add_(0.2 * torch.randn_like(p))
      else:
        p.mul_(1.0 + 0.2 * torch.randn_like(p)).add_(0.02 * torch.randn_like(p))
  return model.float().eval()


def save_tiny(model_type: str, directory: str | os.PathLike, seed: int = 0) -> str:
  """Writes the tiny checkpoint of `model_type` into `directory`; returns its path."""
  model = tiny_model(model_type, seed)
  model.save_pretrained(os.fspath(directory))
  return os.fspath(directory)


def reference_logits(model, tokens) -> np.ndarray:
  """f32[len(tokens), vocab]: `transformers`' logits of one uncached forward pass."""
  import torch

  with torch.no_grad():
    out = model(input_ids=torch.tensor([list(tokens)]), use_cache=False)
  return out.logits[0].float().numpy()


def reference_greedy(model, prompt, n: int) -> list[int]:
  """`n` greedy tokens, each from a full uncached forward pass over the sequence so far."""
  seq = list(prompt)
  for _ in range(n):
    seq.append(int(reference_logits(model, seq)[-1].argmax()))
  return seq[len(prompt) :]
