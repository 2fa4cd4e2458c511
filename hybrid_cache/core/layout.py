"""`Layout`: the static sizes and per-group constants the jitted core is traced with.

Derived once per compile key (`compile_cache.compile_key`) from the config and the per-kind
group rules (`groups.rules`: `hit_need`, `disables_caching` / `without_caching`, `is_align`,
`caches_prompt_tail`, `takes_fine_keys`, `KEEPS_PREFIX`, `RECURRENT`) and the policy registry
(`policies.reads_chain`), so that the rest of the core reads fields (`Layout.spec_groups`,
`align_bs`, `recurrent_groups`, `chain_features`, ...) and compares no kind, mode or policy name.

Padded shapes (`compile_cache`): `num_blocks` is the next power of two of the config's id
space `pool_size` (pages, then state slots; the
padding blocks: `state` module docstring), `max_blocks` / `max_hashes` are the widths of the
bucketed `max_model_len`; the block index has `buckets` buckets of `WAYS` ways.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from hybrid_cache import policies
from hybrid_cache.config import CacheConfig
from hybrid_cache.config import ResolvedGroup
from hybrid_cache.core.compile_cache import compile_key

WAYS = 16  # ways per block-index bucket


@dataclasses.dataclass(frozen=True)
class SpecGroup:
  """Groups with equal specs, looked up together (a hit needs the key in every member)."""

  spec: ResolvedGroup
  members: tuple[int, ...]
  need: int  # `hit_need`: swa ceil((W-1)/B) without the EAGLE +1, else 0


@dataclasses.dataclass(frozen=True)
class Layout:
  """Static sizes and per-group constants derived from a `CacheConfig`, and that config.

  The one static argument of the core's functions: `config` is the config the layout was
  derived from (inside jit the compile key, `compile_cache.compile_key`), read as
  `lay.config.pinning`, `lay.config.eviction`, ...; the other fields are derived from it.
  """

  config: CacheConfig
  num_blocks: int
  num_groups: int
  max_blocks: int
  max_hashes: int
  max_requests: int
  buckets: int
  groups: tuple[ResolvedGroup, ...]
  hash_block_size: int
  sbs: int
  spec_groups: tuple[SpecGroup, ...]  # full attention first
  align_bs: int  # block size of the first align-mode recurrent group, 0 if none
  caching: bool  # prefix caching on (and no recurrent group in mode "none")
  lookahead: int
  num_spec_blocks: int
  recurrent_groups: tuple[int, ...] = ()  # indices of recurrent (mamba) groups
  # indices of the groups whose hit is the whole prefix (full attention, `KEEPS_PREFIX`)
  prefix_groups: tuple[int, ...] = ()
  # vLLM §2.5 fine-grained (partial) hits: hits align to `hit_align` (the hash block when
  # `partial`, else the scheduler block); `fine_groups`: groups whose block is larger than the
  # hash block (looked up at hash-block granularity, may carry a partial entry)
  partial: bool = False
  hit_align: int = 0
  fine_groups: tuple[int, ...] = ()
  # groups registering the prompt-tail partial entry at floor_to(num_prompt, HBS) (vLLM
  # `_cache_partial_tail_block`): full attention with a block larger than the hash block (with
  # or without partial hits), recurrent `align` ones with partial hits
  tail_groups: tuple[int, ...] = ()
  # beyond vLLM (`CacheConfig.fine_keys`): the full-attention fine groups whose full blocks are
  # also keyed at every hash-block boundary inside them (`cache_keys.fine_key_entries`)
  fine_key_groups: tuple[int, ...] = ()
  extra_keys: bool = False  # a block may carry a second (partial) key: evictions scan the index
  # the eviction policy reads the chain features (`policies.reads_chain`): only then does the
  # state carry and the core maintain `block_aux` key_hits / chain_start and `req_group` chain
  # (`state` module docstring); else the traced program has no trace of them
  chain_features: bool = False
  # the eviction policy keeps a clock (`policies.reads_clock`, implies `chain_features`): the
  # state carries `block_aux` evict_stamp / evict_ranked and the core maintains them and the
  # counter evict_clock (`eviction` module docstring); else no trace of them
  eviction_clock: bool = False
  # the eviction policy reads the access history (`policies.reads_history`): the state carries
  # `block_aux` key_last / key_penult / kv_owner (and the chain and clock columns before them,
  # idle unless declared too: `tuned`) and the core maintains them at registration, hit,
  # retirement and finish; else no trace of them
  access_history: bool = False
  # the eviction policy re-orders the free queue (`policies.rekeys`: all but `lru`): the state
  # carries `queue_order` (recency, rank) and `eviction.prepare` orders the queue at every
  # step; `ranks_all` (`policies.reads_recency`): the whole queue, else each pool's first
  # `eviction.order_window` blocks, the rest when a step reaches them (lazy order)
  rekeys: bool = False
  ranks_all: bool = False
  # a second pool of state slots (`CacheConfig.state_slots`): ids [first_slot, num_real) where
  # `CacheState.first_slot` is a runtime parameter; `group_pool`: per group, the pool its blocks
  # come from (0 = pages, 1 = state slots: the recurrent groups when `state_pool`)
  state_pool: bool = False
  group_pool: tuple[int, ...] = ()
  # the two pools share a byte budget (`CacheConfig.byte_budget`, `core/byte_budget.py`)
  byte_budget: bool = False

  @property
  def num_pools(self) -> int:
    """1 (one shared pool, vLLM) or 2 (pages and state slots)."""
    return 2 if self.state_pool else 1

  @property
  def spec_group_of(self) -> tuple[int, ...]:
    """Per group, the index of its spec group in `spec_groups`."""
    out = [0] * self.num_groups
    for j, s in enumerate(self.spec_groups):
      for g in s.members:
        out[g] = j
    return tuple(out)

  @property
  def block_sizes(self) -> tuple[int, ...]:
    """Each group's block size, in group order."""
    return tuple(g.block_size for g in self.groups)


