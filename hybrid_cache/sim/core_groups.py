"""How a cost model's layers become the cache core's groups, pages and eviction costs.

Used by `core_sim.build_config` to replay the core's profiles in the simulator.

Model -> groups (`layout`). "model" (default): a "full" group if the model has full-attention
layers, a "swa" group (its window) if it has sliding-window layers, a "mamba" group if it has
recurrent layers. All groups share one pool of equal pages (vLLM's hybrid allocator): page bytes
= max over groups of the group's block bytes (full/swa: KV of `block_size` tokens over its
layers; mamba: one state of all recurrent layers), num_blocks = floor(capacity / page) + 1
(null block). "vllm": vLLM 0.33's own grouping (`kv_cache_planning.
_get_kv_cache_groups_uniform_page_size`): every group holds G layers, G = the fewest layers of
any kind (the most, if that is < 1.5 x the fewest), a kind of n layers makes cdiv(n, G) groups
(Qwen3.5-4B: 1 full + 3 mamba groups of 8 layers; Nemotron-H-8B and Marconi's 7B: 1 full + 6
mamba groups of 4), and one page = G layers x the per-layer page, max(B x one layer's KV per
token, one layer's state) (`CostModel.vllm_block_size` picks the B where the two meet; vLLM
raises a smaller B to it). So a KV block costs its exact bytes and a recurrent state costs
cdiv(n_rec, G) pages, its per-layer padding included. "pools": the "model" groups in two pools
(`CacheConfig.state_slots`, `hybrid_cache.pools`): pages of the attention groups (page = the
largest attention block) and state slots of one state of all recurrent layers, no state padded
to a KV page; both draw on the one byte budget (`CacheConfig.byte_budget`, admission and
eviction by bytes), or with `state_fraction` that share of it is a fixed pool of slots. The
bytes a group leaves unused in its page (or slot) are reported as `page_padding` per group.

`eviction_costs`: the core's FLOP-aware cost fields per group, from the same cost model.
"""

from __future__ import annotations

import dataclasses

from hybrid_cache import policies
from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.sim.cost_model import CostModel

LAYOUTS = ("model", "vllm", "pools")


def _layer_counts(model: CostModel) -> dict[str, int]:
  counts = {"full": model.n_attn, "swa": model.n_swa, "mamba": model.n_recurrent}
  return {k: v for k, v in counts.items() if v}


def vllm_group_size(model: CostModel) -> int:
  """Layers per group in vLLM's grouping (module docstring, "vllm" layout)."""
  counts = list(_layer_counts(model).values())
  if not counts:
    raise ValueError(f"model {model.name!r} has no attention, swa or recurrent layers")
  g, mx = min(counts), max(counts)
  return mx if mx < 1.5 * g else g


