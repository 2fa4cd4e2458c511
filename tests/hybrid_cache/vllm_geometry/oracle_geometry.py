#!/usr/bin/env python3
"""vLLM 0.33's own cache geometry for a model config, a GPU and serving flags (test oracle).

Runs under the vLLM oracle's interpreter (shared/vllm_oracle/setup_oracle.sh), never inside the
project: `python oracle_geometry.py TARGET_JSON < cases.jsonl > results.jsonl`, one JSON case per
line (`{"id", "config_dir", "flags", "usage_context", "available_memory"}`), one JSON result per
line. `record.py` drives it; the project's `hybrid_cache.geometry` must reproduce every field.

What runs is vLLM's own code, called as its engine and worker call it:
  * `EngineArgs(**flags).create_engine_config(usage_context)`: defaults (block size, prefix
    caching, mamba cache mode, SSM state dtype, retention, scheduler budgets), the model class's
    config hooks and the platform's `check_and_update_config`;
  * the attention backend each attention layer would get (`get_attn_backend`, the CUDA
    platform's priorities and validation for the target's compute capability), the GDN prefill
    backend (`_resolve_gdn_prefill_backend`);
  * `Platform.update_block_size_for_backend` (kernel block sizes, `_align_hybrid_block_size`:
    the Mamba page from the model class's `get_mamba_state_shape_from_config` /
    `..._dtype_from_config`, padding);
  * `get_global_kv_cache_groups` and `get_kv_cache_configs` (groups, pages, number of blocks for the
    memory given), `resolve_kv_cache_block_sizes` / `resolve_cache_hit_alignment_tokens`.

Two things are emulated, as the model's layers would do them, because building the layers
needs a GPU: the per-layer KV cache specs (`Attention.get_kv_cache_spec` /
`MambaBase.get_kv_cache_spec` with the GDN layer's FlashInfer checkpoint fields, built from
vLLM's own spec classes with the values the layers read), and the list of the layers' kinds
(the config's `layer_types` / `hybrid_override_pattern`, as the model classes read them).

The GPU is a `CudaPlatform` whose device queries answer for the target (compute capability,
name, memory; CUDA runtime 13), installed after vLLM's modules are imported under the CPU
platform (the CUDA modules need compiled kernels). Availability assumed: a standard CUDA build
(FlashAttention's FA2/FA3 kernels as the installed wheel reports them, FlashInfer importable).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import replace

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import vllm.platforms as platforms  # noqa: E402

_CPU = platforms.current_platform

import torch  # noqa: E402
import vllm.model_executor.layers.attention.attention as attention  # noqa: E402
import vllm.model_executor.layers.mamba.abstract as mamba_abstract  # noqa: E402
import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn as gdn_module  # noqa: E402
import vllm.model_executor.models.gemma3  # noqa: E402,F401
import vllm.model_executor.models.gemma3_mm  # noqa: E402,F401
import vllm.model_executor.models.nemotron_h  # noqa: E402,F401
import vllm.model_executor.models.qwen3_5  # noqa: E402,F401
import vllm.model_executor.models.qwen3_next  # noqa: E402,F401
import vllm.v1.attention.backends.flash_attn  # noqa: E402,F401
import vllm.v1.attention.backends.flashinfer  # noqa: E402,F401
import vllm.v1.attention.backends.triton_attn  # noqa: E402,F401
import vllm.v1.attention.selector as selector  # noqa: E402
import vllm.v1.core.kv_cache_planning as planning  # noqa: E402
import vllm.v1.core.kv_cache_utils as kv_utils  # noqa: E402
from vllm.config.compilation import PassConfig  # noqa: E402
from vllm.config.vllm import set_current_vllm_config  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.model_executor.models import ModelRegistry  # noqa: E402
from vllm.platforms.cuda import NonNvmlCudaPlatform  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402
from vllm.usage.usage_lib import UsageContext  # noqa: E402
from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype  # noqa: E402
from vllm.v1.attention.backends.gdn_attn import FLASHINFER_GDN_CHECKPOINT_ALIGNMENT  # noqa: E402
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum  # noqa: E402
from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts  # noqa: E402
from vllm.v1.attention.backends.utils import resolve_kv_cache_layout  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402
from vllm.v1.kv_cache_interface import MambaSpec  # noqa: E402
from vllm.v1.kv_cache_interface import SlidingWindowSpec  # noqa: E402

_USAGE = {"llm": UsageContext.LLM_CLASS, "server": UsageContext.OPENAI_API_SERVER}
_NEMOTRON = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def _install_target(target: dict) -> None:
  """Makes every vLLM module see a CUDA GPU with `target`'s capability, name and memory."""
  cap = DeviceCapability(*target["capability"])

  class TargetGPU(NonNvmlCudaPlatform):
    @classmethod
    def get_device_capability(cls, device_id: int = 0):
      return cap

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
      return target["device_name"]

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
      return target["total_memory"]

    @classmethod
    def get_cuda_runtime_major(cls) -> int:
      return target.get("cuda_runtime_major", 13)

    @classmethod
    def device_count(cls) -> int:
      return target.get("device_count", 8)

  # With tensor parallelism on sm90 / sm100 vLLM sizes compile ranges from FlashInfer's
  # all-reduce fusion table, whose module imports compiled kernels; compile ranges do not touch
  # the cache geometry, so the table is empty here
  PassConfig.default_fi_allreduce_fusion_max_size_mb = staticmethod(lambda: {})
  gpu = TargetGPU()
  platforms._current_platform = gpu
  for module in list(sys.modules.values()):
    if getattr(module, "current_platform", None) is _CPU:
      module.current_platform = gpu


