"""`CacheState`: the one pytree the jitted core reads and writes, and its static layout.

Leaves (14, each its own buffer so the state can be donated):

* pool, per block `[num_blocks]`: `ref_cnt` i32; `queue_key` i32[2, NB] (row 0: position in
  vLLM's free queue, row 1: position in the pinned tier; `BIG` = not in that queue);
  `block_group` i32 (group whose key the block carries, -1 = no key); `block_hash` u32[NB, 2];
  `block_aux` i32[NB, 3] (column 0: step in which the key was registered, -1 = no key;
  column 1: pinned flag; column 2: tokens of the prefix the key covers, -1 = no key).
* block index, set-associative `[buckets, ways]`: `index_entry` i32[BK, W, 2] (block id or -1,
  insertion sequence number), `index_hash` u32[BK, W, 2].
* requests: `tables` i32[R, G, MB] (position-indexed block tables, 0 = null), `req_hashes`
  u32[R, MH, 2] (chained fine hashes), `req_info` i32[R, 5] (`INFO_*` columns), `req_group`
  i32[R, G, 3] (`RG_*` columns).
* `counters` i32[16] (`C_*`): next head key, next tail key, next pinned key, step, insertion
  sequence, index overflows, recurrent states admitted (keys registered in recurrent groups),
  recurrent states evicted (keyed recurrent blocks re-allocated), the FLOP-aware eviction weight
  alpha in thousandths.
* `req_partial` i32[R, G] (i32[R, 0] without partial hits, vLLM §2.5): 1 + the table position
  of a recurrent partial entry the request registered on its running state block (0 = none);
  its next allocation moves the key to a fresh copy-on-write block.
* `params` i32[NUM_PARAMS] (`P_*`): the config's runtime parameters (`runtime_params`), read
  inside jit instead of the config so that configs differing only in them share compiled
  programs (`compile_cache.compile_key`): the real pool size, the token budget per step,
  max_model_len, watermark blocks, full_sequence_must_fit, retention_interval (-1 = None),
  pin_min_drop_size, marconi_junction, free_order (1 = "all_tail"). Written by `init_state`,
  never changed.

Padded pool (`compile_cache.bucket_num_blocks`): the pool arrays have `Layout.num_blocks`
entries (the next power of two); the config's blocks `[0, params[P_NUM_BLOCKS])` are the real
ones, the rest are padding: never free (both queue keys BIG), never held, keyed or indexed, and
outside every pool count. Table and hash rows are likewise `Layout.max_blocks` /
`Layout.max_hashes` wide, the widths of the bucketed `max_model_len`; positions past the real
width are never reached (no request exceeds max_model_len).

Free-queue order is an int32 key per block: head insertions get keys below every existing key,
tail insertions keys above; popping takes the smallest key (a doubly-linked list, exactly).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import flax.struct
import jax
import numpy as np

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import ResolvedGroup
from hybrid_cache.core.compile_cache import compile_key

BIG = np.int32(2**31 - 1)
WAYS = 16

# req_info columns
INFO_STATUS, INFO_COMPUTED, INFO_TOKENS, INFO_PROMPT, INFO_SPB = range(5)
STATUS_EMPTY, STATUS_WAITING, STATUS_RUNNING = 0, 1, 2
# req_group columns: blocks in the table, blocks offered to the index, align's previous state.
RG_LEN, RG_NCACHED, RG_LAST = range(3)
# counters
C_HEAD, C_TAIL, C_PIN, C_STEP, C_SEQ, C_OVERFLOW, C_REC_ADMITTED, C_REC_EVICTED, C_ALPHA_MILLI = (
  range(9)
)
NUM_COUNTERS = 16
AUX_STEP, AUX_PINNED, AUX_END = range(3)
# params columns (`runtime_params`)
(
  P_NUM_BLOCKS,
  P_MAX_BATCHED,
  P_MAX_MODEL_LEN,
  P_WATERMARK,
  P_FULL_FIT,
  P_RETENTION,
  P_PIN_MIN_DROP,
  P_JUNCTION,
  P_ALL_TAIL,
) = range(9)
NUM_PARAMS = 9
RETENTION_NONE = -1  # params[P_RETENTION] for retention_interval None (dense)


@flax.struct.dataclass
class CacheState:
  """The whole cache core state (see module docstring for shapes)."""

  ref_cnt: jax.Array
  queue_key: jax.Array
  block_group: jax.Array
  block_hash: jax.Array
  block_aux: jax.Array
  index_entry: jax.Array
  index_hash: jax.Array
  tables: jax.Array
  req_hashes: jax.Array
  req_info: jax.Array
  req_group: jax.Array
  counters: jax.Array
  req_partial: jax.Array
  params: jax.Array


@dataclasses.dataclass(frozen=True)
class SpecGroup:
  """Groups with equal specs, looked up together (a hit needs the key in every member)."""

  spec: ResolvedGroup
  members: tuple[int, ...]
  need: int  # `hit_need`: swa ceil((W-1)/B) without the EAGLE +1, else 0


@dataclasses.dataclass(frozen=True)
class Layout:
  """Static sizes and per-group constants derived from a `CacheConfig`."""

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
  extra_keys: bool = False  # a block may carry a second (partial) key: evictions scan the index

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
  return _layout(compile_key(config))


@functools.lru_cache(maxsize=64)
def _layout(config: CacheConfig) -> Layout:
  # the per-kind rules (`groups.rules`); imported here: the group modules import this module
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
  cap = 4 * config.num_blocks
  buckets = 1 << max(0, math.ceil(math.log2(max(1, -(-cap // WAYS)))))
  return Layout(
    num_blocks=config.num_blocks,
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
    # a prompt-tail entry goes on a block that may carry its own key already (without partial
    # hits only full attention registers one)
    extra_keys=partial or bool(tail),
  )


def runtime_params(config: CacheConfig) -> np.ndarray:
  """i32[NUM_PARAMS]: the `params` leaf of `config` (`P_*` columns, module docstring)."""
  p = np.zeros(NUM_PARAMS, np.int32)
  r = config.retention_interval
  p[P_NUM_BLOCKS] = config.num_blocks
  p[P_MAX_BATCHED] = config.max_num_batched_tokens
  p[P_MAX_MODEL_LEN] = config.max_model_len
  p[P_WATERMARK] = config.watermark_blocks
  p[P_FULL_FIT] = int(config.full_sequence_must_fit)
  p[P_RETENTION] = RETENTION_NONE if r is None else r
  p[P_PIN_MIN_DROP] = config.pin_min_drop_size
  p[P_JUNCTION] = int(config.marconi_junction)
  p[P_ALL_TAIL] = int(config.free_order == "all_tail")
  return p


def init_state(config: CacheConfig, bucketed: bool = True) -> CacheState:
  """A fresh state: every block but the null block 0 free, in id order; no keys, no requests.

  The arrays have the shapes of `layout(config)` (padded pool, bucketed widths); the padding
  blocks past `config.num_blocks` are never free. `bucketed=False`: the config's own shapes
  (no padding; for unit tests of the pool and index primitives, which read sizes from the
  arrays; the jitted entry points need the bucketed state). Built in NumPy and transferred
  once (no per-shape programs to compile).
  """
  lay = layout(config) if bucketed else _layout(config)
  nb, g, r = lay.num_blocks, lay.num_groups, lay.max_requests
  real = config.num_blocks
  qk = np.full((2, nb), BIG, np.int32)
  qk[0, 1:real] = np.arange(1, real, dtype=np.int32)
  counters = np.zeros(NUM_COUNTERS, np.int32)
  counters[C_HEAD] = 1  # smallest key in use; head insertions go below it
  counters[C_TAIL] = real  # next tail key
  counters[C_PIN] = 0
  aux = np.zeros((nb, 3), np.int32)
  aux[:, AUX_STEP] = -1
  aux[:, AUX_END] = -1
  rg = np.zeros((r, g, 3), np.int32)
  rg[:, :, RG_LAST] = -1
  state = CacheState(
    ref_cnt=np.zeros((nb,), np.int32),
    queue_key=qk,
    block_group=np.full((nb,), -1, np.int32),
    block_hash=np.zeros((nb, 2), np.uint32),
    block_aux=aux,
    index_entry=np.full((lay.buckets, WAYS, 2), -1, np.int32),
    index_hash=np.zeros((lay.buckets, WAYS, 2), np.uint32),
    tables=np.zeros((r, g, lay.max_blocks), np.int32),
    req_hashes=np.zeros((r, lay.max_hashes, 2), np.uint32),
    req_info=np.zeros((r, 5), np.int32),
    req_group=rg,
    counters=counters,
    req_partial=np.zeros((r, g if lay.partial else 0), np.int32),
    params=runtime_params(config),
  )
  return jax.device_put(state)


def cdiv(a, b):
  return -(-a // b)


def floor_to(x, m):
  return (x // m) * m
