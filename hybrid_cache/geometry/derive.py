"""vLLM 0.33's cache geometry, derived as vLLM derives it: `derive(config, target, flags)`.

vLLM does not run the cache a user types in. From the model's config, the GPU and the serving
flags it derives (file and function of vLLM 0.33 for each step; `tests/hybrid_cache/
vllm_geometry/` runs vLLM's own functions on real configs and checks every field here):

1. Defaults (`engine/arg_utils.py` `create_engine_config`): prefix caching on; the Mamba cache
   mode "align" with prefix caching on, "none" off (`model_executor/models/config.py`
   `MambaModelConfig`; the `mamba_cache_mode` flag is deprecated and has no effect); the SSM
   state dtype from the model's hook; scheduler budgets by usage context and GPU
   (`get_batch_defaults`: >= 160 GiB: 16,384 tokens / 1,024 sequences; >= 70 GiB and not an
   A100: 16,384 offline / 8,192 server, 1,024; else 8,192 / 2,048, 256), capped at
   max_num_seqs * max_model_len; the retention interval 0.
2. Backends: each attention layer's backend (`platforms/cuda.py` priorities, first valid:
   FLASH_ATTN on sm80/sm90, FLASHINFER on sm100; a multimodal prefix-LM (Gemma 3 with images)
   takes a Triton composite: TRITON_FLASH_ATTN on sm90 and TRITON_FLASHINFER, 64-token kernel
   blocks, on sm100 for head 256 / 512, else TRITON_ATTN or sm100's FlashAttention 4; FP8 KV
   needs FA3 / FA4) and its kernel block sizes (multiples of 16; FlashInfer 16 / 32 / 64, up to
   1,024 with GQA on sm100, where TRT-LLM's kernels take large pages). GDN prefill
   (`_resolve_gdn_prefill_backend`): FlashInfer on sm90, and on sm100 / sm120 with
   head_k_dim 128 and CUDA >= 13, unless `gdn_prefill_backend` asks for another; FlashInfer's
   prefill emits states mid-chunk on a 64-token grid (`FLASHINFER_GDN_CHECKPOINT_ALIGNMENT`),
   so in align mode its GDN layers declare that alignment and one prefill checkpoint block.
3. Block size (`platforms/interface.py` `update_block_size_for_backend`): the backends'
   preferred block (16 unless the user set one), then for hybrids `_align_hybrid_block_size`:
   a = lcm(max(smallest kernel block, block_size), checkpoint alignment in align mode),
   B = a * cdiv(state page, a * one token's KV page of one layer), rounded up to every backend's
   smallest kernel block; block_size = max(block_size, B); the Mamba block = block_size in align
   mode (max_model_len with prefix caching off); the state page is padded to B * page_1.
4. Specs and groups (`v1/core/kv_cache_planning.py` `get_kv_cache_groups`): one spec per layer
   (full attention: block_size; sliding window: the largest kernel block <= block_size; Mamba:
   its block, padded page, `num_speculative_blocks` = draft tokens); layers bucketed by equal
   spec in order of first appearance; group size G = the fewest layers of a bucket (the most,
   when < 1.5x the fewest); a bucket of n layers makes cdiv(n, G) groups, group i taking layers
   i::cdiv(n, G). MTP heads add full-attention layers after the decoder's.
5. Blocks (`get_kv_cache_configs`): bytes per block = the largest group's layers x page;
   num_blocks = KV memory // that (vLLM refuses memory below one max_model_len request).
6. Hashing (`v1/core/kv_cache_utils.py` `resolve_kv_cache_block_sizes`,
   `resolve_cache_hit_alignment_tokens`): scheduler block = lcm of the group blocks; hash
   block = `prefix_match_unit` or their gcd (each group block a multiple of it); partial hits
   (hits on the hash block) when an align Mamba block exceeds it and every other group can look
   up at that granularity (full attention and Mamba can, sliding window only at its own block).

Example (Qwen3.5-0.8B: a state of 1,085,440 B against 2,048 B of KV per token and layer)::

  g = derive("configs/hf/qwen3_5_0p8b", "sm80")
  g.block_size, g.gdn_prefill_backend        # (544, 'triton')
  derive("configs/hf/qwen3_5_0p8b", "sm90").block_size   # 576: FlashInfer's 64-token grid
  g.summary()  # 'vLLM 0.33 geometry (sm80): Qwen3_5ForConditionalGeneration, block 544 ...'

Bad input (an unsupported field or value) raises one ValueError naming it; a geometry vLLM
refuses raises ValueError with vLLM's own reason.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

from hybrid_cache import profiles
from hybrid_cache.geometry.flags import VllmFlags
from hybrid_cache.geometry.model_layers import ModelLayers
from hybrid_cache.geometry.model_layers import model_layers_from_config
from hybrid_cache.geometry.model_layers import read_model_layers
from hybrid_cache.geometry.targets import DEFAULT_TARGET
from hybrid_cache.geometry.targets import Target
from hybrid_cache.geometry.targets import get_target

_GIB = 1 << 30
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_KV_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
DEFAULT_BLOCK_SIZE = 16  # vllm/config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE
FLASHINFER_GDN_CHECKPOINT_ALIGNMENT = 64  # vllm/v1/attention/backends/gdn_attn.py
# max_concurrent_batches under async scheduling (vLLM's CUDA default, one pipeline stage)
_CONCURRENT_BATCHES = 2


def cdiv(a: int, b: int) -> int:
  return -(-a // b)


@dataclasses.dataclass(frozen=True)
class VllmGroup:
  """One KV cache group as vLLM forms it.

  Attributes:
    kind: "full", "swa" or "mamba".
    layers: decoder layer indices in the group (MTP layers numbered after the decoder's).
    block_size: tokens per block of the group.
    page_size_bytes: bytes of one layer's page (padded: equal across groups).
    sliding_window: the window of an "swa" group.
    num_speculative_blocks: extra state blocks per request for draft tokens ("mamba").
    num_prefill_checkpoint_blocks: 1 where the GDN prefill exports mid-chunk states.
  """

  kind: str
  layers: tuple[int, ...]
  block_size: int
  page_size_bytes: int
  sliding_window: int | None = None
  num_speculative_blocks: int = 0
  num_prefill_checkpoint_blocks: int = 0


@dataclasses.dataclass(frozen=True)
class VllmGeometry:
  """What vLLM 0.33 builds for one model, GPU and flag set (field names are vLLM's).

  Attributes:
    architecture, target: the model class and the GPU it was derived for.
    flags: the flags given (`VllmFlags`).
    enable_prefix_caching, mamba_cache_mode, mamba_ssm_cache_dtype,
    prefix_cache_retention_interval, max_num_batched_tokens, max_num_seqs, max_model_len:
      vLLM's resolved settings.
    model_dtype, kv_cache_dtype: the activation and KV dtypes.
    attention_backends: attention kind ("full" / "swa") -> vLLM backend name.
    gdn_prefill_backend: "triton" | "flashinfer" | "cutedsl" for GDN models, else None.
    prefill_checkpoint_alignment: 64 where FlashInfer's GDN prefill emits states, else None.
    block_size: the attention block (tokens); mamba_block_size: the recurrent block (None
      without recurrent layers).
    kv_bytes_per_token: one layer's attention KV per token (per tensor-parallel rank).
    mamba_state_shapes, mamba_state_dtypes, mamba_state_bytes: one recurrent layer's state
      (conv, SSM) per rank, unpadded; mamba_page_size_padded: its padded page (None if equal).
    groups: the KV cache groups.
    num_blocks: blocks for `flags.kv_cache_memory_bytes` (None without it: vLLM measures the
      KV memory on the GPU, after loading the weights and profiling a forward pass);
      bytes_per_block: the pool's block (every layer of the largest group).
    scheduler_block_size, hash_block_size, cache_hit_alignment_tokens: vLLM's alignment of
      scheduling, hashing and hits; partial_hits: hits on the hash block below the block.
  """

  architecture: str
  target: Target
  flags: VllmFlags
  enable_prefix_caching: bool
  mamba_cache_mode: str
  mamba_ssm_cache_dtype: str
  prefix_cache_retention_interval: int | None
  max_num_batched_tokens: int
  max_num_seqs: int
  max_model_len: int
  model_dtype: str
  kv_cache_dtype: str
  attention_backends: Mapping[str, str]
  gdn_prefill_backend: str | None
  prefill_checkpoint_alignment: int | None
  block_size: int
  mamba_block_size: int | None
  kv_bytes_per_token: int
  mamba_state_shapes: tuple[tuple[int, ...], ...] | None
  mamba_state_dtypes: tuple[str, ...] | None
  mamba_state_bytes: int | None
  mamba_page_size_padded: int | None
  groups: tuple[VllmGroup, ...]
  bytes_per_block: int
  num_blocks: int | None
  scheduler_block_size: int
  hash_block_size: int
  cache_hit_alignment_tokens: int

  @property
  def partial_hits(self) -> bool:
    """Hits at the hash block below the scheduler block (vLLM's partial hash hits)."""
    return self.cache_hit_alignment_tokens < self.scheduler_block_size

  @property
  def page_padding(self) -> float:
    """Share of a recurrent page that is padding (0 without recurrent layers)."""
    if not self.mamba_state_bytes:
      return 0.0
    page = self.mamba_page_size_padded or self.mamba_state_bytes
    return 1.0 - self.mamba_state_bytes / page

  def summary(self) -> str:
    """One line, as vLLM's start-up log would summarise the cache."""
    kinds = {}
    for g in self.groups:
      kinds[g.kind] = kinds.get(g.kind, 0) + 1
    parts = [
      f"vLLM 0.33 geometry ({self.target.name}): {self.architecture}",
      f"block {self.block_size}",
    ]
    if self.mamba_block_size is not None:
      parts.append(
        f"mamba block {self.mamba_block_size} ({self.mamba_cache_mode}, GDN prefill "
        f"{self.gdn_prefill_backend})"
        if self.gdn_prefill_backend
        else f"mamba block {self.mamba_block_size} ({self.mamba_cache_mode})"
      )
      parts.append(f"state {self.mamba_state_bytes:,} B padded {100 * self.page_padding:.1f}%")
    parts.append("groups " + " + ".join(f"{n} {k}" for k, n in kinds.items()))
    parts.append(f"hash block {self.hash_block_size}" + (" (partial hits)" * self.partial_hits))
    if self.num_blocks is not None:
      memory = self.flags.kv_cache_memory_bytes / _GIB
      parts.append(f"{self.num_blocks:,} blocks of {self.bytes_per_block:,} B ({memory:.2f} GiB)")
    parts.append(
      f"budget {self.max_num_batched_tokens} tokens / {self.max_num_seqs} seqs, "
      f"retention {self.prefix_cache_retention_interval}, "
      f"prefix caching {'on' if self.enable_prefix_caching else 'off'}"
    )
    return ", ".join(parts)

  def cache_config_kwargs(self) -> dict[str, Any]:
    """The cache core's `CacheConfig` fields that serve this geometry as vLLM 0.33 does:
    `profiles.VLLM_DEFAULT` with vLLM's blocks (`block_size` the attention block,
    `recurrent_block_size` the Mamba block in align mode), its retention interval, prefix
    caching, step budget and, with partial hits, its hash block. Groups and the pool size are
    the caller's (`engine.config.cache_config_for(model, vllm_geometry=...)`)."""
    kw = dict(profiles.VLLM_DEFAULT)
    align = self.mamba_block_size is not None and self.mamba_cache_mode == "align"
    kw.update(
      mode="align" if align or self.mamba_block_size is None else "none",
      block_size=self.block_size,
      recurrent_block_size=self.mamba_block_size if align else None,
      retention_interval=self.prefix_cache_retention_interval,
      enable_prefix_caching=self.enable_prefix_caching,
      max_num_batched_tokens=self.max_num_batched_tokens,
      hash_block_size=self.hash_block_size if self.partial_hits else None,
    )
    return kw

  def to_dict(self) -> dict[str, Any]:
    """JSON-ready fields (the target by name, flags as given)."""
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    out["target"] = self.target.name
    out["flags"] = self.flags.changed()
    out["groups"] = [dataclasses.asdict(g) for g in self.groups]
    out["attention_backends"] = dict(self.attention_backends)
    out["partial_hits"] = self.partial_hits
    out["summary"] = self.summary()
    return out


def derive(
  config: str | os.PathLike | Mapping[str, Any] | ModelLayers,
  target: str | Target = DEFAULT_TARGET,
  flags: VllmFlags | Mapping[str, Any] | None = None,
  **flag_values: Any,
) -> VllmGeometry:
  """vLLM 0.33's geometry (module docstring).

  Args:
    config: a `config.json` path (or its directory), its parsed dict, or `ModelLayers`.
    target: a `targets.TARGETS` name or a `Target`.
    flags: `VllmFlags` or a dict of vLLM flag names; `**flag_values` adds / overrides flags.
  """
  if isinstance(config, ModelLayers):
    model = config
  elif isinstance(config, Mapping):
    model = model_layers_from_config(config)
  else:
    model = read_model_layers(config)
  if flags is None or isinstance(flags, Mapping):
    flags = VllmFlags.from_mapping({**dict(flags or {}), **flag_values})
  elif flag_values:
    flags = dataclasses.replace(flags, **flag_values)
  return _derive(model, get_target(target), flags)


# ---- the steps (module docstring) ----


def _derive(model: ModelLayers, target: Target, flags: VllmFlags) -> VllmGeometry:
  tp = flags.tensor_parallel_size
  if model.num_heads % tp:
    raise ValueError(
      f"Total number of attention heads ({model.num_heads}) must be divisible by tensor "
      f"parallel size ({tp})."
    )
  max_model_len = _max_model_len(model, flags)
  num_spec = flags.num_speculative_tokens
  kinds = list(model.kinds)
  if flags.speculative_config is not None:
    # vLLM's MTP drafters: Qwen3.5 / Qwen3-Next always, Nemotron-H with MTP layers only
    if model.model_type.startswith("gemma3") or (
      model.model_type == "nemotron_h" and model.num_mtp_layers < 1
    ):
      raise ValueError("Unsupported speculative method: 'mtp'")
    kinds += [(model.num_layers + j, "full") for j in range(model.num_mtp_layers)]
  prefix_caching = True if flags.enable_prefix_caching is None else flags.enable_prefix_caching
  mode = "align" if model.is_hybrid and prefix_caching else "none"
  ssm_dtype = flags.mamba_ssm_cache_dtype
  if ssm_dtype == "auto" and model.recurrent_kind is not None:
    ssm_dtype = model.ssm_dtype_hook
  mnbt, seqs = _batch_defaults(target, flags, max_model_len)
  kv_dtype = model.dtype if flags.kv_cache_dtype == "auto" else flags.kv_cache_dtype
  kv_heads = max(1, model.num_kv_heads // tp)
  page_1 = 2 * kv_heads * model.head_dim * _KV_BYTES[kv_dtype]

  attention_kinds = sorted({k for _, k in kinds if k in ("full", "swa")})
  backend = _attention_backend(model, target, kv_dtype)
  backends = {k: backend for k in attention_kinds}
  sizes = _kernel_block_sizes(backend, model, target, tp)
  kernel_block = min(_base(s) for s in sizes)
  gdn = _gdn_prefill_backend(model, target, flags) if model.recurrent_kind == "gdn" else None
  alignment = (
    FLASHINFER_GDN_CHECKPOINT_ALIGNMENT if mode == "align" and gdn == "flashinfer" else None
  )

  user_block = flags.block_size is not None
  block_size = flags.block_size if user_block else _preferred_block_size(sizes)
  shapes = dtypes = state_bytes = padded = None
  mamba_block = None
  if model.recurrent_kind is not None:
    conv_dtype = model.dtype if flags.mamba_cache_dtype == "auto" else flags.mamba_cache_dtype
    shapes, dtypes = _state_shapes(model, tp, num_spec, conv_dtype, ssm_dtype)
    state_bytes = sum(math.prod(s) * _DTYPE_BYTES[d] for s, d in zip(shapes, dtypes))
    a = max(kernel_block, block_size)
    if mode == "align":
      a = math.lcm(a, alignment or 1)
    b = a * cdiv(state_bytes, a * page_1)
    b = kernel_block * cdiv(b, kernel_block)
    block_size = max(block_size, b)
    mamba_block = block_size if mode == "align" else (flags.mamba_block_size or max_model_len)
    page = block_size * page_1
    padded = page if page != state_bytes else None
  elif user_block and block_size % kernel_block:
    raise ValueError(
      f"Block size {block_size} is not supported by attention backend(s): {backend}."
    )

  specs = []  # (layer, kind, block_size, page bytes) per cache-holding layer
  for layer, kind in kinds:
    if kind == "full":
      specs.append((layer, "full", block_size, block_size * page_1))
    elif kind == "swa":
      swa_block = _largest_kernel_block_within(sizes, block_size)
      specs.append((layer, "swa", swa_block, swa_block * page_1))
    else:
      specs.append((layer, "mamba", mamba_block, padded or state_bytes))
  groups = _groups(specs, model, num_spec, gdn_exports=alignment is not None)
  bytes_per_block = max(len(g.layers) * g.page_size_bytes for g in groups)

  memory = flags.kv_cache_memory_bytes
  num_blocks = None
  if memory is not None:
    _check_enough_memory(memory, bytes_per_block, groups, mode, max_model_len, mnbt)
    num_blocks = memory // bytes_per_block
  sched, hashed, hit = _hash_blocks(groups, prefix_caching, flags, block_size)
  return VllmGeometry(
    architecture=model.architecture,
    target=target,
    flags=flags,
    enable_prefix_caching=prefix_caching,
    mamba_cache_mode=mode,
    mamba_ssm_cache_dtype=ssm_dtype,
    prefix_cache_retention_interval=flags.prefix_cache_retention_interval,
    max_num_batched_tokens=mnbt,
    max_num_seqs=seqs,
    max_model_len=max_model_len,
    model_dtype=model.dtype,
    kv_cache_dtype=kv_dtype,
    attention_backends=backends,
    gdn_prefill_backend=gdn,
    prefill_checkpoint_alignment=alignment,
    block_size=block_size,
    mamba_block_size=mamba_block,
    kv_bytes_per_token=page_1,
    mamba_state_shapes=shapes,
    mamba_state_dtypes=dtypes,
    mamba_state_bytes=state_bytes,
    mamba_page_size_padded=padded,
    groups=groups,
    bytes_per_block=bytes_per_block,
    num_blocks=num_blocks,
    scheduler_block_size=sched,
    hash_block_size=hashed,
    cache_hit_alignment_tokens=hit,
  )


def _max_model_len(model: ModelLayers, flags: VllmFlags) -> int:
  derived = model.max_position_embeddings
  if flags.max_model_len is None:
    return derived
  if flags.max_model_len > derived:
    raise ValueError(
      f"User-specified max_model_len ({flags.max_model_len}) is greater than the derived "
      f"max_model_len (max_position_embeddings={derived} in model's config.json)."
    )
  return flags.max_model_len


def _batch_defaults(target: Target, flags: VllmFlags, max_model_len: int) -> tuple[int, int]:
  """`EngineArgs.get_batch_defaults` + `_set_default_max_num_seqs_and_batched_tokens_args`."""
  server = flags.usage_context == "server"
  memory, name = target.total_memory, target.device_name.lower()
  if memory >= 160 * _GIB:
    tokens, seqs = 16384, 1024
  elif memory >= 70 * _GIB and "a100" not in name and target.capability != (12, 1):
    tokens, seqs = (8192 if server else 16384), 1024
  else:
    tokens, seqs = (2048 if server else 8192), 256
  seqs = flags.max_num_seqs or seqs
  if flags.max_num_batched_tokens is not None:
    return flags.max_num_batched_tokens, seqs
  return min(seqs * max_model_len, tokens), seqs


def _attention_backend(model: ModelLayers, target: Target, kv_dtype: str) -> str:
  """The attention backend of the model's decoder layers: the first valid one of the CUDA
  platform's priorities (`platforms/cuda.py` `_get_backend_priorities`, each backend's
  `validate_configuration`), for the head sizes, KV dtype and capability of these models."""
  major, head = target.capability[0], model.head_dim
  fa_version = {9: 3, 10: 4}.get(major, 2)  # vLLM's default FlashAttention per family
  fa_head = head % 8 == 0 and (head <= 256 or fa_version == 4)
  # FP8 KV: FA3 on sm90, FA4 on sm100 (`flash_attn_supports_kv_cache_dtype`), never e5m2
  fp8 = kv_dtype.startswith("fp8")
  fa_valid = fa_head and (not fp8 or (kv_dtype != "fp8_e5m2" and fa_version in (3, 4)))
  flashinfer_valid = head in (64, 128, 256, 512)
  if model.is_mm_prefix_lm:
    # bidirectional image spans: a Triton + FlashAttention 3 / FlashInfer composite for head
    # 256 / 512 (sm90 / sm100), FlashAttention 4's own mm-prefix path (sm100), else Triton;
    # FlashInfer alone has no partial multimodal full attention
    if head in (256, 512) and major in (9, 10):
      return "TRITON_FLASH_ATTN" if major == 9 else "TRITON_FLASHINFER"
    return "FLASH_ATTN" if major == 10 and fa_valid else "TRITON_ATTN"
  order = ("FLASHINFER", "FLASH_ATTN") if major == 10 else ("FLASH_ATTN", "FLASHINFER")
  valid = {"FLASH_ATTN": fa_valid, "FLASHINFER": flashinfer_valid}
  return next((b for b in order if valid[b]), "TRITON_ATTN")


def _kernel_block_sizes(backend: str, model: ModelLayers, target: Target, tp: int) -> list:
  """The backend's `get_supported_kernel_block_sizes`: ints, or ("multiple", n) for
  `MultipleOf(n)`."""
  if backend == "TRITON_FLASHINFER":
    return [64]
  if backend == "FLASHINFER":
    q, kv = model.num_heads // tp, max(1, model.num_kv_heads // tp)
    # TRT-LLM's paged kernels (GQA on Blackwell) also take large pages
    large = target.family == 100 and q // kv > 1 and q % kv == 0
    return [16, 32, 64, 128, 256, 512, 1024] if large else [16, 32, 64]
  return [("multiple", 16)]  # FLASH_ATTN, TRITON_ATTN, TRITON_FLASH_ATTN


def _base(size) -> int:
  return size[1] if isinstance(size, tuple) else size


def _preferred_block_size(sizes: list) -> int:
  """`AttentionBackend.get_preferred_block_size(16)`."""
  if any(DEFAULT_BLOCK_SIZE % _base(s) == 0 for s in sizes):
    return DEFAULT_BLOCK_SIZE
  return min(_base(s) for s in sizes)


def _largest_kernel_block_within(sizes: list, block_size: int) -> int:
  """A sliding-window layer's block (`attention._largest_kernel_block_within`, its page
  budget one primary block)."""
  candidates = [s for s in sizes if isinstance(s, int)]
  candidates += [max(s[1], block_size // s[1] * s[1]) for s in sizes if isinstance(s, tuple)]
  fitting = [b for b in candidates if b <= block_size]
  return max(fitting) if fitting else min(candidates)


def _gdn_prefill_backend(model: ModelLayers, target: Target, flags: VllmFlags) -> str:
  """`qwen_gdn_linear_attn._resolve_gdn_prefill_backend` on a CUDA target."""
  requested = flags.gdn_prefill_backend or "auto"
  head_k = model.recurrent["linear_key_head_dim"]
  family = target.family
  blackwell = family in (100, 120) and head_k == 128 and target.cuda_runtime_major >= 13
  supports_flashinfer = target.capability == (9, 0) or blackwell
  supports_cutedsl = blackwell and family == 100
  if requested in ("flashinfer", "auto") and supports_flashinfer:
    return "flashinfer"
  if requested == "cutedsl" and supports_cutedsl:
    return "cutedsl"
  return "triton"


def _divide(numerator: int, denominator: int) -> int:
  if numerator % denominator:
    raise ValueError(f"{numerator} is not divisible by {denominator}")
  return numerator // denominator


def _state_shapes(model: ModelLayers, tp: int, num_spec: int, conv_dtype: str, ssm_dtype: str):
  """One recurrent layer's (conv, SSM) state shapes per rank and dtypes (vLLM's
  `MambaStateShapeCalculator` / `MambaStateDtypeCalculator`)."""
  r = model.recurrent
  if model.recurrent_kind == "gdn":
    conv_dim = (
      r["linear_key_head_dim"] * r["linear_num_key_heads"] * 2
      + r["linear_value_head_dim"] * r["linear_num_value_heads"]
    )
    conv = (r["linear_conv_kernel_dim"] - 1 + num_spec, _divide(conv_dim, tp))
    ssm = (
      _divide(r["linear_num_value_heads"], tp),
      r["linear_value_head_dim"],
      r["linear_key_head_dim"],
    )
  else:
    groups = r["n_groups"] + (0 if r["n_groups"] % tp == 0 else tp - r["n_groups"])
    conv_dim = r["mamba_num_heads"] * r["mamba_head_dim"] + 2 * groups * r["ssm_state_size"]
    conv = (r["conv_kernel"] - 1 + num_spec, _divide(conv_dim, tp))
    ssm = (_divide(r["mamba_num_heads"], tp), r["mamba_head_dim"], r["ssm_state_size"])
  return (conv, ssm), (conv_dtype, conv_dtype if ssm_dtype == "auto" else ssm_dtype)


def _groups(
  specs, model: ModelLayers, num_spec: int, *, gdn_exports: bool
) -> tuple[VllmGroup, ...]:
  """`unify_kv_cache_spec_page_size` + `_get_kv_cache_groups_uniform_page_size` (module
  docstring, step 4)."""
  largest = max(page for *_, page in specs)
  buckets: dict[tuple, list[int]] = {}
  for layer, kind, block, page in specs:  # smaller pages: a larger block if it divides, else padded
    if page != largest and kind != "mamba" and largest % page == 0:
      block *= largest // page
    buckets.setdefault((kind, block, largest), []).append(layer)
  sizes = [len(v) for v in buckets.values()]  # one bucket (a uniform spec): one group
  fewest, most = min(sizes), max(sizes)
  size = most if most < 1.5 * fewest else fewest
  groups = []
  for (kind, block, page), layers in buckets.items():
    n = cdiv(len(layers), size)
    for i in range(n):
      groups.append(
        VllmGroup(
          kind=kind,
          layers=tuple(layers[i::n]),
          block_size=block,
          page_size_bytes=page,
          sliding_window=model.sliding_window if kind == "swa" else None,
          num_speculative_blocks=num_spec if kind == "mamba" else 0,
          num_prefill_checkpoint_blocks=int(kind == "mamba" and gdn_exports),
        )
      )
  return tuple(groups)


def _check_enough_memory(memory, bytes_per_block, groups, mode, max_model_len, mnbt) -> None:
  """`_check_enough_kv_cache_memory`: one max_model_len request must fit (null block apart)."""
  pages = 0
  for g in groups:
    if g.kind == "full":
      pages += cdiv(max_model_len, g.block_size)
    elif g.kind == "swa":
      tokens = min(g.sliding_window - 1 + _CONCURRENT_BATCHES * mnbt, max_model_len)
      pages += cdiv(tokens, g.block_size) + 1
    else:
      held = 2 + g.num_prefill_checkpoint_blocks if mode == "align" else 1
      pages += held + g.num_speculative_blocks
  needed = bytes_per_block * pages
  available = memory - bytes_per_block
  if needed > available:
    raise ValueError(
      f"To serve at least one request with the model's max seq len ({max_model_len}), "
      f"({needed / _GIB:.2f} GiB KV cache is needed, which is larger than the available KV "
      f"cache memory ({available / _GIB:.2f} GiB). Try increasing `gpu_memory_utilization` or "
      "decreasing `max_model_len` when initializing the engine."
    )


def _hash_blocks(groups, prefix_caching: bool, flags: VllmFlags, block_size: int):
  """(scheduler block, hash block, hit alignment): `resolve_kv_cache_block_sizes` and
  `resolve_cache_hit_alignment_tokens` (module docstring, step 6)."""
  unit = flags.prefix_match_unit
  if len(groups) <= 1:
    if unit not in (None, block_size) and groups and prefix_caching:
      raise ValueError(
        f"Invalid prefix_match_unit={unit}; with a single KV cache group, prefix-cache hits "
        f"land on the block size ({block_size}). Unset it or set it to {block_size}."
      )
    return block_size, block_size, block_size
  sizes = [g.block_size for g in groups]
  sched = math.lcm(*sizes)
  if not prefix_caching:  # (a hybrid's Mamba groups are in align mode exactly when it is on)
    return sched, sched, sched
  hashed = unit if unit is not None else math.gcd(*sizes)
  if any(s % hashed for s in sizes):
    raise ValueError(
      f"Invalid prefix_match_unit={hashed}; prefix-cacheable KV cache group block sizes must "
      f"be divisible by prefix_match_unit. Got group block sizes={sizes}, "
      f"prefix-cacheable={sizes}."
    )
  partial = any(g.kind == "mamba" and g.block_size > hashed for g in groups) and all(
    g.kind != "swa" or g.block_size == hashed for g in groups
  )
  return sched, hashed, hashed if partial else sched
