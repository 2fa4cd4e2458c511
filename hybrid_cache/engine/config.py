"""Cache configuration derived from a model: one group per layer kind, and what the engine accepts.

The model's layer pattern fixes the groups (vLLM groups layers by spec): full-attention layers
form a "full" group, sliding-window layers an "swa" group with the model's window, GDN/Mamba2
layers one "mamba" group in the chosen recurrent mode (or, with the model's
`recurrent_grouping="per_kind"`, one "mamba" group per recurrent kind, all in that mode).
Groups follow `ModelConfig.cache_groups` (order of first appearance), so group g of the cache
core is group g of the model's `StepInputs`.

Block sizes: every group draws ids from one pool (the model's KV pages and state pools are
indexed by the same block ids). The model has one KV page size, so the attention groups (full,
swa) share one block size (`kv_block_size`); the recurrent groups, whose pools hold one state
per block whatever its token span, may use another (`recurrent_block_size`, vLLM's larger
mamba block): hits then align to the LCM of the sizes (`CacheConfig.scheduler_block_size`), or
to the hash block with partial hits (vLLM §2.5), whose copy-on-write copies the engine runs.

Example::

  cache_config_for(qwen35_tiny(), block_size=16, num_blocks=128)
  # CacheConfig(groups=(GroupSpec("mamba", mode="align"), GroupSpec("full")), block_size=16, ...)
  cache_config_for(qwen35_tiny(), block_size=32, recurrent_block_size=16)  # LCM 32
"""

from __future__ import annotations

from typing import Any

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.geometry import VllmGeometry
from models.config import ModelConfig
from models.config import get_preset
from models.hybrid_lm import HybridLM

KERNEL_CHUNK = 64  # checkpoint granularity of the GDN / SSD kernels ("all" mode)
# The numerics contract (SPEC D) -> the model dtype that carries it:
#   "exact":   fp32 parameters and activations, every dot IEEE fp32 (XLA precision "highest",
#              Pallas dots `Precision.HIGHEST`: no TF32): cached == uncached within fp32 1e-5
#              relative, Pallas == XLA, on CPU and GPU alike.
#   "serving": bf16 parameters and activations, the backends' fast dots: a statistical bound
#              (greedy agreement and mean KL(uncached || cached) over many prompts that hit the
#              cache, cached recurrent states close to recomputed ones:
#              tests/hybrid_cache/engine/serving_numerics_test.py states the bounds).
NUMERICS = {"exact": "float32", "serving": "bfloat16"}
IMPLEMENTATIONS = ("xla", "pallas", "interpret")  # kernel implementations (None = by backend)


def check_implementation(implementation: str | None) -> str | None:
  """Returns `implementation` if it is one of `IMPLEMENTATIONS` or None, else ValueError.

  "xla": the jnp reference kernels; "pallas": the Pallas GPU kernels; "interpret": the same
  Pallas kernels run by the Pallas interpreter (any backend, slow; how CI covers the GPU
  path); None: "pallas" on a GPU backend, else "xla" (`kernels.pallas.common`).
  """
  if implementation is not None and implementation not in IMPLEMENTATIONS:
    raise ValueError(
      f"implementation must be one of {IMPLEMENTATIONS} or None, got {implementation!r}"
    )
  return implementation


def check_numerics(numerics: str | None) -> str | None:
  """Returns `numerics` if it is a key of `NUMERICS` or None, else ValueError."""
  if numerics is not None and numerics not in NUMERICS:
    raise ValueError(f"numerics must be one of {tuple(NUMERICS)} or None, got {numerics!r}")
  return numerics


def numerics_of(cfg: ModelConfig) -> str:
  """The numerics contract a model's dtype carries ("exact" for fp32, "serving" for bf16)."""
  return {dtype: name for name, dtype in NUMERICS.items()}[cfg.dtype]


def resolve_model_config(model: str | ModelConfig | HybridLM) -> ModelConfig:
  """A preset name, a `ModelConfig` or a built `HybridLM` (e.g. a loaded checkpoint,
  `models.pretrained`) -> its `ModelConfig` (ValueError for anything else)."""
  if isinstance(model, ModelConfig):
    return model
  if isinstance(model, HybridLM):
    return model.cfg
  if isinstance(model, str):
    return get_preset(model)
  raise ValueError(
    f"model must be a preset name, a ModelConfig or a HybridLM, got {type(model).__name__}"
  )


