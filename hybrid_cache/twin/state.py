"""The plain-Python twin's state: one `TwinState` of named fields, and its requests.

Jitted twins: `core/state.py` (`CacheState`), `core/layout.py` (`Layout`, the static part) and
`core/fresh_state.py` (`init_state`). Here the static sizes and per-group constants of a config
and the mutable pool, hash index and requests sit in one plain dataclass (readability over
speed); the rule modules beside this one (`block_pool`, `coordinator`, `admission`,
`byte_budget`, `allocate`, `cache_keys`, `release`, `step`, `scheduler`) are free functions
over it, each named after its jitted twin in `core/`.

Pool (reference §1.3, §1.6): block 0 is the null block (`NULL`); ids [1, num_blocks) are pages;
with `state_slots` the ids [num_blocks, pool_size) are state slots, from which the mamba groups
draw (`group_pool`). One free list holds both: each pool's free queue is that list restricted to
its ids. Hash index (§1.5): key (hash, group) -> block ids in insertion order; lookups use the
first.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hybrid_cache import policies
from hybrid_cache.config import CacheConfig
from hybrid_cache.config import ResolvedGroup
from hybrid_cache.hashing import RequestExtras
from hybrid_cache.twin import eviction

NULL = 0


@dataclasses.dataclass
class SpecGroup:
  """Groups with equal specs, looked up together (a hit needs the key in every member)."""

  kind: str
  block_size: int
  window: int | None
  mode: str
  eagle: bool
  members: list[int]


@dataclasses.dataclass
class Request:
  name: str
  tokens: list[int]
  num_prompt_tokens: int
  extras: RequestExtras
  fine_hashes: np.ndarray
  status: str = "waiting"
  num_computed: int = 0
  rows: list[list[int]] = dataclasses.field(default_factory=list)
  num_cached: list[int] | None = None  # None = not admitted (no allocation yet)
  last_state: dict[int, int] = dataclasses.field(default_factory=dict)
  state_col: dict[int, int] = dataclasses.field(default_factory=dict)
  boundary: int = 0
  # §2.5: group -> (row index, source block) of a pending copy-on-write (vLLM _partial_hit_reqs)
  partial: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)
  # group -> token end of the latest kept state (hit at admission, then each registered state;
  # the core's `group_chain`), the chain start of the next state it registers
  chain: dict[int, int] = dataclasses.field(default_factory=dict)
  # the access a key this request registers inherits (eviction `lru2`: the previous access of
  # the block serving its hit, 0 = none; `twin.access_history`, core `access_history.inherit`)
  inherit: int = 0


@dataclasses.dataclass
class TwinState:
  """Everything the plain-Python manager holds; built by `init_state(config)`.

  Static (fixed by the config, the twin of `core/layout.py`'s `Layout`):
    groups, caching, bs, mode, sbs, hbs, partial, fine_keys, align, spec_s, split_bs,
    spec_groups, group_pool; and the policy objects evict, placement, admission, retention
    (built from the config; an eviction order or admission policy keeps its own tables),
    retirement (None = `none`, else the policy's `Retirement` object).
  Mutable (the twin of `CacheState`; lists are indexed by block id, length pool_size):
    ref, key, pinned, free, pinned_free, key_end, hits, chain, stamp, ranked, evict_clock,
    index, extra, cow,
    cached_this_step, reqs.
  """

  config: CacheConfig
  groups: tuple[ResolvedGroup, ...]
  # prefix caching on (off when disabled or a recurrent group has mode "none")
  caching: bool
  # effective block size per group: a recurrent group without prefix caching holds one state
  # block per request (vLLM sets its block size to max_model_len)
  bs: list[int]
  # recurrent mode per group ("none" without caching), None for attention groups
  mode: list[str | None]
  sbs: int  # scheduler block size
  hbs: int  # hash block size
  # §2.5 partial (fine-grained) hits: every hit aligns to the hash block instead of the LCM
  partial: bool
  # beyond vLLM (`CacheConfig.fine_keys`): full-attention blocks keyed at every inner boundary
  fine_keys: bool
  align: int  # hit alignment in tokens: the hash block with partial hits, else the scheduler's
  spec_s: int  # speculative blocks S (EAGLE lookahead)
  # vLLM splits on the scheduler block (`cache_config.block_size`), whatever the groups' sizes
  # (with fine keys, beyond vLLM, the junction on the recurrent block: `junction_block_size`);
  # None = no align-mode group, no split
  split_bs: int | None
  spec_groups: list[SpecGroup]
  group_pool: list[int]  # per group: 0 = pages, 1 = state slots (`CacheConfig.state_slots`)
  ref: list[int]
  key: list[tuple[int, int] | None]  # primary key (hash, group) per block
  pinned: list[bool]
  free: list[int]  # the normal free queue, head first
  pinned_free: list[int]  # the pinned tier (SPEC B1), oldest first
  key_end: list[int]  # token end of each block's key (FLOP-aware eviction)
  # per block: hits since its key was registered, its key's chain start (-1 = no key); the
  # core's `CacheState.key_hits` / `chain_start`, read by eviction policies. Kept for every
  # policy (plain Python, cheap); the core keeps them, and the eviction policy sees them,
  # only when it declares it reads them (`policies.reads_chain`, `twin.eviction.FreeBlocks`)
  hits: list[int]
  chain: list[int]
  # per block: the eviction clock when its key was registered or last hit, and the priority the
  # last re-ordering ranked it with while it stayed a free candidate (0 otherwise); the clock
  # itself (GreedyDual's L). The core's `evict_stamp` / `evict_ranked` / `evict_clock`, kept
  # only for a policy with a clock (`policies.reads_clock`); here for every policy (0 unless
  # the policy ranks with a clock)
  stamp: list[int]
  ranked: list[int]
  evict_clock: int
  # per block: the scheduler step of its key's latest access (registration or hit) and of the
  # one before (0 = none; raised by a retirement, `twin.release.retire`); the steps run so
  # far. The core's `key_last` / `key_penult` / `clock`, kept only for a policy that reads the
  # access history (`policies.reads_history`); here for every policy
  last: list[int]
  penult: list[int]
  # per block: the recurrent state a full-attention block was kept for (-1 = none; the core's
  # `kv_owner`, `twin.kv_owner`), kept for every policy, read only by those reading the history
  owner: list[int]
  step: int
  # the eviction policy reads the access history (`policies.reads_history`): only then are
  # dropped keys' ghosts kept, (group, entry) -> (last access, tag) (`twin.access_history`)
  history: bool
  ghosts: dict[tuple[int, int], tuple[int, int]]
  evict: eviction.EvictionOrder | None  # None = lru (vLLM's free queue order)
  # placement and admission seams (`hybrid_cache.policies`): None = vLLM's own rule; a
  # stateful placement is its `Placement` object (else the module)
  placement: object
  admission: object
  retention: object
  retirement: object
  index: dict[tuple[int, int], list[int]]
  # extra keys of a block besides its primary one (vLLM cached_block_hashes_by_block, §2.5)
  extra: dict[int, list[tuple[int, int]]]
  # copy-on-writes queued this step: (group, req, src, cow); released at the step's end
  cow: list[tuple[int, str, int, int]]
  cached_this_step: set[tuple[int, int]]  # keys (hash, group) cached this step
  reqs: dict[str, Request]


def _spec_groups(
  groups: tuple[ResolvedGroup, ...], bs: list[int], mode: list[str | None]
) -> list[SpecGroup]:
  """Equal-spec groups merged; full attention first (vLLM's coordinator order)."""
  out: list[SpecGroup] = []
  for gid, g in enumerate(groups):
    key = (g.kind, bs[gid], g.window, mode[gid])
    for sg in out:
      if (sg.kind, sg.block_size, sg.window, sg.mode) == key:
        sg.members.append(gid)
        sg.eagle = sg.eagle or g.eagle
        break
    else:
      out.append(SpecGroup(g.kind, bs[gid], g.window, mode[gid], g.eagle, [gid]))
  return [sg for sg in out if sg.kind == "full"] + [sg for sg in out if sg.kind != "full"]


def init_state(config: CacheConfig) -> TwinState:
  """A config's fresh state: every block but the null one free, ordered by id; no keys."""
  cfg = config
  groups = cfg.resolved_groups
  caching = cfg.enable_prefix_caching and not any(
    g.kind == "mamba" and g.mode == "none" for g in groups
  )
  bs = [
    cfg.max_model_len if g.kind == "mamba" and (g.mode == "none" or not caching) else g.block_size
    for g in groups
  ]
  mode = [(g.mode if caching else "none") if g.kind == "mamba" else None for g in groups]
  sbs = cfg.scheduler_block_size
  hbs = cfg.resolved_hash_block_size
  partial = caching and cfg.partial_hits
  admission = policies.twin_policy("admission", cfg.admission)
  placement = policies.twin_policy("placement", cfg.placement)
  retirement = policies.twin_policy("retirement", cfg.retirement)
  if hasattr(placement, "Placement"):  # a stateful placement: its object keeps its statistics
    placement = placement.Placement(cfg)
  n = cfg.pool_size
  return TwinState(
    config=cfg,
    groups=groups,
    caching=caching,
    bs=bs,
    mode=mode,
    sbs=sbs,
    hbs=hbs,
    partial=partial,
    fine_keys=partial and cfg.fine_keys,
    align=hbs if partial else sbs,
    spec_s=cfg.num_speculative_blocks,
    split_bs=sbs if "align" in mode else None,
    spec_groups=_spec_groups(groups, bs, mode),
    group_pool=[1 if cfg.state_slots and g.kind == "mamba" else 0 for g in cfg.resolved_groups],
    ref=[0] * n,
    key=[None] * n,
    pinned=[False] * n,
    free=list(range(1, n)),
    pinned_free=[],
    key_end=[-1] * n,
    hits=[0] * n,
    chain=[-1] * n,
    stamp=[0] * n,
    ranked=[0] * n,
    evict_clock=0,
    last=[0] * n,
    penult=[0] * n,
    owner=[-1] * n,
    step=0,
    history=policies.reads_history(cfg.eviction),
    ghosts={},
    evict=None if cfg.eviction == "lru" else eviction.EvictionOrder(cfg),
    placement=placement,
    admission=None if admission is None else admission.Admission(cfg),
    retention=policies.twin_policy("retention", cfg.retention),
    retirement=None if retirement is None else retirement.Retirement(cfg),
    index={},
    extra={},
    cow=[],
    cached_this_step=set(),
    reqs={},
  )
