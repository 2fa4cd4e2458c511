"""Static cache configuration: groups, pool size, budgets and policy switches.

`CacheConfig` is frozen and hashable so that it can be a static argument of jitted
functions. Every field is validated at construction; a bad value raises `ValueError`
naming the field, the value and the allowed range. Nothing here imports JAX.

Example (the scenario format's three-group config)::

  cfg = CacheConfig(
      groups=(GroupSpec("full"), GroupSpec("swa", window=8), GroupSpec("mamba")),
      block_size=4, num_blocks=64)
  cfg.scheduler_block_size  # 4 = lcm of the group block sizes
  cfg.hash_block_size       # 4 = gcd of the group block sizes

The groups are `group_spec.GroupSpec`s (re-exported here with `ResolvedGroup`: the core, the
engine and the scenarios import them from this module); the field checks are `config_checks.py`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any

from hybrid_cache.config_checks import _check_int
from hybrid_cache.config_checks import _json_bool
from hybrid_cache.group_spec import GroupSpec
from hybrid_cache.group_spec import ResolvedGroup
from hybrid_cache.policies import ADMISSION_POLICIES
from hybrid_cache.policies import EVICTION_POLICIES
from hybrid_cache.policies import PLACEMENT_POLICIES
from hybrid_cache.policies import RETENTION_POLICIES
from hybrid_cache.policies import RETIREMENT_POLICIES

EVICTION_COST_FIELDS = ("eviction_flops_linear", "eviction_flops_quadratic", "eviction_block_bytes")
PROFILES = ("vllm", "pinned")
# Where freed blocks go (vLLM §1.6): "scratch_first" = vLLM 0.33 (#42656/#43447: blocks without a
# hash at the free-queue head, reused first); "all_tail" = before June 2026, every freed block
# appended at the tail in the order freed (the order vLLM #40676's pinning was measured under).
FREE_ORDERS = ("scratch_first", "all_tail")
# `byte_budget` and every sum of block costs stay below this (int32 arithmetic in the core)
_BUDGET_MAX = 2**30


@dataclasses.dataclass(frozen=True)
class CacheConfig:
  """Frozen, hashable configuration of the cache core.

  The defaults are not vLLM 0.33's serving configuration: `retention_interval` defaults to None
  (dense) where vLLM serves 0, and the sizes are ours. `hybrid_cache.profiles.VLLM_DEFAULT`
  lists vLLM's values (profile `vllm_default`).

  Attributes:
    groups: the KV-cache groups, in model order.
    num_blocks: physical blocks in the shared pool, including the null block 0 (with
      `state_slots`, the KV page pool only).
    state_slots: 0 = one shared pool (vLLM); > 0 = a second pool of this many recurrent-state
      slots, ids [num_blocks, num_blocks + state_slots), from which the mamba groups draw
      every block (running state, kept states, copy-on-write copies) while the attention groups
      draw from the page pool [1, num_blocks): a state is then not padded to a KV page. One
      byte budget splits into the two with `hybrid_cache.pools.split_byte_budget`, or both
      draw on it (`byte_budget`). Each pool keeps vLLM's free-queue order among its own
      blocks; the watermark counts pages only.
    byte_budget: None = each pool is limited by its ids only; an int (with `state_slots`) =
      the pages and slots share this budget (beyond vLLM, `hybrid_cache.core.byte_budget`): a
      block occupies `page_bytes` or `slot_bytes` while it is held or cached, admission needs
      the budget to cover the held blocks and the new ones, and an allocation that leaves the
      cached blocks over budget drops the keys of the first cached free blocks in free-queue
      order (both pools) until they fit. Size the ids to the budget
      (`pools.shared_byte_budget`) so that they never bind first. Any common unit (the
      simulator uses bytes / 2^k so that the budget fits int32).
    page_bytes, slot_bytes: what one page / one state slot occupies of `byte_budget`.
    block_size: default tokens per block for groups that do not set their own.
    hash_block_size: hashing granularity; None = gcd of the group block sizes.
    fine_keys: beyond vLLM (issue 15: checkpoint positions decoupled from KV blocks): every
      full-attention block larger than the hash block is keyed at each hash-block boundary
      inside it when it is cached full (extra index entries beside its full key, dropped with
      it), so full attention hits at hash-block granularity anywhere in a prefix, not only at
      the prompt tail (vLLM §2.5). Turns partial hits on (`partial_hits`). With a recurrent
      group of block size `hash_block_size` = U, recurrent states sit at multiples of U for
      any attention block size B (align: the prompt end, the junction, the block-aligned chunk
      ends; all: every U; kept by the retention mask and the placement policy), and a hit is
      the longest prefix with the attention KV and a state at exactly its end. Beside vLLM's
      cuts, an align chunk is then cut at the junction floored to the recurrent block
      (`junction_block_size`), and the replay boundaries (prompt end, junction) keep both their
      hash-block state and the scheduler-block one vLLM keeps (`cache_keys.cache_blocks`).
      Needs a full-attention group with a block larger than the hash block and every
      sliding-window group's block equal to it.
    retention_interval: None = dense, 0 = replay boundaries and junctions only,
      k * scheduler_block_size = one SWA tail / recurrent state per k*B tokens. Full-attention
      groups ignore it (they cache densely); k > 0 needs a swa or mamba group.
    max_num_batched_tokens: token budget per scheduler step.
    max_model_len: longest sequence (prompt + generated) a request may reach.
    full_sequence_must_fit: admission reserves blocks for the whole prompt.
    watermark_blocks: blocks kept free when admitting waiting requests.
    enable_prefix_caching: False = never look up or register hashes.
    marconi_junction: record the shared-prefix boundary and cut chunks there (vLLM 0.33).
    num_speculative_tokens: S (EAGLE/MTP); S > 0 with `use_eagle` enables the EAGLE rules.
    use_eagle: EAGLE lookups (drop one unit); all groups are EAGLE groups if none is flagged.
    pinning: the pinned tier of SPEC B1 (off in the `vllm` profile).
    pin_min_drop_size: an SWA window drop smaller than this many blocks pins nothing.
    free_order: where freed blocks enter the free queue (`FREE_ORDERS`): "scratch_first"
      (vLLM 0.33) or "all_tail" (vLLM before #43447, the pre-fix order).
    eviction: a registered eviction policy (`hybrid_cache.policies`): "lru" (vLLM's free
      queue order), "flop_aware" (SPEC B2: Marconi's utility, `core/policies/flop_aware.py`;
      alpha lives in the state, `core.policies.flop_aware.set_alpha`) or another registered name.
    placement: a registered placement policy (`policies.PLACEMENT_POLICIES`): which state
      blocks of a recurrent group a request keeps; "vllm" = vLLM's retention mask (§2.4.7).
    admission: a registered admission policy (`policies.ADMISSION_POLICIES`): whether a kept
      recurrent state is registered, from the policy's statistics across requests; "all" =
      vLLM (every kept state). Another policy needs prefix caching, a recurrent group and no
      partial hits (`partial_hits`).
    retention: a registered retention policy (`policies.RETENTION_POLICIES`): with `pinning`,
      which blocks a finishing request pins; "prefix" = SPEC B1. Another policy needs
      `pinning` and a mamba group.
    retirement: a registered retirement policy (`policies.RETIREMENT_POLICIES`): which
      recurrent states a finished request's deeper checkpoints supersede are dropped from the
      cache; "none" = vLLM (nothing). Another policy needs prefix caching and a mamba group in
      mode align or all.
    eviction_flops_linear: per group (one entry per group, or () = 1.0 each), FLOPs per token
      of the layers the group stands for (linear part: projections, MLP share, recurrence).
    eviction_flops_quadratic: per group (or () = 0.0 each), the attention context term q:
      a full group's prefix of L tokens costs linear*L + q*L^2, a swa group's
      linear*L + q*L*min(L, window); must be 0 for mamba groups.
    eviction_block_bytes: per group (or () = 1.0 each), bytes one block of the group costs
      the pool (> 0; in a pool of equal pages this is the page size for every group).
      Only policies that read costs (`policies.reads_costs`: flop_aware) use the three cost
      fields (`hybrid_cache.core.eviction_costs`).
    max_requests: request slots in the jitted state (static).
  """

  groups: tuple[GroupSpec, ...]
  num_blocks: int
  state_slots: int = 0
  byte_budget: int | None = None
  page_bytes: int = 1
  slot_bytes: int = 1
  block_size: int = 16
  hash_block_size: int | None = None
  fine_keys: bool = False
  retention_interval: int | None = None
  max_num_batched_tokens: int = 8192
  max_model_len: int = 8192
  full_sequence_must_fit: bool = True
  watermark_blocks: int = 0
  enable_prefix_caching: bool = True
  marconi_junction: bool = True
  num_speculative_tokens: int = 0
  use_eagle: bool = False
  pinning: bool = False
  pin_min_drop_size: int = 1
  free_order: str = "scratch_first"
  eviction: str = "lru"
  placement: str = "vllm"
  admission: str = "all"
  retention: str = "prefix"
  retirement: str = "none"
  max_requests: int = 64
  eviction_flops_linear: tuple[float, ...] = ()
  eviction_flops_quadratic: tuple[float, ...] = ()
  eviction_block_bytes: tuple[float, ...] = ()

  def __post_init__(self):
    if not isinstance(self.groups, tuple):
      object.__setattr__(self, "groups", tuple(self.groups))
    if not 1 <= len(self.groups) <= 16:
      raise ValueError(f"groups must have 1..16 entries, got {len(self.groups)}")
    for g in self.groups:
      if not isinstance(g, GroupSpec):
        raise ValueError(f"groups[] entries must be GroupSpec, got {g!r}")
    _check_int("num_blocks", self.num_blocks, minimum=2)
    _check_int("state_slots", self.state_slots, minimum=0)
    if self.state_slots and not any(g.kind == "mamba" for g in self.groups):
      raise ValueError(f"state_slots={self.state_slots} needs a mamba group (0 = one pool)")
    _check_int("page_bytes", self.page_bytes, minimum=1)
    _check_int("slot_bytes", self.slot_bytes, minimum=1)
    if self.byte_budget is not None:
      _check_int("byte_budget", self.byte_budget, minimum=1)
      if not self.state_slots:
        raise ValueError(f"byte_budget={self.byte_budget} needs state_slots > 0 (two pools)")
      if self.byte_budget > _BUDGET_MAX:
        raise ValueError(
          f"byte_budget must be <= {_BUDGET_MAX} (int32 sums), got {self.byte_budget}"
        )
      worst = max(self.page_bytes * (self.num_blocks - 1), self.slot_bytes * self.state_slots)
      if worst > _BUDGET_MAX:
        raise ValueError(
          f"page_bytes * (num_blocks - 1) and slot_bytes * state_slots must be <= {_BUDGET_MAX}"
          f" (int32 sums), got {worst}"
        )
    _check_int("block_size", self.block_size, minimum=1)
    _check_int("max_num_batched_tokens", self.max_num_batched_tokens, minimum=1)
    _check_int("max_model_len", self.max_model_len, minimum=1)
    _check_int("watermark_blocks", self.watermark_blocks, minimum=0)
    _check_int("num_speculative_tokens", self.num_speculative_tokens, minimum=0)
    _check_int("pin_min_drop_size", self.pin_min_drop_size, minimum=1)
    _check_int("max_requests", self.max_requests, minimum=1)
    if self.free_order not in FREE_ORDERS:
      raise ValueError(f"free_order must be one of {FREE_ORDERS}, got {self.free_order!r}")
    for seam, names in (
      ("eviction", EVICTION_POLICIES),
      ("placement", PLACEMENT_POLICIES),
      ("admission", ADMISSION_POLICIES),
      ("retention", RETENTION_POLICIES),
      ("retirement", RETIREMENT_POLICIES),
    ):
      if getattr(self, seam) not in names:
        raise ValueError(f"{seam} must be one of {names}, got {getattr(self, seam)!r}")
    self._check_eviction_costs()
    sizes = [g.block_size or self.block_size for g in self.groups]
    hbs = self.hash_block_size
    if hbs is None:
      hbs = math.gcd(*sizes)
    else:
      _check_int("hash_block_size", hbs, minimum=1)
    for i, b in enumerate(sizes):
      if b % hbs:
        raise ValueError(
          f"groups[{i}].block_size must be a multiple of hash_block_size={hbs}, got {b}"
        )
    _json_bool("fine_keys", self.fine_keys)
    if self.fine_keys:
      if not any(g.kind == "full" and b > hbs for g, b in zip(self.groups, sizes)):
        raise ValueError(
          f"fine_keys needs a full-attention group with a block larger than hash_block_size={hbs}"
        )
      for i, (g, b) in enumerate(zip(self.groups, sizes)):
        if g.kind == "swa" and b != hbs:
          raise ValueError(
            f"groups[{i}].block_size must equal hash_block_size={hbs} with fine_keys, got {b}"
          )
    sbs = math.lcm(*sizes)
    # A recurrent align group may have a block wider than the token budget (vLLM advances such
    # chunks sub-block and re-aligns at the next boundary: `rules.block_aligned_split`), and a
    # window group may sit beside partial hits (`partial_hits` decides, as vLLM does).
    r = self.retention_interval
    if r is not None:
      _check_int("retention_interval", r, minimum=0)
      if r % sbs:
        raise ValueError(
          f"retention_interval must be a multiple of scheduler_block_size={sbs}, got {r}"
        )
      if r and not any(g.kind in ("swa", "mamba") for g in self.groups):
        # vLLM 0.33 accepts 0 here (its serving default) and refuses any other interval
        raise ValueError(
          f"retention_interval must be None or 0 without a swa or mamba group (it applies only"
          f" to them), got {r}"
        )
    if self.retention != "prefix" and not (
      self.pinning and any(g.kind == "mamba" for g in self.groups)
    ):
      raise ValueError(f"retention={self.retention!r} needs pinning=True and a mamba group")
    if self.retirement != "none" and not (
      self.enable_prefix_caching
      and any(g.kind == "mamba" and g.mode != "none" for g in self.groups)
    ):
      raise ValueError(
        f"retirement={self.retirement!r} needs prefix caching and a mamba group in mode align"
        " or all"
      )
    if self.admission != "all":
      if not any(g.kind == "mamba" and g.mode != "none" for g in self.groups):
        raise ValueError(f"admission={self.admission!r} needs a mamba group in mode align or all")
      if self.partial_hits:
        raise ValueError(
          f"admission={self.admission!r} needs partial hits off (hash_block_size equal to"
          " the recurrent block size)"
        )

  def _check_eviction_costs(self) -> None:
    """Validates the per-group FLOP-aware cost fields and stores them as float tuples."""
    n = len(self.groups)
    for name in EVICTION_COST_FIELDS:
      raw = getattr(self, name)
      if isinstance(raw, (str, bytes)) or not isinstance(raw, (tuple, list)):
        raise ValueError(
          f"{name} must be a list of {n} numbers (one per group) or empty, got {raw!r}"
        )
      if len(raw) not in (0, n):
        raise ValueError(
          f"{name} must have 0 or {n} entries (one per group), got {len(raw)}: {list(raw)!r}"
        )
      rng = "> 0" if name == "eviction_block_bytes" else ">= 0"
      vals = []
      for i, v in enumerate(raw):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
          raise ValueError(f"{name}[{i}] must be a finite number {rng}, got {v!r}")
        if not (v > 0 if name == "eviction_block_bytes" else v >= 0):
          raise ValueError(f"{name}[{i}] must be {rng}, got {v!r}")
        vals.append(float(v))
      object.__setattr__(self, name, tuple(vals))
    for i, (g, q) in enumerate(zip(self.groups, self.eviction_flops_quadratic)):
      if g.kind == "mamba" and q != 0:
        raise ValueError(
          f"eviction_flops_quadratic[{i}] must be 0 for the mamba group {i}, got {q!r}"
        )

  # ---- derived, static ----
  @property
  def resolved_groups(self) -> tuple[ResolvedGroup, ...]:
    any_eagle = any(g.eagle for g in self.groups)
    out = []
    for g in self.groups:
      eagle = self.use_eagle and (g.eagle or not any_eagle)
      out.append(ResolvedGroup(g.kind, g.block_size or self.block_size, g.window, g.mode, eagle))
    return tuple(out)

  @property
  def num_groups(self) -> int:
    return len(self.groups)

  @property
  def group_block_sizes(self) -> tuple[int, ...]:
    return tuple(g.block_size for g in self.resolved_groups)

  @property
  def scheduler_block_size(self) -> int:
    return math.lcm(*self.group_block_sizes)

  @property
  def resolved_hash_block_size(self) -> int:
    if self.hash_block_size is not None:
      return self.hash_block_size
    return math.gcd(*self.group_block_sizes)

  @property
  def partial_hits(self) -> bool:
    """vLLM's fine-grained (partial) hits (reference §2.5).

    On iff prefix caching is on, some recurrent group in `align` mode has a block larger than
    the hash block size, and every sliding-window group's block equals the hash block (vLLM
    `partial_hash_hits_enabled`: a window group with another block turns them off for the
    whole model, without an error); hits then align to the hash block instead of the
    scheduler block. `fine_keys` (beyond vLLM) turns them on too.
    """
    hbs = self.resolved_hash_block_size
    groups = self.resolved_groups
    vllm = any(g.kind == "mamba" and g.mode == "align" and g.block_size > hbs for g in groups)
    return (
      self.enable_prefix_caching
      and (vllm or self.fine_keys)
      and all(g.kind != "swa" or g.block_size == hbs for g in groups)
    )

  @property
  def junction_block_size(self) -> int:
    """The block an align-mode chunk cut at the Marconi junction is floored to (vLLM §4.3
    `_mamba_block_aligned_split`): the scheduler block, as vLLM; with `fine_keys` the smallest
    align recurrent block, so that the junction's state lands on a multiple of it inside a
    KV block (every other cut stays on the scheduler block)."""
    if self.fine_keys:
      sizes = [
        g.block_size for g in self.resolved_groups if g.kind == "mamba" and g.mode == "align"
      ]
      if sizes:
        return min(sizes)
    return self.scheduler_block_size

  @property
  def hit_alignment(self) -> int:
    """Every hit length is a multiple of this: the hash block with partial hits, else sbs."""
    return self.resolved_hash_block_size if self.partial_hits else self.scheduler_block_size

  @property
  def usable_blocks(self) -> int:
    return self.num_blocks - 1

  @property
  def pool_size(self) -> int:
    """Block ids the core hands out lie in [1, pool_size): the pages, then the state slots."""
    return self.num_blocks + self.state_slots

  @property
  def num_speculative_blocks(self) -> int:
    return self.num_speculative_tokens if self.use_eagle else 0

  @property
  def max_blocks_per_request(self) -> int:
    """Block-table width per group: enough for max_model_len at the smallest block size."""
    return self.blocks_per_request(min(self.group_block_sizes))

  def blocks_per_request(self, block_size: int) -> int:
    """Table positions a request can fill in a group of `block_size`-token blocks: its
    max_model_len tokens, plus the speculative lookahead blocks."""
    return -(-self.max_model_len // block_size) + self.num_speculative_blocks

  @property
  def max_hash_blocks(self) -> int:
    return -(-self.max_model_len // self.resolved_hash_block_size)

  def replace(self, **changes) -> CacheConfig:
    return dataclasses.replace(self, **changes)

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> CacheConfig:
    """Builds a config from the scenario format's `config` object (unknown keys rejected).

    `watermark` is vLLM's: a fraction of the pool, `watermark_blocks = int(watermark *
    num_blocks)` (vLLM's `KVCacheManager`), applied to waiting requests while others run.
    Boolean keys must be JSON booleans.
    """
    if not isinstance(d, Mapping):
      raise ValueError(f"config must be an object, got {type(d).__name__}")
    d = dict(d)
    groups = d.pop("groups", None)
    if not groups or not isinstance(groups, list):
      raise ValueError(f"config.groups must be a non-empty list, got {groups!r}")
    specs = []
    for i, g in enumerate(groups):
      if not isinstance(g, Mapping):
        raise ValueError(f"config.groups[{i}] must be an object, got {g!r}")
      g = dict(g)
      kind = g.pop("type", g.pop("kind", None))
      specs.append(
        GroupSpec(
          kind=kind,
          block_size=g.pop("block_size", None),
          window=g.pop("window", None),
          mode=g.pop("mode", "align"),
          eagle=_json_bool(f"config.groups[{i}].eagle", g.pop("eagle", False)),
        )
      )
      if g:
        raise ValueError(f"config.groups[{i}] has unknown keys {sorted(g)}")
    if "watermark" in d:
      if "watermark_blocks" in d:
        raise ValueError("config sets both watermark (a fraction) and watermark_blocks")
      w = d.pop("watermark")
      if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w <= 1:
        raise ValueError(f"config.watermark must be a fraction of the pool in [0, 1], got {w!r}")
      _check_int("num_blocks", d.get("num_blocks"), minimum=2)
      d["watermark_blocks"] = int(w * d["num_blocks"])
    for f in dataclasses.fields(cls):
      if f.type in ("bool", bool) and f.name in d:
        d[f.name] = _json_bool(f"config.{f.name}", d[f.name])
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
      raise ValueError(f"config has unknown keys {unknown}; allowed: {sorted(names)}")
    d.setdefault("block_size", 16)
    if "max_model_len" not in d:
      d["max_model_len"] = max(8192, d.get("max_num_batched_tokens", 8192))
    return cls(groups=tuple(specs), **d)

  def to_dict(self) -> dict[str, Any]:
    """The config as the replay prints it (groups with resolved block sizes)."""
    return {
      "block_size": self.block_size,
      "num_blocks": self.num_blocks,
      **({"state_slots": self.state_slots} if self.state_slots else {}),
      **(
        {
          "byte_budget": self.byte_budget,
          "page_bytes": self.page_bytes,
          "slot_bytes": self.slot_bytes,
        }
        if self.byte_budget is not None
        else {}
      ),
      "groups": [
        {"type": g.kind, "block_size": g.block_size, "window": g.window}
        | ({"mode": g.mode} if g.kind == "mamba" else {})
        for g in self.resolved_groups
      ],
      **({"fine_keys": True} if self.fine_keys else {}),
      "retention_interval": self.retention_interval,
      "max_num_batched_tokens": self.max_num_batched_tokens,
      "full_sequence_must_fit": self.full_sequence_must_fit,
    }


__all__ = [
  "EVICTION_COST_FIELDS",
  "FREE_ORDERS",
  "PROFILES",
  "CacheConfig",
  "GroupSpec",
  "ResolvedGroup",
]
