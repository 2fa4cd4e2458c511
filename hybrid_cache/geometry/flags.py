"""vLLM 0.33's serving flags that shape a hybrid model's cache, under vLLM's own names and defaults.

Each field is the `EngineArgs` / `vllm serve` option of the same name (`vllm/engine/arg_utils.py`,
`vllm/config/cache.py`); None means "vLLM decides" (the value `derive` reports is vLLM's).

  block_size                 None: vLLM's kernel default (16), raised to fit a recurrent state
                             (`Platform._align_hybrid_block_size`); a value is a lower bound
                             that the alignment may still raise (vLLM overrides user settings)
  enable_prefix_caching      None: on for every model here (`is_prefix_caching_supported`)
  mamba_cache_mode           deprecated in vLLM 0.33 and without effect: Mamba prefix caching
                             follows enable_prefix_caching ("align" when on, "none" when off)
  mamba_block_size           only read with prefix caching off (default: max_model_len)
  mamba_ssm_cache_dtype      "auto": the model's hook (Qwen3.5 `mamba_ssm_dtype`, Nemotron-H
                             float32), else the conv dtype
  mamba_cache_dtype          "auto": the model dtype (the conv state, and the SSM state when
                             mamba_ssm_cache_dtype resolves to "auto")
  kv_cache_dtype             "auto" (the model dtype), "bfloat16", "float16", "fp8",
                             "fp8_e4m3", "fp8_e5m2"
  gdn_prefill_backend        None / "auto": FlashInfer where vLLM selects it (`targets`), else
                             Triton; "triton" / "flashinfer" / "cutedsl" as vLLM resolves them
  prefix_match_unit          vLLM's hash block for partial hits (must divide every group's
                             block); None: the GCD of the group blocks
  prefix_cache_retention_interval
                             0 (vLLM 0.33's default: recurrent and SWA blocks kept only at
                             replay boundaries and junctions), None = dense, k * block
  enable_mamba_shared_prefix_checkpoint
                             vLLM's shared-prefix checkpoint under partial hits (default off)
  max_num_batched_tokens, max_num_seqs
                             None: vLLM's defaults for the usage context and the target
                             (`EngineArgs.get_batch_defaults`)
  max_model_len              None: the config's max_position_embeddings
  gpu_memory_utilization     0.92 (vLLM's default; vLLM sizes the KV memory with it by profiling
                             on the GPU, which is not modelled: give kv_cache_memory_bytes)
  kv_cache_memory_bytes      vLLM's KV memory without profiling: the number of blocks
  tensor_parallel_size       1; heads of attention and of the recurrent layers are divided
  speculative_config         None or {"method": "mtp", "num_speculative_tokens": k} (the
                             model's MTP head; EAGLE drafters need their own model: refused)
  usage_context              "llm" (the offline `LLM` class) or "server" (`vllm serve`)

Example::

  VllmFlags(block_size=64, mamba_ssm_cache_dtype="bfloat16")
  VllmFlags.from_mapping({"tensor_parallel_size": 2})
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

MAMBA_DTYPES = ("auto", "float32", "float16", "bfloat16")
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
GDN_PREFILL_BACKENDS = ("auto", "triton", "flashinfer", "cutedsl")
MAMBA_CACHE_MODES = ("align", "none")
USAGE_CONTEXTS = ("llm", "server")
SPECULATIVE_METHODS = ("mtp",)


def _positive_int(name: str, value: Any, *, optional: bool = True) -> None:
  if value is None and optional:
    return
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"{name} must be an integer >= 1{' or None' * optional}, got {value!r}")


def _choice(name: str, value: Any, allowed: tuple, *, optional: bool = False) -> None:
  if value is None and optional:
    return
  if value not in allowed:
    raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class VllmFlags:
  """vLLM's serving flags (module docstring); validated on construction."""

  block_size: int | None = None
  enable_prefix_caching: bool | None = None
  mamba_cache_mode: str | None = None
  mamba_block_size: int | None = None
  mamba_ssm_cache_dtype: str = "auto"
  mamba_cache_dtype: str = "auto"
  kv_cache_dtype: str = "auto"
  gdn_prefill_backend: str | None = None
  prefix_match_unit: int | None = None
  prefix_cache_retention_interval: int | None = 0
  enable_mamba_shared_prefix_checkpoint: bool = False
  max_num_batched_tokens: int | None = None
  max_num_seqs: int | None = None
  max_model_len: int | None = None
  gpu_memory_utilization: float = 0.92
  kv_cache_memory_bytes: int | None = None
  tensor_parallel_size: int = 1
  speculative_config: Mapping[str, Any] | None = None
  usage_context: str = "llm"

  def __post_init__(self):
    for name in (
      "block_size",
      "mamba_block_size",
      "prefix_match_unit",
      "max_num_batched_tokens",
      "max_num_seqs",
      "max_model_len",
      "kv_cache_memory_bytes",
    ):
      _positive_int(name, getattr(self, name))
    _positive_int("tensor_parallel_size", self.tensor_parallel_size, optional=False)
    for name in ("enable_prefix_caching",):
      value = getattr(self, name)
      if value is not None and not isinstance(value, bool):
        raise ValueError(f"{name} must be true, false or None, got {value!r}")
    if not isinstance(self.enable_mamba_shared_prefix_checkpoint, bool):
      raise ValueError(
        "enable_mamba_shared_prefix_checkpoint must be true or false, got "
        f"{self.enable_mamba_shared_prefix_checkpoint!r}"
      )
    _choice("mamba_cache_mode", self.mamba_cache_mode, MAMBA_CACHE_MODES, optional=True)
    _choice("mamba_ssm_cache_dtype", self.mamba_ssm_cache_dtype, MAMBA_DTYPES)
    _choice("mamba_cache_dtype", self.mamba_cache_dtype, MAMBA_DTYPES)
    _choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
    _choice("gdn_prefill_backend", self.gdn_prefill_backend, GDN_PREFILL_BACKENDS, optional=True)
    _choice("usage_context", self.usage_context, USAGE_CONTEXTS)
    r = self.prefix_cache_retention_interval
    if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 0):
      raise ValueError(
        f"prefix_cache_retention_interval must be an integer >= 0 or None, got {r!r}"
      )
    u = self.gpu_memory_utilization
    if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 < u <= 1:
      raise ValueError(f"gpu_memory_utilization must be a number in (0, 1], got {u!r}")
    spec = self.speculative_config
    if spec is not None:
      if not isinstance(spec, Mapping):
        raise ValueError(f"speculative_config must be an object or None, got {spec!r}")
      unknown = sorted(set(spec) - {"method", "num_speculative_tokens"})
      if unknown:
        raise ValueError(
          f"speculative_config has unsupported fields {unknown} "
          "(supported: method, num_speculative_tokens)"
        )
      if spec.get("method") not in SPECULATIVE_METHODS:
        raise ValueError(
          f"speculative_config.method must be one of {list(SPECULATIVE_METHODS)} (an EAGLE "
          f"drafter is a model of its own, not derived here), got {spec.get('method')!r}"
        )
      _positive_int(
        "speculative_config.num_speculative_tokens",
        spec.get("num_speculative_tokens"),
        optional=False,
      )

  @property
  def num_speculative_tokens(self) -> int:
    """Draft tokens per step (0 without speculative decoding)."""
    return (
      0 if self.speculative_config is None else self.speculative_config["num_speculative_tokens"]
    )

  @classmethod
  def from_mapping(cls, values: Mapping[str, Any] | None) -> VllmFlags:
    """Flags from a dict of vLLM option names (ValueError naming an unknown one)."""
    values = dict(values or {})
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
      raise ValueError(f"unknown vLLM flag(s) {unknown} (supported: {sorted(names)})")
    return cls(**values)

  def changed(self) -> dict[str, Any]:
    """The fields that differ from vLLM's defaults, by name (`from_mapping` takes it back)."""
    out = {}
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if value != f.default:
        out[f.name] = dict(value) if isinstance(value, Mapping) else value
    return out