def _layer_kinds(vc) -> list[str]:
  """Per decoder layer: "full", "swa", "gdn", "mamba2" or "none" (no cache), as the model
  classes read their configs; then the MTP drafter's layers (full attention each: Qwen3.5's and
  Qwen3-Next's MTP blocks are full-attention decoder layers, Nemotron-H's its attention
  pattern's), which share the target's KV cache."""
  kinds = _decoder_kinds(vc)
  spec = vc.speculative_config
  if spec is not None and spec.method == "mtp":
    kinds += ["full"] * spec.draft_model_config.get_num_layers(vc.parallel_config)
  return kinds


def _decoder_kinds(vc) -> list[str]:
  text = vc.model_config.hf_text_config
  model_type = getattr(text, "model_type", "")
  if model_type.startswith("nemotron_h"):
    pattern = getattr(text, "hybrid_override_pattern", None)
    if pattern is not None:
      kinds = [_NEMOTRON[c] for c in pattern]
    else:
      kinds = ["mamba" if t in ("mamba", "linear_attention") else t for t in text.layers_block_type]
    return [{"mamba": "mamba2", "attention": "full"}.get(k, "none") for k in kinds]
  types = list(text.layer_types)
  out = []
  for t in types:
    if t == "linear_attention":
      out.append("gdn")
    elif t == "sliding_attention":
      out.append("swa")
    elif t == "full_attention":
      out.append("full")
    else:
      raise ValueError(f"unknown layer type {t!r}")
  return out


def _attention_backend(vc, swa: bool):
  """The backend `Attention.__init__` picks for a (sliding-window) decoder layer."""
  selector._cached_get_attn_backend.cache_clear()
  mc = vc.model_config
  with set_current_vllm_config(vc):
    return selector.get_attn_backend(
      mc.get_head_size(),
      mc.dtype,
      vc.cache_config.cache_dtype,
      use_mla=False,
      has_sink=False,
      use_mm_prefix=mc.is_mm_prefix_lm,
      attn_type="decoder",
      has_sliding_window=swa,
    )


