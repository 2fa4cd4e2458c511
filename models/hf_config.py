"""A Hugging Face `config.json` -> our `ModelConfig` (plus where the weights live).

Supported `model_type`s and what they map to (`models.config` documents the switches):

  qwen3_5_text, qwen3_5   Qwen3.5: "linear_attention" -> G, "full_attention" -> A; pre-norm
                          blocks, (1 + w) RMSNorms, gated attention (output gate, q/k norm,
                          partial rotary), dense SwiGLU MLP. `qwen3_5` is the published
                          multimodal checkpoint: its `text_config` is loaded, the vision tower
                          (`model.visual.*`) and the multi-token-prediction head (`mtp.*`) are
                          skipped. Text-only positions make its multimodal RoPE (mrope) the plain
                          1-D RoPE.
  qwen3_5_moe_text,       Qwen3.5-MoE: as Qwen3.5, every layer's MLP being the sparse MoE block
  qwen3_5_moe             (`models.moe`): `num_experts` experts of `moe_intermediate_size`,
                          `num_experts_per_tok` of them per token (softmax router, weights
                          renormalised), a shared expert of `shared_expert_intermediate_size`
                          with its sigmoid gate. `qwen3_5_moe` is the published multimodal
                          checkpoint (Qwen3.5-35B-A3B): as `qwen3_5`, its language model only.
  qwen3_next              Qwen3-Next: as Qwen3.5 (its fused `in_proj_qkvz` / `in_proj_ba` are
                          split at load time); with `num_experts` > 0, layer i's MLP is the MoE
                          block of Qwen3.5-MoE (top-k weights renormalised iff `norm_topk_prob`)
                          unless i is in `mlp_only_layers` or (i + 1) % `decoder_sparse_step` != 0.
                          Its MTP head (`mtp.*`) is skipped.
  nemotron_h              Nemotron-H: one sublayer per layer (`block_style="single"`) from
                          `layers_block_type` (or the legacy `hybrid_override_pattern`):
                          "linear_attention"/M -> M, "full_attention"/* -> A (no RoPE),
                          "mlp"/- -> - (relu2 MLP, no gate), "moe"/E -> a "-" layer whose MLP is
                          the MoE block: `n_routed_experts` relu2 experts (no gate) of
                          `moe_intermediate_size`, sigmoid router with `e_score_correction_bias`,
                          grouped top-`num_experts_per_tok` (`n_group`, `topk_group`),
                          `norm_topk_prob`, `routed_scaling_factor`, and a relu2 shared expert of
                          `moe_shared_expert_intermediate_size` (Nemotron-3-Nano-30B-A3B); the
                          latent MoE projection (`moe_latent_size`) is not supported.
                          Mamba2's time step is bounded below by `time_step_min`.
  gemma3_text, gemma3     Gemma 3: "sliding_attention" -> S (window `sliding_window`),
                          "full_attention" -> A; sandwich norms, (1 + w) RMSNorms, q/k norm,
                          scaled embeddings, GeGLU (gelu_tanh) MLP, tied LM head, two RoPE bases
                          (linear scaling on the full layers); `gemma3` (multimodal): the text
                          model, vision tower and projector skipped.

The cache groups follow from the layer letters as vLLM derives its KV-cache groups by layer spec
(`ModelConfig.cache_groups`: full attention, sliding window with its window, recurrent).

Anything a config asks for that we do not implement raises one `ValueError` naming the field and
its value (e.g. `attention_bias=True`, `moe_latent_size`, `attn_logit_softcapping`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from models.config import DTYPES
from models.config import ModelConfig

SUPPORTED_MODEL_TYPES = (
  "qwen3_5",
  "qwen3_5_text",
  "qwen3_5_moe",
  "qwen3_5_moe_text",
  "qwen3_next",
  "nemotron_h",
  "gemma3",
  "gemma3_text",
)
# Multimodal wrappers: (text model type, prefix of the language model's tensors, skipped parts).
_MULTIMODAL = {
  "qwen3_5": ("qwen3_5_text", "model.language_model.", ("model.visual.", "mtp.")),
  "qwen3_5_moe": ("qwen3_5_moe_text", "model.language_model.", ("model.visual.", "mtp.")),
  "gemma3": (
    "gemma3_text",
    "model.language_model.",
    ("model.vision_tower.", "model.multi_modal_projector."),
  ),
}
_NEMOTRON_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
# Text models whose checkpoints may carry a multi-token-prediction head (`mtp.*`, not loaded).
_HAS_MTP = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "nemotron_h")


@dataclasses.dataclass(frozen=True)
class HFArchitecture:
  """What `from_hf_config` derives from a checkpoint's config.

  Attributes:
    model_type: the text model's type (`qwen3_5_text`, `qwen3_5_moe_text`, `qwen3_next`,
      `nemotron_h`, `gemma3_text`); the family of the weight names (`models.hf_weights`).
    config: our `ModelConfig`.
    prefixes: accepted prefixes of the decoder's tensor names (e.g. "model."); the LM head is
      `lm_head.weight` unless tied.
    skipped: name prefixes of tensors that are present but not loaded (vision tower, MTP).
    notes: what was skipped or simplified, for a log line.
  """

  model_type: str
  config: ModelConfig
  prefixes: tuple[str, ...]
  skipped: tuple[str, ...] = ()
  notes: tuple[str, ...] = ()


def read_config(model_dir: str | os.PathLike) -> dict[str, Any]:
  """The parsed `config.json` of `model_dir` (ValueError when missing or not JSON)."""
  path = os.path.join(os.fspath(model_dir), "config.json")
  if not os.path.isfile(path):
    raise ValueError(f"model_dir must hold a config.json, none at {path}")
  try:
    with open(path) as f:
      raw = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"config.json at {path} is not valid JSON: {e}") from None
  if not isinstance(raw, dict):
    raise ValueError(f"config.json at {path} must hold a JSON object")
  return raw


def from_hf_config(raw: Mapping[str, Any], *, dtype: str | None = None) -> HFArchitecture:
  """Our `ModelConfig` for a Hugging Face config dict (see the module docstring).

  Args:
    raw: the parsed `config.json`.
    dtype: "float32" | "bfloat16"; None = the config's `dtype` (`torch_dtype`) when it is one
      of those, else float32.
  """
  model_type = raw.get("model_type")
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise ValueError(f"model_type must be one of {SUPPORTED_MODEL_TYPES}, got {model_type!r}")
  prefixes: tuple[str, ...] = ("model.",)
  skipped: tuple[str, ...] = ()
  notes: tuple[str, ...] = ()
  text = dict(raw)
  if model_type in _MULTIMODAL:
    text_type, prefix, skipped = _MULTIMODAL[model_type]
    if not isinstance(raw.get("text_config"), Mapping):
      raise ValueError(f"text_config must be an object in a {model_type!r} config")
    text = {**raw["text_config"], "model_type": text_type}
    text.setdefault("tie_word_embeddings", raw.get("tie_word_embeddings", False))
    prefixes = (prefix,)
    notes = (f"{model_type}: loading the language model only; skipped {', '.join(skipped)}",)
    model_type = text_type
  if model_type in _HAS_MTP and "mtp." not in skipped:
    skipped = (*skipped, "mtp.")  # the multi-token-prediction head: not part of the decoder
  if model_type == "nemotron_h":
    prefixes = ("backbone.", "model.")
  kw = _BUILDERS[model_type](text)
  kw["dtype"] = _dtype(text, dtype)
  return HFArchitecture(model_type, ModelConfig(**kw), prefixes, skipped, notes)


# ---- shared field readers ----


def _get(raw: Mapping[str, Any], field: str, default: Any = None, *, required: bool = False):
  if field not in raw or raw[field] is None:
    if required:
      raise ValueError(f"config field {field} is required")
    return default
  return raw[field]


def _unsupported(raw: Mapping[str, Any], field: str, allowed: tuple) -> None:
  value = raw.get(field)
  if value not in allowed:
    raise ValueError(
      f"config field {field}={value!r} is not supported (supported: {list(allowed)})"
    )


def _dtype(raw: Mapping[str, Any], dtype: str | None) -> str:
  if dtype is not None:
    if dtype not in DTYPES:
      raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    return dtype
  declared = raw.get("dtype", raw.get("torch_dtype"))
  return declared if declared in DTYPES else "float32"


def _head_dim(raw: Mapping[str, Any]) -> int:
  head_dim = raw.get("head_dim")
  if head_dim is None:
    return int(_get(raw, "hidden_size", required=True)) // int(
      _get(raw, "num_attention_heads", required=True)
    )
  return int(head_dim)


def _rope(raw: Mapping[str, Any], layer_type: str | None = None) -> dict[str, Any]:
  """The RoPE parameters (transformers 5's `rope_parameters`, or the 4.x top-level fields)."""
  params = raw.get("rope_parameters")
  if isinstance(params, Mapping) and layer_type is not None and layer_type in params:
    params = params[layer_type]
  if not isinstance(params, Mapping):
    params = dict(raw.get("rope_scaling") or {})
    params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    if "partial_rotary_factor" in raw:
      params["partial_rotary_factor"] = raw["partial_rotary_factor"]
  params = dict(params)
  params.setdefault("rope_type", params.pop("type", "default"))
  return params


def _rope_default(params: Mapping[str, Any], field: str) -> None:
  if params.get("rope_type") != "default":
    raise ValueError(
      f"config field {field}.rope_type={params.get('rope_type')!r} is not supported "
      "(supported: ['default'])"
    )


def _common(raw: Mapping[str, Any], eps_field: str, moe: Mapping[str, Any]) -> dict[str, Any]:
  """The shared fields; `moe`: what `_qwen_moe` / `_nemotron_moe` read ({} without MoE layers).

  `intermediate_size` (the dense MLP's width) is only required when some layer has a dense MLP:
  a model whose every MLP is sparse (Qwen3.5-MoE, which has no such field) takes the experts'
  width there, unused.
  """
  dense = not moe or len(moe["moe_layers"]) < moe["_ffn_layers"]
  mlp_hidden = _get(raw, "intermediate_size", None if dense else moe.get("moe_hidden"))
  if mlp_hidden is None:
    raise ValueError("config field intermediate_size is required")
  return dict(
    vocab_size=int(_get(raw, "vocab_size", required=True)),
    d_model=int(_get(raw, "hidden_size", required=True)),
    mlp_hidden=int(mlp_hidden),
    num_heads=int(_get(raw, "num_attention_heads", 1)),
    num_kv_heads=int(_get(raw, "num_key_value_heads", _get(raw, "num_attention_heads", 1))),
    head_dim=_head_dim(raw) if "num_attention_heads" in raw else 16,
    norm_eps=float(_get(raw, eps_field, 1e-6)),
    tie_word_embeddings=bool(_get(raw, "tie_word_embeddings", False)),
  )


def _layer_letters(types: Any, mapping: Mapping[str, str], field: str) -> str:
  if not isinstance(types, (list, tuple)) or not types:
    raise ValueError(f"config field {field} must be a non-empty list of layer types")
  letters = []
  for i, t in enumerate(types):
    if t not in mapping:
      raise ValueError(
        f"config field {field}[{i}]={t!r} is not supported (supported: {sorted(mapping)})"
      )
    letters.append(mapping[t])
  return "".join(letters)


# ---- per model type ----


def _int_field(raw: Mapping[str, Any], field: str, default: int | None = None) -> int:
  """`raw[field]` as an integer >= 0 (`default` when absent; required without one)."""
  value = _get(raw, field, default, required=default is None)
  if isinstance(value, bool) or not isinstance(value, int) or value < 0:
    raise ValueError(f"config field {field} must be an integer >= 0, got {value!r}")
  return value


def _qwen_moe(raw: Mapping[str, Any], n_layers: int) -> dict[str, Any]:
  """The MoE fields of Qwen3.5-MoE (every layer sparse) / Qwen3-Next (`num_experts` > 0: the
  layers chosen by `decoder_sparse_step` and `mlp_only_layers`); {} when every MLP is dense."""
  if raw["model_type"] == "qwen3_5_moe_text":
    layers = tuple(range(n_layers))
  else:
    if _int_field(raw, "num_experts", 0) == 0:
      return {}
    step = _int_field(raw, "decoder_sparse_step", 1)
    if step < 1:
      raise ValueError(f"config field decoder_sparse_step must be >= 1, got {step}")
    dense = raw.get("mlp_only_layers") or []
    if not isinstance(dense, (list, tuple)):
      raise ValueError(
        f"config field mlp_only_layers must be a list of layer indices, got {dense!r}"
      )
    layers = tuple(i for i in range(n_layers) if i not in set(dense) and (i + 1) % step == 0)
    if not layers:
      return {}
  shared = _int_field(raw, "shared_expert_intermediate_size", 0)
  return dict(
    moe_layers=layers,
    moe_num_experts=_int_field(raw, "num_experts"),
    moe_top_k=_int_field(raw, "num_experts_per_tok"),
    moe_hidden=_int_field(raw, "moe_intermediate_size"),
    moe_shared_hidden=shared,
    moe_shared_gate=shared > 0,
    moe_router="softmax",
    # Qwen3.5-MoE's router always renormalises (its config has no norm_topk_prob).
    moe_norm_topk=bool(raw.get("norm_topk_prob", True)),
    _ffn_layers=n_layers,
  )


def _qwen(raw: Mapping[str, Any]) -> dict[str, Any]:
  """Qwen3.5 text / Qwen3.5-MoE text / Qwen3-Next (dense or sparse MoE MLPs)."""
  _unsupported(raw, "attention_bias", (False, None))
  _unsupported(raw, "hidden_act", ("silu", None))
  n_layers = int(_get(raw, "num_hidden_layers", required=True))
  types = raw.get("layer_types")
  if types is None:  # transformers' default: every full_attention_interval-th layer is full
    interval = int(raw.get("full_attention_interval", 4))
    types = [
      "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)
    ]
  pattern = _layer_letters(types, {"linear_attention": "G", "full_attention": "A"}, "layer_types")
  rope = _rope(raw)
  _rope_default(rope, "rope_parameters")
  moe = _qwen_moe(raw, len(pattern))
  kw = _common(raw, "rms_norm_eps", moe)
  rotary = int(kw["head_dim"] * float(rope.get("partial_rotary_factor", 1.0)))
  return dict(
    kw,
    **_moe_kwargs(moe),
    layer_pattern=pattern,
    num_layers=len(pattern),
    rope_theta=float(rope.get("rope_theta", 10000.0)),
    gdn_num_k_heads=int(_get(raw, "linear_num_key_heads", required=True)),
    gdn_num_v_heads=int(_get(raw, "linear_num_value_heads", required=True)),
    gdn_head_k_dim=int(_get(raw, "linear_key_head_dim", required=True)),
    gdn_head_v_dim=int(_get(raw, "linear_value_head_dim", required=True)),
    conv_kernel=int(_get(raw, "linear_conv_kernel_dim", 4)),
    norm_offset=True,
    attn_output_gate=True,
    qk_norm=True,
    rotary_dim=rotary,
  )


def _moe_kwargs(moe: Mapping[str, Any]) -> dict[str, Any]:
  """The `ModelConfig` fields of `moe` (its private counts dropped)."""
  return {k: v for k, v in moe.items() if not k.startswith("_")}


def _nemotron_moe(raw: Mapping[str, Any], types: list[str]) -> dict[str, Any]:
  """The MoE fields of Nemotron-H's "moe" layers; {} without any."""
  layers = tuple(i for i, t in enumerate(types) if t == "moe")
  if not layers:
    return {}
  _unsupported(raw, "moe_latent_size", (None,))
  scaling = _get(raw, "routed_scaling_factor", 1.0)
  if isinstance(scaling, bool) or not isinstance(scaling, (int, float)):
    raise ValueError(f"config field routed_scaling_factor must be a number, got {scaling!r}")
  experts = "n_routed_experts"  # transformers' name; `num_local_experts` is its alias
  if raw.get(experts) is None and raw.get("num_local_experts") is not None:
    experts = "num_local_experts"
  return dict(
    moe_layers=layers,
    moe_num_experts=_int_field(raw, experts),
    moe_top_k=_int_field(raw, "num_experts_per_tok"),
    moe_hidden=_int_field(raw, "moe_intermediate_size"),
    moe_shared_hidden=_int_field(raw, "moe_shared_expert_intermediate_size"),
    moe_router="sigmoid",
    moe_norm_topk=bool(raw.get("norm_topk_prob", True)),
    moe_n_group=_int_field(raw, "n_group", 1),
    moe_topk_group=_int_field(raw, "topk_group", 1),
    moe_scaling=float(scaling),
    _ffn_layers=sum(t in ("mlp", "moe") for t in types),
  )


def _nemotron_h(raw: Mapping[str, Any]) -> dict[str, Any]:
  """Nemotron-H (Mamba2, attention, relu2 MLP and sparse MoE layers)."""
  for field in ("attention_bias", "mlp_bias", "use_bias", "mamba_proj_bias"):
    _unsupported(raw, field, (False, None))
  _unsupported(raw, "mamba_hidden_act", ("silu", None))
  _unsupported(raw, "mlp_hidden_act", ("relu2", None))
  _unsupported(raw, "sliding_window", (None,))
  types = raw.get("layers_block_type")
  field = "layers_block_type"
  if types is None and isinstance(raw.get("hybrid_override_pattern"), str):
    field = "hybrid_override_pattern"
    pat = raw["hybrid_override_pattern"]
    bad = [c for c in pat if c not in _NEMOTRON_PATTERN]
    if bad:
      raise ValueError(f"config field hybrid_override_pattern has unknown letters {bad}")
    types = [_NEMOTRON_PATTERN[c] for c in pat]
  mapping = {"linear_attention": "M", "full_attention": "A", "mlp": "-", "moe": "-"}
  pattern = _layer_letters(types, mapping, field)
  _unsupported(raw, "use_conv_bias", (True, None))
  moe = _nemotron_moe(raw, list(types))
  kw = _common(raw, "layer_norm_epsilon", moe)
  return dict(
    kw,
    **_moe_kwargs(moe),
    layer_pattern=pattern,
    num_layers=len(pattern),
    block_style="single",
    rotary_dim=0,
    mlp_activation="relu2",
    mlp_gated=False,
    mamba_num_heads=int(_get(raw, "mamba_num_heads", required=True)),
    mamba_head_dim=int(_get(raw, "mamba_head_dim", required=True)),
    mamba_state_dim=int(_get(raw, "ssm_state_size", required=True)),
    mamba_n_groups=int(_get(raw, "n_groups", 1)),
    conv_kernel=int(_get(raw, "conv_kernel", 4)),
    mamba_dt_min=float(_get(raw, "time_step_min", 0.0)),
  )


def _gemma3(raw: Mapping[str, Any]) -> dict[str, Any]:
  """Gemma 3 text."""
  _unsupported(raw, "attention_bias", (False, None))
  _unsupported(raw, "attn_logit_softcapping", (None,))
  _unsupported(raw, "use_bidirectional_attention", (False, None))
  _unsupported(raw, "hidden_activation", ("gelu_pytorch_tanh", None))
  n_layers = int(_get(raw, "num_hidden_layers", required=True))
  types = raw.get("layer_types")
  if types is None:
    every = int(raw.get("sliding_window_pattern", raw.get("_sliding_window_pattern", 6)))
    types = [
      "full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n_layers)
    ]
  pattern = _layer_letters(types, {"sliding_attention": "S", "full_attention": "A"}, "layer_types")
  full = _rope(raw, "full_attention")
  local = _rope(raw, "sliding_attention")
  if "rope_parameters" not in raw or not isinstance(raw["rope_parameters"], Mapping):
    local = {"rope_type": "default", "rope_theta": raw.get("rope_local_base_freq", 10000.0)}
  _rope_default(local, "rope_parameters.sliding_attention")
  factor = 1.0
  if full.get("rope_type") == "linear":
    factor = float(full["factor"])
  else:
    _rope_default(full, "rope_parameters.full_attention")
  kw = _common(raw, "rms_norm_eps", {})
  kw["tie_word_embeddings"] = bool(_get(raw, "tie_word_embeddings", True))
  scalar = _get(raw, "query_pre_attn_scalar", kw["head_dim"])
  softcap = raw.get("final_logit_softcapping")
  return dict(
    kw,
    layer_pattern=pattern,
    num_layers=len(pattern),
    window=int(_get(raw, "sliding_window", required=True)) if "S" in pattern else None,
    rope_theta=float(full.get("rope_theta", 1_000_000.0)),
    rope_local_theta=float(local.get("rope_theta", 10_000.0)),
    rope_factor=factor,
    block_style="sandwich",
    norm_offset=True,
    qk_norm=True,
    attn_scale=float(scalar) ** -0.5,
    mlp_activation="gelu_tanh",
    embed_scale=True,
    final_logit_softcap=None if softcap is None else float(softcap),
  )


_BUILDERS = {
  "qwen3_5_text": _qwen,
  "qwen3_5_moe_text": _qwen,
  "qwen3_next": _qwen,
  "nemotron_h": _nemotron_h,
  "gemma3_text": _gemma3,
}
