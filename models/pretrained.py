"""Load a Hugging Face checkpoint directory into a `HybridLM`.

A directory holds `config.json` and the weights as `*.safetensors`: one file, or shards listed
by `model.safetensors.index.json` (its "weight_map": tensor name -> file). The config becomes
our `ModelConfig` (`models.hf_config`), each parameter is read with the `safetensors` library,
laid out as ours (`models.hf_weights`) and cast to the parameter's dtype (`dtype`, with the
recurrent decay parameters A_log, dt_bias and D, and the sigmoid MoE router's weights and bias,
always fp32, as `HybridLM` keeps them). A parameter with two layouts (a MoE's experts: one tensor
per expert, or transformers 5's fused tensors) is read from whichever the checkpoint holds.

Every problem is one `ValueError` line naming what is wrong: an unsupported `model_type` or
config field, a missing tensor, an unexpected tensor (outside the skipped vision tower / MTP
head), a tensor whose shape does not fit the config, or a non-float tensor (a quantised
checkpoint).

Example::

  loaded = load_pretrained("/path/to/Qwen3.5-0.8B", dtype="bfloat16")
  loaded.model              # HybridLM with the checkpoint's weights
  loaded.config             # its ModelConfig (layer pattern, cache groups, ...)
  loaded.tokenizer          # tokenizers.Tokenizer from tokenizer.json, if the directory has one
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from models import hf_config
from models import hf_weights
from models.config import ModelConfig
from models.hybrid_lm import HybridLM
from models.hybrid_lm import build_model

INDEX = "model.safetensors.index.json"


@dataclasses.dataclass
class Pretrained:
  """A loaded checkpoint: the model with its weights, what its config mapped to, and its
  `tokenizers.Tokenizer` when the directory has a `tokenizer.json` (else None)."""

  model: HybridLM
  arch: hf_config.HFArchitecture
  tokenizer: Any = None

  @property
  def config(self) -> ModelConfig:
    return self.arch.config


def load_pretrained(model_dir: str | os.PathLike, *, dtype: str | None = None) -> Pretrained:
  """Reads `model_dir` (config.json + safetensors) into a `HybridLM` (see module docstring).

  Args:
    model_dir: a checkpoint directory as `save_pretrained` writes it.
    dtype: "float32" | "bfloat16"; None = the checkpoint's declared dtype (float32 when it is
      neither).
  """
  model_dir = os.fspath(model_dir)
  if not os.path.isdir(model_dir):
    raise ValueError(f"model_dir must be a directory, got {model_dir!r}")
  arch = hf_config.from_hf_config(hf_config.read_config(model_dir), dtype=dtype)
  tensors = _TensorFiles(model_dir)
  prefix = _decoder_prefix(arch, tensors.names)
  sources = hf_weights.weight_map(arch)
  abstract = nnx.eval_shape(lambda: build_model(arch.config))
  graphdef, state = nnx.split(abstract)
  shapes = _flatten(nnx.to_pure_dict(state))
  if set(shapes) != set(sources):  # a mapping bug, not a checkpoint problem
    raise AssertionError(f"weight map and model disagree: {sorted(set(shapes) ^ set(sources))}")
  values, used = {}, set()
  for path, want in shapes.items():
    src = _layout(sources[path], prefix, tensors.names)
    names = [_full_name(n, prefix) for n in src.names]
    used.update(names)
    values[path] = _convert([tensors.get(n) for n in names], src, names, path, want)
  extra = sorted(n for n in tensors.names - used if not n.startswith(arch.skipped))
  if extra:
    more = f" (+{len(extra) - 1} more)" if len(extra) > 1 else ""
    raise ValueError(
      f"checkpoint has an unexpected tensor {extra[0]!r}{more} for model_type "
      f"{arch.model_type!r}: not used by this config (tensors must match config.json)"
    )
  nnx.replace_by_pure_dict(state, _unflatten(values))
  return Pretrained(nnx.merge(graphdef, state), arch, load_tokenizer(model_dir))


def load_tokenizer(model_dir: str | os.PathLike):
  """The `tokenizers.Tokenizer` of `model_dir/tokenizer.json`, or None when there is none."""
  path = os.path.join(os.fspath(model_dir), "tokenizer.json")
  if not os.path.isfile(path):
    return None
  from tokenizers import Tokenizer

  try:
    return Tokenizer.from_file(path)
  except Exception as e:  # the library raises its own exception types
    raise ValueError(f"tokenizer.json at {path} could not be read: {e}") from None


class _TensorFiles:
  """The tensors of a directory's safetensors files, read on demand (one open file each)."""

  def __init__(self, model_dir: str):
    from safetensors import safe_open

    index_path = os.path.join(model_dir, INDEX)
    if os.path.isfile(index_path):
      with open(index_path) as f:
        weight_map = json.load(f).get("weight_map")
      if not isinstance(weight_map, Mapping):
        raise ValueError(f"{INDEX} in {model_dir} must have a 'weight_map' object")
      self._file_of = {name: os.path.join(model_dir, file) for name, file in weight_map.items()}
    else:
      files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
      if not files:
        raise ValueError(f"model_dir {model_dir!r} holds no *.safetensors file")
      self._file_of = {}
      for file in files:
        path = os.path.join(model_dir, file)
        with safe_open(path, framework="flax") as f:
          for name in f.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
            if name in self._file_of:
              raise ValueError(f"tensor {name!r} is in two files: {self._file_of[name]}, {path}")
            self._file_of[name] = path
    missing = sorted({p for p in self._file_of.values() if not os.path.isfile(p)})
    if missing:
      raise ValueError(f"{INDEX} names a missing shard file {missing[0]!r}")
    self._open = {}
    self._safe_open = safe_open
    self.names = set(self._file_of)

  def get(self, name: str) -> jax.Array:
    if name not in self._file_of:
      raise ValueError(f"checkpoint is missing tensor {name!r} (needed by config.json)")
    path = self._file_of[name]
    if path not in self._open:
      self._open[path] = self._safe_open(path, framework="flax")
    return self._open[path].get_tensor(name)