def _kv_cache_specs(vc, kinds, backends, model_cls, gdn_backend):
  """Per layer name, the spec its layer's `get_kv_cache_spec` returns (module docstring)."""
  cc, mc, pc = vc.cache_config, vc.model_config, vc.parallel_config
  text = mc.hf_text_config
  kv_dtype = kv_cache_dtype_str_to_dtype(cc.cache_dtype, mc)
  specs = {}
  mamba = None
  gdn_exports = gdn_backend == "flashinfer" and cc.mamba_cache_mode == "align"
  for i, kind in enumerate(kinds):
    name = f"layers.{i}.{kind}"
    if kind == "full":
      specs[name] = FullAttentionSpec(
        block_size=cc.block_size,
        num_kv_heads=mc.get_num_kv_heads(pc),
        head_size=mc.get_head_size(),
        dtype=kv_dtype,
      )
    elif kind == "swa":
      backend = backends["swa"]
      per_token = SlidingWindowSpec(
        block_size=1,
        num_kv_heads=mc.get_num_kv_heads(pc),
        head_size=mc.get_head_size(),
        dtype=kv_dtype,
        sliding_window=text.sliding_window,
      ).real_page_size_bytes
      block = attention._largest_kernel_block_within(
        backend, per_token, per_token * cc.block_size, cc.block_size
      )
      specs[name] = SlidingWindowSpec(
        block_size=block,
        num_kv_heads=mc.get_num_kv_heads(pc),
        head_size=mc.get_head_size(),
        dtype=kv_dtype,
        sliding_window=text.sliding_window,
      )
    elif kind in ("gdn", "mamba2"):
      if mamba is None:
        mamba = MambaSpec(
          shapes=tuple(model_cls.get_mamba_state_shape_from_config(vc)),
          dtypes=tuple(model_cls.get_mamba_state_dtype_from_config(vc)),
          block_size=cc.mamba_block_size,
          page_size_padded=cc.mamba_page_size_padded,
          mamba_type="gdn_attention" if kind == "gdn" else "mamba2",
          mamba_cache_mode=cc.mamba_cache_mode,
          num_speculative_blocks=vc.num_speculative_tokens,
        )
        if kind == "gdn" and gdn_exports:
          grid = mamba_abstract.get_mamba_prefill_checkpoint_grid(vc)
          mamba = replace(mamba, num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=grid)
      specs[name] = mamba
  return specs


def _spec_kind(spec) -> str:
  if isinstance(spec, MambaSpec):
    return "mamba"
  if isinstance(spec, SlidingWindowSpec):
    return "swa"
  return "full"