def model_groups(model: CostModel, mode: str, layout: str = "model") -> tuple[GroupSpec, ...]:
  """The core's groups for `model` (module docstring; `layout` one of `LAYOUTS`)."""
  if layout not in LAYOUTS:
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
  counts = _layer_counts(model)
  if not counts:
    raise ValueError(f"model {model.name!r} has no attention, swa or recurrent layers")
  size = vllm_group_size(model) if layout == "vllm" else None
  groups = []
  for kind, n in counts.items():
    if kind == "full":
      spec = GroupSpec("full")
    elif kind == "swa":
      spec = GroupSpec("swa", window=model.swa_window)
    else:
      spec = GroupSpec("mamba", mode=mode)
    groups += [spec] * (1 if size is None else -(-n // size))
  return tuple(groups)


def group_block_bytes(
  model: CostModel, groups, block_size: int, layout: str = "model"
) -> list[int]:
  """Bytes one block of each group really uses (before page padding)."""
  if layout == "vllm":  # group i of a kind holds that kind's layers i::groups of the kind
    kinds = [g.kind for g in groups]
    counts = _layer_counts(model)
    per_layer = {
      "full": model.kv_bytes_per_token_per_layer * block_size,
      "swa": model.kv_bytes_per_token_per_layer * block_size,
      "mamba": model.state_bytes_per_layer,
    }
    out, seen = [], dict.fromkeys(counts, 0)
    for k in kinds:
      ng = kinds.count(k)
      out.append(len(range(seen[k], counts[k], ng)) * per_layer[k])
      seen[k] += 1
    return out
  out = []
  for g in groups:
    if g.kind == "full":
      out.append(model.kv_bytes_per_token * block_size)
    elif g.kind == "swa":
      out.append(model.swa_kv_bytes_per_token * block_size)
    else:
      out.append(model.state_bytes)
  return out


def page_bytes(model: CostModel, groups, block_size: int, layout: str = "model") -> int:
  """The shared pool's page (module docstring); "pools": the page of the attention groups."""
  if layout == "vllm":
    per_layer = model.kv_bytes_per_token_per_layer * block_size
    if model.n_recurrent:
      per_layer = max(per_layer, model.state_bytes_per_layer)
    return vllm_group_size(model) * per_layer
  gb = group_block_bytes(model, groups, block_size)
  if layout == "pools":
    return max(b for g, b in zip(groups, gb) if g.kind != "mamba")
  return max(gb)


def unit_bytes(model: CostModel, groups, block_size: int, layout: str = "model") -> list[int]:
  """Per group, the bytes one of its blocks takes from its pool: the page, or with "pools"
  the page for attention groups and one state slot (`model.state_bytes`) for mamba groups."""
  page = page_bytes(model, groups, block_size, layout)
  if layout != "pools":
    return [page] * len(groups)
  return [model.state_bytes if g.kind == "mamba" else page for g in groups]


def eviction_costs(model: CostModel, groups, block_size: int, layout: str = "model") -> dict:
  """The core's FLOP-aware cost fields for `model` (per group, `CacheConfig.eviction_*`).

  Each group's prefix cost is F(L) = linear * L + quadratic * L^2 from the sim cost model
  (taken at L = 1 and 2; swa windows are >= 2 tokens): full = attention layers (+ the MLP
  layers), swa = its layers (+ MLP if there is no full group), mamba = recurrent layers (+ MLP
  if there is no attention). Block bytes = the pool's page for every group (a block of any group
  frees one page; `hybrid_cache.core.alpha_tuning.cost_fields`' default convention). With
  several groups of a kind ("vllm" layout) each carries its share of the kind's layers, and the
  MLP layers ride on the first group of their kind.
  """
  kinds = [g.kind for g in groups]
  mlp_home = "full" if "full" in kinds else ("swa" if "swa" in kinds else "mamba")
  lin, quad = [], []
  for j, g in enumerate(groups):
    n_kind = kinds.count(g.kind)
    mlp_here = g.kind == mlp_home and kinds.index(g.kind) == j

    def f(L, g=g, n_kind=n_kind, mlp_here=mlp_here):
      if g.kind == "full":
        v = model.n_attn * model.attn_flops(L)
      elif g.kind == "swa":
        v = model.n_swa * model.swa_flops(L)
      else:
        v = model.n_recurrent * model.recurrent_flops(L)
      v = v if n_kind == 1 else v / n_kind
      ffn = model.n_mlp * model.mlp_flops(L) + model.n_moe * model.moe_flops(L)
      return float(v + (ffn if mlp_here else 0))

    q = (f(2) - 2 * f(1)) / 2
    lin.append(f(1) - q)
    quad.append(q)
  # every block occupies one page of the shared pool ("pools": a page or a state slot)
  byt = [float(b) for b in unit_bytes(model, groups, block_size, layout)]
  return {
    "eviction_flops_linear": tuple(lin),
    "eviction_flops_quadratic": tuple(quad),
    "eviction_block_bytes": tuple(byt),
  }


def _eviction_costs(model, groups, block_size, eviction, layout) -> dict:
  """`eviction_costs` when the policy reads the cost fields (`policies.reads_costs`: flop_aware,
  greedy_dual) and the core's CacheConfig has the fields."""
  names = {f.name for f in dataclasses.fields(CacheConfig)}
  if not policies.reads_costs(eviction) or "eviction_flops_linear" not in names:
    return {}
  return eviction_costs(model, groups, block_size, layout)


__all__ = [
  "LAYOUTS",
  "eviction_costs",
  "group_block_bytes",
  "model_groups",
  "page_bytes",
  "unit_bytes",
  "vllm_group_size",
]
