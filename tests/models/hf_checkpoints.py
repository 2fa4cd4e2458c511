"""Tiny random Hugging Face checkpoints built with `transformers` itself, for the parity and
serving tests (`hf_parity_test.py`, `tests/hybrid_cache/engine/pretrained_test.py`).

`save_tiny(name, directory)` builds the `transformers` model `name` names (a `model_type`, or
`qwen3_next_moe` / `nemotron_h_moe`: those types with sparse MoE layers) from a tiny config (the
layer mix of the real architecture: GDN / Mamba2 / MLP-only / MoE / sliding-window /
full-attention layers), perturbs every parameter (norm weights start at 0 or 1, decays at their
init: noise makes a mapping mistake visible; MoE routers are scaled up so that tokens spread over
the experts with clear margins) and writes it with `save_pretrained` (per-expert tensors, the
published layout; `fused=True` keeps transformers 5's fused expert tensors). Needs the `hf` extra
(transformers + CPU torch); callers skip without it.
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
MOE = dict(moe_intermediate_size=32, num_experts_per_tok=2)
QWEN_MOE = dict(**MOE, num_experts=4, shared_expert_intermediate_size=48)
# Sparse MoE variants: Qwen3.5-MoE (every layer; 8 experts, top 3), its multimodal wrapper,
# Qwen3-Next with layer 1 dense (mlp_only_layers) and unnormalised top-k weights, Nemotron-H with
# two "moe" layers (8 relu2 experts in 2 groups, top 3 of the best group, scaling 2.5) and an
# "mlp" one.
MOE_MODEL_TYPES = ("qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next_moe", "nemotron_h_moe")
MODEL_TYPES = ("qwen3_5_text", "qwen3_5", "qwen3_next", "nemotron_h", "gemma3_text")
MODEL_TYPES += MOE_MODEL_TYPES
ROUTER_SCALE = 10.0  # router logits of std ~1.6: decisive top-k, several experts used


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
  elif model_type == "qwen3_5_moe_text":
    cfg = tf.Qwen3_5MoeTextConfig(
      vocab_size=256,
      hidden_size=64,
      **ATTN,
      **GDN,
      **{**QWEN_MOE, "num_experts": 8, "num_experts_per_tok": 3},
      num_hidden_layers=4,
      layer_types=GDN_LAYERS,
    )
    model = tf.Qwen3_5MoeForCausalLM(cfg)
  elif model_type == "qwen3_5_moe":
    text = dict(vocab_size=256, hidden_size=64, **ATTN, **GDN, **QWEN_MOE, num_hidden_layers=4)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
    cfg = tf.Qwen3_5MoeConfig(text_config={**text, "layer_types": GDN_LAYERS}, vision_config=vision)
    model = tf.Qwen3_5MoeForConditionalGeneration(cfg)
  elif model_type == "qwen3_next_moe":
    cfg = tf.Qwen3NextConfig(
      **TINY,
      **ATTN,
      **GDN,
      **QWEN_MOE,
      num_hidden_layers=4,
      layer_types=GDN_LAYERS,
      mlp_only_layers=[1],
      norm_topk_prob=False,
    )
    model = tf.Qwen3NextForCausalLM(cfg)
  elif model_type == "nemotron_h_moe":
    cfg = tf.NemotronHConfig(
      **TINY,
      **ATTN,
      layers_block_type=["linear_attention", "moe", "full_attention", "mlp", "moe"],
      ssm_state_size=16,
      mamba_num_heads=8,
      mamba_head_dim=8,
      n_groups=2,
      conv_kernel=4,
      chunk_size=64,
      **{**MOE, "num_experts_per_tok": 3},
      n_routed_experts=8,
      moe_shared_expert_intermediate_size=48,
      n_group=2,
      topk_group=1,
      routed_scaling_factor=2.5,
    )
    model = tf.NemotronHForCausalLM(cfg)
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
      if name.endswith((".mlp.gate.weight", ".mixer.gate.weight")):  # a MoE router
        p.mul_(ROUTER_SCALE)
  return model.float().eval()


def save_tiny(
  model_type: str, directory: str | os.PathLike, seed: int = 0, *, fused: bool = False
) -> str:
  """Writes the tiny checkpoint of `model_type` into `directory`; returns its path.

  `fused`: MoE experts as transformers 5 holds them in memory (`experts.gate_up_proj` ...)
  instead of one tensor per expert (`save_pretrained(save_original_format=False)`).
  """
  model = tiny_model(model_type, seed)
  model.save_pretrained(os.fspath(directory), save_original_format=not fused)
  return os.fspath(directory)


def reference_routing(model, tokens) -> list[np.ndarray]:
  """int[len(tokens), k] per MoE layer, in layer order: the experts `transformers`' routers
  pick for each token in one uncached forward pass (recorded by forward hooks)."""
  import torch

  picked: list[np.ndarray] = []
  routers = [m for m in model.modules() if type(m).__name__.lower().endswith("topkrouter")]
  hooks = [
    r.register_forward_hook(lambda _m, _i, out: picked.append(out[2].numpy().copy()))
    for r in routers
  ]
  try:
    with torch.no_grad():
      model(input_ids=torch.tensor([list(tokens)]), use_cache=False)
  finally:
    for h in hooks:
      h.remove()
  return picked


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