def geometry(case: dict) -> dict:
  """vLLM's geometry for one case (module docstring); raises what vLLM raises."""
  flags = dict(case.get("flags") or {})
  args = EngineArgs(
    model=case["config_dir"], skip_tokenizer_init=True, load_format="dummy", **flags
  )
  vc = args.create_engine_config(_USAGE[case.get("usage_context", "llm")])
  cc, mc = vc.cache_config, vc.model_config
  kinds = _layer_kinds(vc)
  out = {
    "enable_prefix_caching": cc.enable_prefix_caching,
    "mamba_cache_mode": cc.mamba_cache_mode,
    "mamba_ssm_cache_dtype": cc.mamba_ssm_cache_dtype,
    "prefix_cache_retention_interval": cc.prefix_cache_retention_interval,
    "max_num_batched_tokens": vc.scheduler_config.max_num_batched_tokens,
    "max_num_seqs": vc.scheduler_config.max_num_seqs,
    "max_model_len": mc.max_model_len,
    "model_dtype": str(mc.dtype).removeprefix("torch."),
    "is_hybrid": bool(mc.is_hybrid),
  }
  attention_kinds = sorted({k for k in kinds if k in ("full", "swa")})
  backends = {k: _attention_backend(vc, k == "swa") for k in attention_kinds}
  out["attention_backends"] = {k: b.get_name() for k, b in backends.items()}
  gdn_backend = None
  if "gdn" in kinds:
    gdn_backend = gdn_module._resolve_gdn_prefill_backend(vc)[1]
  out["gdn_prefill_backend"] = gdn_backend
  alignment = None
  if cc.mamba_cache_mode == "align" and gdn_backend == "flashinfer":
    alignment = FLASHINFER_GDN_CHECKPOINT_ALIGNMENT
  out["prefill_checkpoint_alignment"] = alignment
  ordered = []
  for k in kinds:  # distinct backends in layer order (`_find_non_ssm_backends`)
    b = backends.get(k)
    if b is not None and b not in ordered:
      ordered.append(b)
  platform_cls = type(platforms.current_platform)
  platform_cls._find_non_ssm_backends = classmethod(lambda cls, _vc: list(ordered))
  mamba_abstract.get_mamba_prefill_checkpoint_alignment = lambda _vc: alignment
  model_cls = None
  if any(k in ("gdn", "mamba2") for k in kinds):
    model_cls, _ = ModelRegistry.resolve_model_cls(mc.architecture, model_config=mc)
  with set_current_vllm_config(vc):
    platforms.current_platform.update_block_size_for_backend(vc)
  out["block_size"] = cc.block_size
  out["mamba_block_size"] = cc.mamba_block_size if model_cls is not None else None
  out["mamba_page_size_padded"] = cc.mamba_page_size_padded
  specs = _kv_cache_specs(vc, kinds, backends, model_cls, gdn_backend)
  layer_backends = list(ordered) + [
    selector.get_mamba_attn_backend(
      MambaAttentionBackendEnum.GDN_ATTN if k == "gdn" else MambaAttentionBackendEnum.MAMBA2
    )
    for k in sorted({k for k in kinds if k in ("gdn", "mamba2")})
  ]
  layouts = [layout.name for layout in get_supported_kv_cache_layouts(layer_backends)]
  out["kv_cache_layout"] = resolve_kv_cache_layout(vc, [layouts], list(specs.values())).name
  if model_cls is not None:
    m = next(s for s in specs.values() if isinstance(s, MambaSpec))
    out["mamba_state_shapes"] = [list(s) for s in m.shapes]
    out["mamba_state_dtypes"] = [str(d).removeprefix("torch.") for d in m.dtypes]
    out["mamba_state_bytes"] = m.real_page_size_bytes
  with set_current_vllm_config(vc):
    groups = planning.get_global_kv_cache_groups(vc, [dict(specs)])
  out["groups"] = [
    {
      "kind": _spec_kind(g.kv_cache_spec),
      "layers": [int(n.split(".")[1]) for n in g.layer_names],
      "block_size": g.kv_cache_spec.block_size,
      "page_size_bytes": g.kv_cache_spec.page_size_bytes,
      "sliding_window": getattr(g.kv_cache_spec, "sliding_window", None),
      "num_speculative_blocks": getattr(g.kv_cache_spec, "num_speculative_blocks", 0),
      "num_prefill_checkpoint_blocks": getattr(g.kv_cache_spec, "num_prefill_checkpoint_blocks", 0),
    }
    for g in groups
  ]
  memory = case.get("available_memory")
  if memory is not None:
    with set_current_vllm_config(vc):
      kv_config = planning.get_kv_cache_configs(vc, [dict(specs)], [memory], groups)[0]
    out["num_blocks"] = kv_config.num_blocks
    out["max_model_len_after_fit"] = vc.model_config.max_model_len
    sched, hashed = kv_utils.resolve_kv_cache_block_sizes(kv_config, vc)
    out["scheduler_block_size"] = sched
    out["hash_block_size"] = hashed
    out["cache_hit_alignment_tokens"] = kv_utils.resolve_cache_hit_alignment_tokens(
      kv_config, vc, sched, hashed
    )
  return out


def _reason(e: Exception) -> str:
  """vLLM's message for a rejected case (a pydantic validation error: its first message)."""
  errors = getattr(e, "errors", None)
  if callable(errors):
    try:
      return str(errors()[0]["msg"]).removeprefix("Value error, ").splitlines()[0]
    except Exception:
      pass
  return str(e).splitlines()[0] if str(e) else type(e).__name__


def main() -> int:
  target = json.loads(sys.argv[1])
  _install_target(target)
  torch.set_default_dtype(torch.bfloat16)
  for line in sys.stdin:
    if not line.strip():
      continue
    case = json.loads(line)
    try:
      result = {"id": case["id"], "vllm": geometry(case)}
    except Exception as e:  # vLLM's own rejection of the case: its reason is the answer
      result = {"id": case["id"], "error": _reason(e)}
      if os.environ.get("GEOMETRY_ORACLE_TRACE"):
        traceback.print_exc()
    print(json.dumps(result), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