def layout(config: CacheConfig) -> Layout:
  """The static layout of `config`'s compile key (`compile_cache.compile_key`): bucketed
  shapes, so equal for configs that share compiled programs."""
  return derive_layout(compile_key(config))


@functools.lru_cache(maxsize=64)
def derive_layout(config: CacheConfig) -> Layout:
  """The layout of `config` exactly as given (no compile key: the config's own, unbucketed
  shapes unless `config` is a compile key); `layout` is the one the jitted core uses."""
  # the per-kind rules (`groups.rules`); imported here: the group modules import `state`,
  # which imports this module
  from hybrid_cache.core.groups import rules

  caching = config.enable_prefix_caching and not any(
    rules(g).disables_caching(g) for g in config.resolved_groups
  )
  groups = tuple(g if caching else rules(g).without_caching(g) for g in config.resolved_groups)
  specs: dict[ResolvedGroup, list[int]] = {}
  for i, g in enumerate(groups):
    specs.setdefault(g, []).append(i)
  sg = [SpecGroup(s, tuple(m), rules(s).hit_need(s)) for s, m in specs.items()]
  sg.sort(key=lambda s: 0 if rules(s.spec).KEEPS_PREFIX else 1)
  align = [g.block_size for g in groups if rules(g).is_align(g)]
  partial = bool(caching and config.partial_hits)
  hbs = config.resolved_hash_block_size
  tail = tuple(
    i
    for i, g in enumerate(groups)
    if caching and g.block_size > hbs and rules(g).caches_prompt_tail(g, partial)
  )
  fine_key = tuple(
    i
    for i, g in enumerate(groups)
    if partial and config.fine_keys and rules(g).takes_fine_keys(g, hbs)
  )
  cap = 4 * config.pool_size
  if fine_key:
    # a page carries up to s = B / HBS keys (`cache_keys.fine_key_entries`): at most 1/2 load
    # even if every id were a page (the compile key does not know the pages / slots split).
    # The index's size is what fine keys cost: evictions scan it (`block_index.evict_ids`,
    # scan_all); Mooncake, 120 requests, 2e11, B 512, U 64: 4,096 / 8,192 / 16,384 / 32,768
    # buckets replay in 1.0 / 1.6 / 3.1 / 10.5 s (2026-11-27; 32,768 = load 1/4)
    s = max(groups[i].block_size // hbs for i in fine_key)
    cap = max(cap, 2 * config.pool_size * s)
  buckets = 1 << max(0, math.ceil(math.log2(max(1, -(-cap // WAYS)))))
  return Layout(
    config=config,
    num_blocks=config.pool_size,
    num_groups=config.num_groups,
    max_blocks=config.max_blocks_per_request,
    max_hashes=config.max_hash_blocks,
    max_requests=config.max_requests,
    buckets=buckets,
    groups=groups,
    hash_block_size=config.resolved_hash_block_size,
    sbs=config.scheduler_block_size,
    spec_groups=tuple(sg),
    align_bs=align[0] if (align and caching) else 0,
    caching=caching,
    lookahead=config.num_speculative_blocks,  # EAGLE lookahead slots (vLLM: S tokens)
    num_spec_blocks=config.num_speculative_blocks,
    recurrent_groups=tuple(i for i, g in enumerate(groups) if rules(g).RECURRENT),
    prefix_groups=tuple(i for i, g in enumerate(groups) if rules(g).KEEPS_PREFIX),
    partial=partial,
    hit_align=config.hit_alignment if caching else config.scheduler_block_size,
    fine_groups=tuple(i for i, g in enumerate(groups) if partial and g.block_size > hbs),
    tail_groups=tail,
    fine_key_groups=fine_key,
    # a prompt-tail entry goes on a block that may carry its own key already (without partial
    # hits only full attention registers one)
    extra_keys=partial or bool(tail),
    chain_features=policies.reads_chain(config.eviction),
    eviction_clock=policies.reads_clock(config.eviction),
    access_history=policies.reads_history(config.eviction),
    rekeys=policies.rekeys(config.eviction),
    ranks_all=policies.reads_recency(config.eviction),
    state_pool=config.state_slots > 0,
    byte_budget=config.byte_budget is not None,
    group_pool=tuple(
      1 if config.state_slots and rules(g).RECURRENT else 0 for g in config.resolved_groups
    ),
  )
