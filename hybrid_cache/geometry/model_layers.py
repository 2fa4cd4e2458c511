"""A Hugging Face `config.json` -> what vLLM 0.33's cache sees of the model (`ModelLayers`).

vLLM builds one KV-cache spec per layer from fields its model classes read; this module reads
the same fields, per `model_type` (the text config of a multimodal wrapper):

  qwen3_5, qwen3_5_text,        `layer_types` ("linear_attention" -> GDN, "full_attention"),
  qwen3_5_moe, qwen3_5_moe_text else every `full_attention_interval`-th layer (4) is full. GDN:
  qwen3_next                    `linear_num_key_heads`, `linear_num_value_heads`,
                                `linear_key_head_dim`, `linear_value_head_dim`,
                                `linear_conv_kernel_dim`. SSM state dtype: Qwen3.5's hook
                                (`Qwen3_5ForConditionalGenerationConfig`) takes
                                `mamba_ssm_dtype`; Qwen3-Next has no hook. MTP layers:
                                `mtp_num_hidden_layers` (Qwen3.5), `num_nextn_predict_layers`
                                (Qwen3-Next).
  nemotron_h                    `hybrid_override_pattern` (M Mamba2, * attention, - MLP, E MoE)
                                or `layers_block_type`; Mamba2: `mamba_num_heads`,
                                `mamba_head_dim`, `n_groups`, `ssm_state_size`, `conv_kernel`;
                                SSM dtype `mamba_ssm_cache_dtype`, default float32
                                (`NemotronHForCausalLMConfig`); MTP: `num_nextn_predict_layers`.
  gemma3, gemma3_text           `layer_types` ("sliding_attention" with `sliding_window`,
                                "full_attention"), else every `sliding_window_pattern`-th (6) is
                                full; no recurrent layers. `gemma3` (multimodal) attends to
                                images bidirectionally: vLLM's `is_mm_prefix_lm`.

Attention everywhere: `num_attention_heads`, `num_key_value_heads`, `head_dim` (Nemotron-H also
`attention_head_dim`; else hidden_size // heads). The model dtype: the config's `dtype` /
`torch_dtype` (float32 checkpoints are served in bfloat16, vLLM's "auto"); max_model_len: its
`max_position_embeddings`. MLP and MoE layers hold no cache. Anything else: one ValueError
naming the field or the `model_type` and what is supported.

Example::

  m = read_model_layers("configs/hf/qwen3_5_0p8b")
  m.kinds[:4]              # ('gdn', 'gdn', 'gdn', 'full')
  m.recurrent_kind         # 'gdn'
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

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
_TEXT_TYPE = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text", "gemma3": "gemma3_text"}
_QWEN = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")
_NEMOTRON = {"M": "mamba2", "*": "full", "-": None, "E": None}
_NEMOTRON_TYPES = {
  "mamba": "mamba2",
  "linear_attention": "mamba2",
  "attention": "full",
  "full_attention": "full",
  "mlp": None,
  "moe": None,
}
_DTYPES = ("bfloat16", "float16", "float32")
LAYER_KINDS = ("full", "swa", "gdn", "mamba2")


@dataclasses.dataclass(frozen=True)
class ModelLayers:
  """The cache-relevant facts of one model (module docstring for where each comes from).

  Attributes:
    model_type: the config's `model_type` (the wrapper's, for multimodal checkpoints).
    architecture: `architectures[0]`.
    dtype: the served model dtype ("bfloat16" | "float16").
    kinds: per decoder layer that holds cache: index -> kind; MLP / MoE layers are absent.
    num_layers: decoder layers (with the cacheless ones).
    num_heads, num_kv_heads, head_dim: attention shapes (full and sliding layers alike).
    sliding_window: tokens of the sliding-window layers (None without them).
    recurrent: the recurrent layers' shape fields (GDN or Mamba2 names), empty without them.
    ssm_dtype_hook: the SSM state dtype the model's vLLM config hook sets ("auto": none).
    max_position_embeddings: the longest context the config declares.
    num_mtp_layers: layers of the model's multi-token-prediction head (0: none).
    is_mm_prefix_lm: images attended bidirectionally (vLLM's `ModelConfig.is_mm_prefix_lm`).
  """

  model_type: str
  architecture: str
  dtype: str
  kinds: tuple[tuple[int, str], ...]
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  sliding_window: int | None
  recurrent: Mapping[str, int]
  ssm_dtype_hook: str
  max_position_embeddings: int
  num_mtp_layers: int
  is_mm_prefix_lm: bool

  @property
  def recurrent_kind(self) -> str | None:
    """ "gdn", "mamba2" or None (no recurrent layer)."""
    kinds = {k for _, k in self.kinds if k in ("gdn", "mamba2")}
    return next(iter(kinds)) if kinds else None

  @property
  def is_hybrid(self) -> bool:
    """Attention and recurrent layers (vLLM's `ModelConfig.is_hybrid`)."""
    return self.recurrent_kind is not None


def read_model_layers(path: str | os.PathLike) -> ModelLayers:
  """The `ModelLayers` of the `config.json` at `path` (the file or its directory).

  ValueError (one line naming the file) when it is missing, not JSON or unsupported.
  """
  given = os.fspath(path)
  file = os.path.join(given, "config.json") if os.path.isdir(given) else given
  if not os.path.isfile(file):
    raise ValueError(f"model config {file!r} does not exist")
  try:
    with open(file, encoding="utf-8") as f:
      raw = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"model config {file!r} is not readable JSON ({type(e).__name__})") from None
  if not isinstance(raw, dict):
    raise ValueError(f"model config {file!r} must hold a JSON object")
  try:
    return model_layers_from_config(raw)
  except ValueError as e:
    raise ValueError(f"model config {file!r}: {e}") from None


def model_layers_from_config(raw: Mapping[str, Any]) -> ModelLayers:
  """The `ModelLayers` of a parsed `config.json` (module docstring)."""
  model_type = raw.get("model_type")
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise ValueError(f"model_type must be one of {list(SUPPORTED_MODEL_TYPES)}, got {model_type!r}")
  text = dict(raw)
  if model_type in _TEXT_TYPE:
    if not isinstance(raw.get("text_config"), Mapping):
      raise ValueError(f"config field text_config must be an object in a {model_type!r} config")
    text = {**raw["text_config"], "model_type": _TEXT_TYPE[model_type]}
  architectures = raw.get("architectures") or [model_type]
  kinds, n_layers = _layer_kinds(text)
  recurrent: dict[str, int] = {}
  if any(k == "gdn" for _, k in kinds):
    recurrent = {
      f: _int(text, f)
      for f in (
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
      )
    }
    recurrent["linear_conv_kernel_dim"] = _int(text, "linear_conv_kernel_dim", 4)
  elif any(k == "mamba2" for _, k in kinds):
    recurrent = {f: _int(text, f) for f in ("mamba_num_heads", "mamba_head_dim", "ssm_state_size")}
    recurrent["n_groups"] = _int(text, "n_groups", 1)
    recurrent["conv_kernel"] = _int(text, "conv_kernel", 4)
  heads = _int(text, "num_attention_heads")
  head_dim_field = next(
    (f for f in ("head_dim", "attention_head_dim") if text.get(f) is not None), None
  )
  head_dim = (
    _int(text, "hidden_size") // heads if head_dim_field is None else _int(text, head_dim_field)
  )
  swa = any(k == "swa" for _, k in kinds)
  return ModelLayers(
    model_type=model_type,
    architecture=str(architectures[0]),
    dtype=_model_dtype(raw, text),
    kinds=tuple(kinds),
    num_layers=n_layers,
    num_heads=heads,
    num_kv_heads=_int(text, "num_key_value_heads", heads),
    head_dim=head_dim,
    sliding_window=_int(text, "sliding_window") if swa else None,
    recurrent=recurrent,
    ssm_dtype_hook=_ssm_dtype_hook(text),
    max_position_embeddings=_int(text, "max_position_embeddings"),
    num_mtp_layers=_mtp_layers(text),
    is_mm_prefix_lm=model_type == "gemma3",
  )


def _int(raw: Mapping[str, Any], field: str, default: int | None = None) -> int:
  value = raw.get(field)
  if value is None:
    if default is None:
      raise ValueError(f"config field {field} is required for model_type {raw['model_type']!r}")
    return default
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"config field {field} must be an integer >= 1, got {value!r}")
  return value