def _decoder_prefix(arch: hf_config.HFArchitecture, names: set[str]) -> str:
  for prefix in arch.prefixes:
    if any(n.startswith(prefix) for n in names):
      return prefix
  raise ValueError(
    f"checkpoint has no tensor under {' or '.join(map(repr, arch.prefixes))} "
    f"(the {arch.model_type} decoder)"
  )


def _full_name(name: str, prefix: str) -> str:
  return name if name == hf_weights.LM_HEAD else prefix + name


def _layout(src: hf_weights.Source, prefix: str, names: set[str]) -> hf_weights.Source:
  """`src`, or its alternative layout when the checkpoint lacks one of `src`'s tensors and
  holds all of the alternative's (else `src`, whose first missing tensor is then the error)."""
  alt = src.alternative
  if alt is None or all(_full_name(n, prefix) in names for n in src.names):
    return src
  return alt if all(_full_name(n, prefix) in names for n in alt.names) else src


def _convert(
  tensors: list[jax.Array], src: hf_weights.Source, names: list[str], path: str, want: Any
) -> jax.Array:
  """`src.transform` of the tensors (one, or the list of a multi-tensor source), checked."""
  for name, tensor in zip(names, tensors, strict=True):
    if not jnp.issubdtype(tensor.dtype, jnp.floating):
      raise ValueError(
        f"tensor {name!r} has dtype {tensor.dtype}; only float tensors are supported "
        "(float32, bfloat16, float16; no quantised checkpoints)"
      )
  try:
    value = src.transform(list(tensors) if isinstance(src.name, tuple) else tensors[0])
  except (ValueError, TypeError):
    value = None
  if value is None or tuple(value.shape) != tuple(want.shape):
    # name the odd one out of stacked tensors, else the first
    odd = next((j for j, t in enumerate(tensors) if t.shape != tensors[0].shape), 0)
    raise ValueError(
      f"tensor {names[odd]!r} has shape {tuple(tensors[odd].shape)}, which does not fit our "
      f"{path} of shape {tuple(want.shape)} for this config.json"
    )
  return value.astype(want.dtype)


def _flatten(tree: Mapping, prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, value in tree.items():
    path = f"{prefix}{key}"
    if isinstance(value, Mapping):
      out.update(_flatten(value, path + "."))
    else:
      out[path] = value
  return out


def _unflatten(flat: Mapping[str, Any]) -> dict:
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    *parents, leaf = path.split(".")
    for p in parents:
      node = node.setdefault(int(p) if p.isdigit() else p, {})
    node[int(leaf) if leaf.isdigit() else leaf] = value
  return tree
