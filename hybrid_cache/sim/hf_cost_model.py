"""The simulator's cost model (`cost_model.CostModel`) from a Hugging Face `config.json`.

Reads the fields of transformers 5's configs with the same meaning as the engine's loader
(`models/hf_config.py`, the authority on which field means what; not imported: the simulator
never imports `models/`). Each supported `model_type` maps to layer counts and shapes:

  qwen3_5_text, qwen3_5_moe_text, qwen3_next, qwen3_5 / qwen3_5_moe (multimodal: `text_config`)
      `layer_types`: "linear_attention" -> GDN, "full_attention" -> attention; without it every
      `full_attention_interval`-th layer (default 4) is full. Every layer also has a feed-forward:
      a dense SwiGLU MLP of `intermediate_size` (3 matrices, n_mlp), or a sparse MoE (n_moe):
      every layer of Qwen3.5-MoE; with Qwen3-Next's `num_experts` > 0 every layer i not in
      `mlp_only_layers` with (i + 1) % `decoder_sparse_step` == 0 (the engine loader's rule). A MoE
      layer: a router over `num_experts`, `num_experts_per_tok` SwiGLU experts of
      `moe_intermediate_size`, a shared SwiGLU expert of `shared_expert_intermediate_size` with its
      sigmoid gate (a D -> 1 projection). Attention: `num_attention_heads` Hq,
      `num_key_value_heads` Hkv, `head_dim` (default hidden_size // Hq), with an output gate
      (q_proj emits 2 Hq head_dim: `CostModel.attn_output_gate`). GDN: `linear_num_key_heads`
      Hk, `linear_num_value_heads` Hv, `linear_key_head_dim` dk, `linear_value_head_dim` dv,
      `linear_conv_kernel_dim` K (default 4); conv_dim = 2 Hk dk + Hv dv.
  nemotron_h
      `layers_block_type` ("linear_attention" -> Mamba2, "full_attention", "mlp", "moe") or the
      legacy `hybrid_override_pattern` (M, *, -, E). Each layer is one sublayer: n_mlp counts the
      "mlp" layers alone, each a relu2 MLP without gate (2 matrices of `intermediate_size`); n_moe
      the "moe" layers: a router over `n_routed_experts`, `num_experts_per_tok` relu2 experts of
      `moe_intermediate_size` (2 matrices) and a relu2 shared expert of
      `moe_shared_expert_intermediate_size` (no gate; `moe_latent_size` raises ValueError).
      Mamba2: `mamba_num_heads` H, `mamba_head_dim` P, `ssm_state_size` N, `n_groups` G
      (default 1), `conv_kernel` K (default 4); d_inner = H P.
      Attention without output gate; `head_dim` (else the legacy `attention_head_dim`, else
      hidden_size // Hq).
  gemma3_text, gemma3 (multimodal: its `text_config`)
      `layer_types`: "sliding_attention" (window `sliding_window`) / "full_attention"; without
      it every `sliding_window_pattern`-th layer (default 6) is full. A GeGLU MLP of
      `intermediate_size` in every layer (3 matrices); no recurrent layers.

FLOPs then follow `cost_model`'s "generic" formulas (a MoE layer: its active parameters only;
`intermediate_size` is required only when some layer has a dense MLP). Bytes: KV and conv state
elements take the config's `dtype` (or `torch_dtype`): bfloat16 / float16 -> 2 bytes, float32 ->
4; absent -> 2 (bfloat16, what the published checkpoints declare and the presets assume); MoE
layers hold none. The recurrent (SSM) state is fp32 (4 bytes), vLLM's choice for these models
(its Qwen3.5 and NemotronH config hooks set `mamba_ssm_cache_dtype` float32), unless the config
says otherwise: `mamba_ssm_dtype` (Qwen) / `mamba_ssm_cache_dtype` (Nemotron-H), "auto" meaning
the model dtype. The TTFT line stays Marconi's (as every preset: an assumption). GDN models
declare vLLM's 64-token checkpoint alignment (FlashInfer's GDN prefill on Hopper), as the
`qwen3_5_like` preset; Mamba2 declares none (1).

Example::

  m = load_cost_model("checkpoints/Qwen3.5-4B")   # a directory holding config.json, or the file
  m.n_recurrent, m.n_attn                         # (24, 8)

Any other `model_type`, a missing required field or an unsupported value raises one-line
ValueError naming it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from hybrid_cache.sim.cost_model import CostModel

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
# wrapper -> text_config type
_MULTIMODAL = {
  "qwen3_5": "qwen3_5_text",
  "qwen3_5_moe": "qwen3_5_moe_text",
  "gemma3": "gemma3_text",
}
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_DEFAULT_DTYPE = "bfloat16"
_GDN_CHECKPOINT_ALIGNMENT = 64  # FlashInfer's GDN prefill (Hopper), as `qwen3_5_like`
_NEMOTRON_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}


def load_cost_model(path: str | os.PathLike, *, name: str | None = None) -> CostModel:
  """The cost model of the `config.json` at `path` (the file, or a directory holding one).

  `name` defaults to `path` as given. ValueError (one line, naming the path) when the file is
  missing, unreadable, not JSON or not a JSON object, or the config is unsupported.
  """
  given = os.fspath(path)
  file = os.path.join(given, "config.json") if os.path.isdir(given) else given
  if not os.path.isfile(file):
    raise ValueError(f"model config {file!r} does not exist")
  try:
    with open(file, encoding="utf-8") as f:
      raw = json.load(f)
  except OSError as e:
    raise ValueError(f"model config {file!r}: {e.strerror or type(e).__name__}") from None
  except UnicodeDecodeError as e:
    raise ValueError(f"model config {file!r} is not UTF-8 text (byte {e.start})") from None
  except json.JSONDecodeError as e:
    raise ValueError(
      f"model config {file!r}: malformed JSON at line {e.lineno}, column {e.colno}"
    ) from None
  if not isinstance(raw, dict):
    raise ValueError(f"model config {file!r} must hold a JSON object")
  try:
    return cost_model_from_hf_config(raw, name=given if name is None else name)
  except ValueError as e:
    raise ValueError(f"model config {file!r}: {e}") from None


def cost_model_from_hf_config(raw: Mapping[str, Any], *, name: str | None = None) -> CostModel:
  """The cost model of a parsed Hugging Face config (module docstring for the mapping).

  Args:
    raw: the parsed `config.json`.
    name: the cost model's name; None = the config's `_name_or_path`, else its `model_type`.
  """
  model_type = raw.get("model_type")
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise ValueError(f"model_type must be one of {SUPPORTED_MODEL_TYPES}, got {model_type!r}")
  if name is None:
    name = str(raw.get("_name_or_path") or model_type)
  text = dict(raw)
  if model_type in _MULTIMODAL:
    if not isinstance(raw.get("text_config"), Mapping):
      raise ValueError(f"config field text_config must be an object in a {model_type!r} config")
    text = {**raw["text_config"], "model_type": _MULTIMODAL[model_type]}
    for field in ("dtype", "torch_dtype"):  # the wrapper may declare the dtype alone
      if text.get(field) is None and raw.get(field) is not None:
        text[field] = raw[field]
  return _BUILDERS[text["model_type"]](text, name)


# ---- shared field readers ----


def _int(raw: Mapping[str, Any], field: str, default: int | None = None) -> int:
  """`raw[field]` as an int >= 1 (`default` when absent; ValueError naming it otherwise)."""
  value = raw.get(field)
  if value is None:
    if default is None:
      raise ValueError(f"config field {field} is required for model_type {raw['model_type']!r}")
    return default
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"config field {field} must be an integer >= 1, got {value!r}")
  return value


def _dtype_bytes(raw: Mapping[str, Any], field: str, default: int) -> int:
  """Bytes per element of the dtype named by `field` ("auto" / absent: `default`)."""
  value = raw.get(field)
  if value is None or value == "auto":
    return default
  if value not in _DTYPE_BYTES:
    raise ValueError(
      f"config field {field}={value!r} is not supported (supported: {[*_DTYPE_BYTES]})"
    )
  return _DTYPE_BYTES[value]


def _model_bytes(raw: Mapping[str, Any]) -> int:
  field = "dtype" if raw.get("dtype") is not None else "torch_dtype"
  return _dtype_bytes(raw, field, _DTYPE_BYTES[_DEFAULT_DTYPE])


def _layer_types(raw: Mapping[str, Any], field: str, allowed: tuple[str, ...]) -> list[str]:
  """The per-layer types of `raw[field]`, checked against `allowed` and num_hidden_layers."""
  types = raw[field]
  if not isinstance(types, (list, tuple)) or not types:
    raise ValueError(f"config field {field} must be a non-empty list of layer types")
  for i, t in enumerate(types):
    if t not in allowed:
      raise ValueError(f"config field {field}[{i}]={t!r} is not supported (supported: {allowed})")
  n = raw.get("num_hidden_layers")
  if n is not None and n != len(types):
    raise ValueError(f"config field {field} has {len(types)} layers, num_hidden_layers is {n}")
  return list(types)


def _every_nth(raw: Mapping[str, Any], every: int, other: str) -> list[str]:
  """transformers' default pattern: every `every`-th layer full, the others `other`."""
  n = _int(raw, "num_hidden_layers")
  return ["full_attention" if (i + 1) % every == 0 else other for i in range(n)]