def _model_dtype(raw: Mapping[str, Any], text: Mapping[str, Any]) -> str:
  for source in (text, raw):
    for field in ("dtype", "torch_dtype"):
      value = source.get(field)
      if value is None:
        continue
      if value not in _DTYPES:
        raise ValueError(f"config field {field}={value!r} is not supported (supported: {_DTYPES})")
      return "bfloat16" if value == "float32" else value
  return "bfloat16"


def _layer_kinds(text: Mapping[str, Any]) -> tuple[list[tuple[int, str]], int]:
  """(index, kind) of the layers that hold cache, and the number of decoder layers."""
  model_type = text["model_type"]
  if model_type == "nemotron_h":
    if isinstance(text.get("hybrid_override_pattern"), str):
      field, names, mapping = (
        "hybrid_override_pattern",
        list(text["hybrid_override_pattern"]),
        _NEMOTRON,
      )
    elif isinstance(text.get("layers_block_type"), (list, tuple)):
      field, names, mapping = "layers_block_type", list(text["layers_block_type"]), _NEMOTRON_TYPES
    else:
      raise ValueError(
        "config field hybrid_override_pattern (or layers_block_type) is required for model_type "
        "'nemotron_h'"
      )
  else:
    swa = model_type == "gemma3_text"
    other = "sliding_attention" if swa else "linear_attention"
    field = "layer_types"
    if text.get("layer_types") is None:
      every_field = "sliding_window_pattern" if swa else "full_attention_interval"
      if swa and text.get(every_field) is None and text.get("_" + every_field) is not None:
        every_field = "_" + every_field  # the name transformers 4.x stored it under
      every = _int(text, every_field, 6 if swa else 4)
      names = [
        "full_attention" if (i + 1) % every == 0 else other
        for i in range(_int(text, "num_hidden_layers"))
      ]
    else:
      names = list(text["layer_types"])
    mapping = {"full_attention": "full", other: "swa" if swa else "gdn"}
  if not names:
    raise ValueError(f"config field {field} must be a non-empty list of layer types")
  kinds = []
  for i, name in enumerate(names):
    if name not in mapping:
      raise ValueError(
        f"config field {field}[{i}]={name!r} is not supported (supported: {sorted(mapping)})"
      )
    if mapping[name] is not None:
      kinds.append((i, mapping[name]))
  n = text.get("num_hidden_layers")
  if n is not None and n != len(names):
    raise ValueError(f"config field {field} has {len(names)} layers, num_hidden_layers is {n}")
  return kinds, len(names)


def _ssm_dtype_hook(text: Mapping[str, Any]) -> str:
  if text["model_type"] in ("qwen3_5_text", "qwen3_5_moe_text"):
    value = text.get("mamba_ssm_dtype") or "auto"
  elif text["model_type"] == "nemotron_h":
    value = text.get("mamba_ssm_cache_dtype") or "float32"
  else:
    return "auto"
  if value not in ("auto", *_DTYPES):
    raise ValueError(
      f"config field mamba_ssm_dtype={value!r} is not supported (supported: {_DTYPES})"
    )
  return value


def _mtp_layers(text: Mapping[str, Any]) -> int:
  field = "mtp_num_hidden_layers" if text["model_type"] in _QWEN[:2] else "num_nextn_predict_layers"
  value = text.get(field) or 0
  if isinstance(value, bool) or not isinstance(value, int) or value < 0:
    raise ValueError(f"config field {field} must be an integer >= 0, got {value!r}")
  return value
