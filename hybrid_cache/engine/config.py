"""Cache configuration derived from a model: one group per layer kind, one shared block size.

The model's layer pattern fixes the groups (vLLM groups layers by spec): full-attention layers
form a "full" group, sliding-window layers an "swa" group with the model's window, GDN/Mamba2
layers one "mamba" group in the chosen recurrent mode (or, with the model's
`recurrent_grouping="per_kind"`, one "mamba" group per recurrent kind, all in that mode).
Groups follow `ModelConfig.cache_groups` (order of first appearance), so group g of the cache
core is group g of the model's `StepInputs`. All groups share `block_size` (the model's KV
pages and state pools are indexed by the same block ids).

Example::

  cache_config_for(qwen35_tiny(), block_size=16, num_blocks=128)
  # CacheConfig(groups=(GroupSpec("mamba", mode="align"), GroupSpec("full")), block_size=16, ...)
"""

from __future__ import annotations

from typing import Any

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from models.config import ModelConfig
from models.config import get_preset

KERNEL_CHUNK = 64  # checkpoint granularity of the GDN / SSD kernels ("all" mode)


def resolve_model_config(model: str | ModelConfig) -> ModelConfig:
  """A preset name or a `ModelConfig` -> `ModelConfig` (ValueError for anything else)."""
  if isinstance(model, ModelConfig):
    return model
  if isinstance(model, str):
    return get_preset(model)
  raise ValueError(f"model must be a preset name or a ModelConfig, got {type(model).__name__}")


def cache_config_for(
  model: str | ModelConfig,
  *,
  mode: str = "align",
  block_size: int = 16,
  num_blocks: int = 256,
  **policy: Any,
) -> CacheConfig:
  """The `CacheConfig` whose groups match `model`'s layer pattern.

  Args:
    model: a preset name or a `ModelConfig`.
    mode: recurrent mode of the mamba group ("none" | "align" | "all").
    block_size: tokens per block, shared by every group.
    num_blocks: blocks in the shared pool (block 0 is the null block).
    **policy: any other `CacheConfig` field (enable_prefix_caching, marconi_junction, pinning,
      max_num_batched_tokens, max_model_len, retention_interval, ...).
  """
  cfg = resolve_model_config(model)
  if "groups" in policy:
    raise ValueError("groups is derived from the model's layer_pattern; do not pass it")
  groups = []
  for kind in cfg.cache_groups:
    if kind == "swa":
      groups.append(GroupSpec("swa", window=cfg.window))
    elif kind == "mamba":
      groups.append(GroupSpec("mamba", mode=mode))
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


def check_compatible(model: ModelConfig, cache: CacheConfig) -> None:
  """Raises ValueError unless `cache`'s groups are the ones `model` needs (see module doc)."""
  kinds = tuple(g.kind for g in cache.resolved_groups)
  if kinds != model.cache_groups:
    raise ValueError(
      f"cache_config.groups must be {model.cache_groups} (from layer_pattern "
      f"{model.layer_pattern!r}), got {kinds}; use cache_config_for(model)"
    )
  sizes = set(cache.group_block_sizes)
  if len(sizes) != 1:
    raise ValueError(
      f"cache_config.groups[].block_size must be equal across groups (one page size), got "
      f"{cache.group_block_sizes}"
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
  if cache.partial_hits:
    raise ValueError(
      f"cache_config.hash_block_size must equal the block size for the engine, got "
      f"{cache.resolved_hash_block_size} < {cache.block_size}: that enables partial "
      "(fine-grained) hits (vLLM §2.5), whose copy-on-write of full-attention KV blocks the "
      "engine does not execute"
    )
  if effective_recurrent_mode(cache) == "all" and cache.block_size % KERNEL_CHUNK:
    raise ValueError(
      f"block_size must be a multiple of {KERNEL_CHUNK} (the kernels' checkpoint chunk) in "
      f"recurrent mode 'all', got {cache.block_size}"
    )