def _attention(raw: Mapping[str, Any], head_dim_fields: tuple[str, ...]) -> dict[str, int]:
  """q_heads, kv_heads (default q_heads) and head_dim: the first of `head_dim_fields` present,
  else hidden_size // q_heads."""
  hq = _int(raw, "num_attention_heads")
  field = next((f for f in head_dim_fields if raw.get(f) is not None), None)
  head_dim = _int(raw, "hidden_size") // hq if field is None else _int(raw, field)
  return dict(q_heads=hq, kv_heads=_int(raw, "num_key_value_heads", hq), head_dim=head_dim)


# ---- per model type ----


def _qwen_moe_layers(raw: Mapping[str, Any], n: int) -> int:
  """How many of the n layers are sparse MoE (module docstring)."""
  if raw["model_type"] == "qwen3_5_moe_text":
    return n
  experts = raw.get("num_experts") or 0
  if isinstance(experts, bool) or not isinstance(experts, int) or experts < 0:
    raise ValueError(f"config field num_experts must be an integer >= 0, got {experts!r}")
  if experts == 0:
    return 0
  step = _int(raw, "decoder_sparse_step", 1)
  dense = raw.get("mlp_only_layers") or []
  if not isinstance(dense, (list, tuple)):
    raise ValueError(f"config field mlp_only_layers must be a list of layer indices, got {dense!r}")
  return sum(i not in set(dense) and (i + 1) % step == 0 for i in range(n))