def cache_config_for(
  model: str | ModelConfig | HybridLM,
  *,
  vllm_geometry: VllmGeometry | None = None,
  **kwargs: Any,
) -> CacheConfig:
  """The `CacheConfig` whose groups match `model`'s layer pattern.

  Args:
    model: a preset name, a `ModelConfig` or a `HybridLM`.
    vllm_geometry: vLLM 0.33's geometry for the model (`hybrid_cache.geometry.derive`):
      its `cache_config_kwargs` (vLLM's blocks, retention, junction, budget) are the defaults,
      which `kwargs` override one by one, as vLLM's flags do; a `block_size` given here also
      sets the recurrent block unless `recurrent_block_size` is given too. None: the fields'
      own defaults below.
    **kwargs: `mode` (recurrent mode of the mamba group: "none" | "align" | "all", default
      "align"), `block_size` (tokens per block of the attention groups, the KV page, and of
      every group unless `recurrent_block_size` is given; default 16), `num_blocks` (blocks in
      the shared pool, block 0 the null block; default 256), `recurrent_block_size` (tokens per
      block of the mamba groups; None = `block_size`), and any other `CacheConfig` field
      (enable_prefix_caching, marconi_junction, pinning, max_num_batched_tokens, max_model_len,
      retention_interval, ...). With `fine_keys` and no `hash_block_size`, the hash block is the
      recurrent block (the checkpoint unit U of profile `adaptive`, `hybrid_cache.profiles`).
  """
  defaults: dict[str, Any] = {"mode": "align", "block_size": 16, "num_blocks": 256}
  if vllm_geometry is not None:
    defaults.update(vllm_geometry.cache_config_kwargs())
    if "block_size" in kwargs:  # the user's block: recurrent and hash blocks follow it
      defaults.pop("recurrent_block_size", None)
      defaults.pop("hash_block_size", None)
  policy = {**defaults, **kwargs}
  mode = policy.pop("mode")
  block_size = policy.pop("block_size")
  num_blocks = policy.pop("num_blocks")
  recurrent_block_size = policy.pop("recurrent_block_size", None)
  cfg = resolve_model_config(model)
  if "groups" in policy:
    raise ValueError("groups is derived from the model's layer_pattern; do not pass it")
  if policy.get("fine_keys") and policy.get("hash_block_size") is None:
    policy["hash_block_size"] = recurrent_block_size
  groups = []
  for kind in cfg.cache_groups:
    if kind == "swa":
      groups.append(GroupSpec("swa", window=cfg.window))
    elif kind == "mamba":
      groups.append(GroupSpec("mamba", block_size=recurrent_block_size, mode=mode))
    else:
      groups.append(GroupSpec("full"))
  return CacheConfig(groups=tuple(groups), block_size=block_size, num_blocks=num_blocks, **policy)


def effective_recurrent_mode(cache: CacheConfig) -> str | None:
  """The mode the core really uses for the mamba group (None without one).

  Prefix caching off, or any recurrent group in mode "none", turns every recurrent group into
  mode "none" (one state block per request), as in vLLM.
  """
  modes = [g.mode for g in cache.resolved_groups if g.kind == "mamba"]
  if not modes:
    return None
  if not cache.enable_prefix_caching or "none" in modes:
    return "none"
  return modes[0]


def kv_block_size(cache: CacheConfig) -> int:
  """Tokens per KV page: the attention groups' block size (`cache.block_size` without one)."""
  sizes = [g.block_size for g in cache.resolved_groups if g.kind != "mamba"]
  return sizes[0] if sizes else cache.block_size


def state_block_size(cache: CacheConfig) -> int:
  """Tokens per recurrent state block: the mamba groups' block size (KV page without one)."""
  sizes = [g.block_size for g in cache.resolved_groups if g.kind == "mamba"]
  return sizes[0] if sizes else kv_block_size(cache)


def check_compatible(model: ModelConfig, cache: CacheConfig) -> None:
  """Raises ValueError unless `cache`'s groups are the ones `model` needs (see module doc)."""
  kinds = tuple(g.kind for g in cache.resolved_groups)
  if kinds != model.cache_groups:
    raise ValueError(
      f"cache_config.groups must be {model.cache_groups} (from layer_pattern "
      f"{model.layer_pattern!r}), got {kinds}; use cache_config_for(model)"
    )
  for kind, what in (("attention", "one KV page size"), ("mamba", "one state block size")):
    rec = kind == "mamba"
    sizes = [g.block_size for g in cache.resolved_groups if (g.kind == "mamba") == rec]
    if len(set(sizes)) > 1:
      raise ValueError(
        f"cache_config.groups[].block_size must be equal across the {kind} groups ({what}), "
        f"got {cache.group_block_sizes}"
      )
  for i, g in enumerate(cache.resolved_groups):
    if g.kind == "swa" and g.window != model.window:
      raise ValueError(
        f"cache_config.groups[{i}].window must equal the model's window={model.window}, "
        f"got {g.window}"
      )
  modes = {g.mode for g in cache.resolved_groups if g.kind == "mamba"}
  if len(modes) > 1 and effective_recurrent_mode(cache) != "none":
    raise ValueError(
      f"cache_config.groups[].mode must be the same for every mamba group, got {sorted(modes)}"
    )
  if effective_recurrent_mode(cache) == "all" and state_block_size(cache) % KERNEL_CHUNK:
    raise ValueError(
      f"the mamba groups' block_size must be a multiple of {KERNEL_CHUNK} (the kernels' "
      f"checkpoint chunk) in recurrent mode 'all', got {state_block_size(cache)}"
    )