def _moe(
  raw: Mapping[str, Any], n_moe: int, *, experts: str, shared: str, gate: bool, matrices: int
) -> dict[str, Any]:
  """The MoE fields of a `CostModel` with `n_moe` MoE layers ({} when 0).

  Args:
    experts / shared: the config fields of the routed expert count and the shared expert's
      width (0 = no shared expert).
    gate: the shared expert has Qwen's sigmoid gate; matrices: weight matrices per expert.
  """
  if not n_moe:
    return {}
  shared_d_ff = 0 if raw.get(shared) == 0 else _int(raw, shared)
  return dict(
    n_moe=n_moe,
    moe_experts=_int(raw, experts),
    moe_top_k=_int(raw, "num_experts_per_tok"),
    moe_d_ff=_int(raw, "moe_intermediate_size"),
    moe_shared_d_ff=shared_d_ff,
    moe_shared_gate=gate and shared_d_ff > 0,
    moe_matrices=matrices,
  )


def _qwen(raw: Mapping[str, Any], name: str) -> CostModel:
  """Qwen3.5 text / Qwen3.5-MoE / Qwen3-Next: GDN + gated full attention, a SwiGLU MLP or a
  sparse MoE of SwiGLU experts in every layer."""
  if raw.get("layer_types") is None:
    types = _every_nth(raw, _int(raw, "full_attention_interval", 4), "linear_attention")
  else:
    types = _layer_types(raw, "layer_types", ("linear_attention", "full_attention"))
  n_moe = _qwen_moe_layers(raw, len(types))
  n_mlp = len(types) - n_moe
  model_bytes = _model_bytes(raw)
  return CostModel(
    name=name,
    d_model=_int(raw, "hidden_size"),
    n_attn=types.count("full_attention"),
    n_recurrent=types.count("linear_attention"),
    n_mlp=n_mlp,
    **_moe(
      raw,
      n_moe,
      experts="num_experts",
      shared="shared_expert_intermediate_size",
      gate=True,
      matrices=3,
    ),
    recurrent="gdn",
    **_attention(raw, ("head_dim",)),
    attn_output_gate=True,
    kv_dtype_bytes=model_bytes,
    rec_heads=_int(raw, "linear_num_value_heads"),
    rec_dk=_int(raw, "linear_key_head_dim"),
    rec_dv=_int(raw, "linear_value_head_dim"),
    rec_groups=_int(raw, "linear_num_key_heads"),
    conv_kernel=_int(raw, "linear_conv_kernel_dim", 4),
    state_dtype_bytes=_dtype_bytes(raw, "mamba_ssm_dtype", 4),
    conv_dtype_bytes=model_bytes,
    d_ff=_int(raw, "intermediate_size") if n_mlp else 0,
    mlp_matrices=3,
    vllm_checkpoint_alignment=_GDN_CHECKPOINT_ALIGNMENT,
  )


def _nemotron_h(raw: Mapping[str, Any], name: str) -> CostModel:
  """Nemotron-H: one sublayer per layer (Mamba2, attention, a relu2 MLP of 2 matrices or a
  sparse MoE of relu2 experts)."""
  allowed = ("linear_attention", "full_attention", "mlp", "moe")
  field = "layers_block_type"
  if raw.get(field) is None and isinstance(raw.get("hybrid_override_pattern"), str):
    field = "hybrid_override_pattern"
    bad = sorted({c for c in raw[field] if c not in _NEMOTRON_PATTERN})
    if bad:
      raise ValueError(f"config field {field} has unknown letters {bad}")
    raw = {**raw, field: [_NEMOTRON_PATTERN[c] for c in raw[field]]}
  if raw.get(field) is None:
    raise ValueError(
      "config field layers_block_type (or hybrid_override_pattern) is required for model_type "
      "'nemotron_h'"
    )
  types = _layer_types(raw, field, allowed)
  n_moe = types.count("moe")
  if n_moe and raw.get("moe_latent_size") is not None:
    raise ValueError(
      f"config field moe_latent_size={raw['moe_latent_size']!r} is not supported (supported: "
      "[None])"
    )
  experts = "n_routed_experts"  # transformers' name; `num_local_experts` is its alias
  if raw.get(experts) is None and raw.get("num_local_experts") is not None:
    experts = "num_local_experts"
  model_bytes = _model_bytes(raw)
  return CostModel(
    name=name,
    d_model=_int(raw, "hidden_size"),
    n_attn=types.count("full_attention"),
    n_recurrent=types.count("linear_attention"),
    n_mlp=types.count("mlp"),
    **_moe(
      raw,
      n_moe,
      experts=experts,
      shared="moe_shared_expert_intermediate_size",
      gate=False,
      matrices=2,
    ),
    recurrent="mamba2",
    **_attention(raw, ("head_dim", "attention_head_dim")),
    kv_dtype_bytes=model_bytes,
    rec_heads=_int(raw, "mamba_num_heads"),
    rec_dk=_int(raw, "ssm_state_size"),
    rec_dv=_int(raw, "mamba_head_dim"),
    rec_groups=_int(raw, "n_groups", 1),
    conv_kernel=_int(raw, "conv_kernel", 4),
    state_dtype_bytes=_dtype_bytes(raw, "mamba_ssm_cache_dtype", 4),
    conv_dtype_bytes=model_bytes,
    d_ff=_int(raw, "intermediate_size") if "mlp" in types else 0,
    mlp_matrices=2,
  )


def _gemma3(raw: Mapping[str, Any], name: str) -> CostModel:
  """Gemma 3 text: sliding-window and full attention, a GeGLU MLP (3 matrices) everywhere."""
  if raw.get("layer_types") is None:
    field = "sliding_window_pattern"
    if raw.get(field) is None and raw.get("_" + field) is not None:
      field = "_" + field  # the name transformers 4.x stored it under
    types = _every_nth(raw, _int(raw, field, 6), "sliding_attention")
  else:
    types = _layer_types(raw, "layer_types", ("sliding_attention", "full_attention"))
  n_swa = types.count("sliding_attention")
  return CostModel(
    name=name,
    d_model=_int(raw, "hidden_size"),
    n_attn=types.count("full_attention"),
    n_swa=n_swa,
    swa_window=_int(raw, "sliding_window") if n_swa else 0,
    n_recurrent=0,
    n_mlp=len(types),
    recurrent="none",
    **_attention(raw, ("head_dim",)),
    kv_dtype_bytes=_model_bytes(raw),
    d_ff=_int(raw, "intermediate_size"),
    mlp_matrices=3,
  )


_BUILDERS = {
  "qwen3_5_text": _qwen,
  "qwen3_5_moe_text": _qwen,
  "qwen3_next": _qwen,
  "nemotron_h": _nemotron_h,
  "gemma3_text": _gemma3,
}
