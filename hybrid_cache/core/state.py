"""`CacheState`: the one pytree the jitted core reads and writes, and its static layout.

Fields (15 leaves, each its own buffer so the state can be donated). Several are stacked
arrays whose rows or columns are addressed by named constants; `CacheState` reads each of them
through a named property (listed under its leaf, shape after the name). NB = `Layout.num_blocks`
(the padded pool), BK = `Layout.buckets`, W = `WAYS`, R = `max_requests`, G = groups,
MB = `Layout.max_blocks`, MH = `Layout.max_hashes`.

Pool, per block:
* `ref_cnt` i32[NB]: references: table entries naming the block (plus a step's copy-on-write
  holds).
* `queue_key` i32[NUM_QUEUES, NB], rows `Q_*`: the block's key in vLLM's free queue and in
  the pinned tier (SPEC B1); `BIG` = not in that queue, a block is free iff one key is < BIG.
  - `free_key` i32[NB] (row `Q_FREE`): position in the normal free queue (smallest pops first).
  - `pinned_key` i32[NB] (row `Q_PINNED`): position in the pinned tier (oldest demoted first).
* `block_group` i32[NB]: group whose key the block carries, -1 = no key.
* `block_hash` u32[NB, HASH_LANES]: the block's key, a 64-bit chained hash as (low, high)
  uint32 lanes (`HASH_LO`, `HASH_HI`; the lanes of every hash array below too).
* `block_aux` i32[NB, NUM_AUX], columns `AUX_*`:
  - `key_step` i32[NB] (`AUX_STEP`): scheduler step (`clock`) in which the key was
    registered, -1 = no key (the same-step rule, vLLM §2.4.6).
  - `pinned` i32[NB] (`AUX_PINNED`): 1 = pinned (goes to the pinned tier when freed).
  - `key_end` i32[NB] (`AUX_END`): tokens of the prefix the key covers, -1 = no key.

Block index, set-associative `[buckets, ways]` (`block_index`):
* `index_entry` i32[BK, W, NUM_IDX], columns `IDX_*`:
  - `index_block` i32[BK, W] (`IDX_BLOCK`): the block carrying the entry's key, -1 = empty way.
  - `index_seq` i32[BK, W] (`IDX_SEQ`): insertion sequence number (oldest duplicate wins).
* `index_hash` u32[BK, W, HASH_LANES]: the entry's key.

Requests, per slot:
* `tables` i32[R, G, MB]: position-indexed block tables, 0 = null.
* `req_hashes` u32[R, MH, HASH_LANES]: the request's chained fine hashes, one per hash block.
* `req_info` i32[R, NUM_INFO], columns `INFO_*`:
  - `req_status` i32[R] (`INFO_STATUS`): `STATUS_EMPTY` / `STATUS_WAITING` / `STATUS_RUNNING`.
  - `req_computed` i32[R] (`INFO_COMPUTED`): tokens computed, the ones scheduled included.
  - `req_tokens` i32[R] (`INFO_TOKENS`): tokens known (prompt + output so far).
  - `req_prompt` i32[R] (`INFO_PROMPT`): prompt tokens.
  - `req_spb` i32[R] (`INFO_SPB`): shared-prefix boundary of its admission (Marconi
    junction), 0 = none.
* `req_group` i32[R, G, NUM_RG], columns `RG_*`:
  - `group_len` i32[R, G] (`RG_LEN`): blocks in the group's table row.
  - `group_ncached` i32[R, G] (`RG_NCACHED`): blocks of the row offered to the index so far.
  - `group_last` i32[R, G] (`RG_LAST`): align mode's previous running-state position, -1 = none.
* `req_partial` i32[R, G] (i32[R, 0] without partial hits, vLLM §2.5): 1 + the table position
  of a recurrent partial entry the request registered on its running state block (0 = none);
  its next allocation moves the key to a fresh copy-on-write block.

Scalars:
* `counters` i32[NUM_COUNTERS], entries `C_*`:
  - `head_key` (`C_HEAD`): smallest key of the normal free queue's head insertions (the next
    head insertion goes below it).
  - `tail_key` (`C_TAIL`): next normal free-queue tail key.
  - `pin_key` (`C_PIN`): next pinned-tier key.
  - `clock` (`C_STEP`): scheduler steps run so far.
  - `next_seq` (`C_SEQ`): next index insertion sequence number.
  - `index_overflows` (`C_OVERFLOW`): insertions dropped by a full bucket.
  - `states_admitted` (`C_REC_ADMITTED`): keys registered in recurrent groups.
  - `states_evicted` (`C_REC_EVICTED`): keyed recurrent blocks re-allocated.
  - `alpha_milli` (`C_ALPHA_MILLI`): the FLOP-aware eviction weight alpha in thousandths.
* `params` i32[NUM_PARAMS], entries `P_*`: the config's runtime parameters (`runtime_params`),
  read inside jit instead of the config so that configs differing only in them share compiled
  programs (`compile_cache.compile_key`); written by `init_state`, never changed:
  `num_real_blocks` (`P_NUM_BLOCKS`, the real pool size), `max_batched_tokens`
  (`P_MAX_BATCHED`, the token budget per step), `max_model_len` (`P_MAX_MODEL_LEN`),
  `watermark_blocks` (`P_WATERMARK`), `full_sequence_must_fit` (`P_FULL_FIT`, 0/1),
  `retention_interval` (`P_RETENTION`, `RETENTION_NONE` = None), `pin_min_drop_size`
  (`P_PIN_MIN_DROP`), `marconi_junction` (`P_JUNCTION`, 0/1), `free_all_tail` (`P_ALL_TAIL`,
  1 = `free_order="all_tail"`).
* `policy_state` i32[R, S]: the admission policy's own statistics across requests
  (`hybrid_cache.policies`, seam `admission`): R = recurrent groups, S = the policy's
  `STATE_SIZE` (shape [0, 0] for the built-in `all`). Zero at `init_state`; only the policy's
  `admit` writes it; `reset_prefix_cache` keeps it (statistics of the requests seen, not
  cache content).

The properties are plain slices (`leaf[..., COLUMN]`): reading one lowers exactly as the
indexing it names. Sites that gather a dynamic row (`state.req_info[r, INFO_COMPUTED]`) index
the leaf with the constant instead (one gather, not a column slice and a gather). Rows written
by position are built by `aux_columns`, `group_columns` and `queue_rows`.

Padded pool (`compile_cache.bucket_num_blocks`): the pool arrays have `Layout.num_blocks`
entries (the next power of two); the config's blocks `[0, num_real_blocks)` are the real
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
import jax.numpy as jnp
import numpy as np

from hybrid_cache import policies
from hybrid_cache.config import CacheConfig
from hybrid_cache.config import ResolvedGroup
from hybrid_cache.core.compile_cache import compile_key

BIG = np.int32(2**31 - 1)
WAYS = 16

# req_info columns
INFO_STATUS, INFO_COMPUTED, INFO_TOKENS, INFO_PROMPT, INFO_SPB = range(5)
NUM_INFO = 5
STATUS_EMPTY, STATUS_WAITING, STATUS_RUNNING = 0, 1, 2
# req_group columns: blocks in the table, blocks offered to the index, align's previous state.
RG_LEN, RG_NCACHED, RG_LAST = range(3)
NUM_RG = 3
# counters
C_HEAD, C_TAIL, C_PIN, C_STEP, C_SEQ, C_OVERFLOW, C_REC_ADMITTED, C_REC_EVICTED, C_ALPHA_MILLI = (
  range(9)
)
NUM_COUNTERS = 16
# block_aux columns: registration step, pinned flag, token end of the key
AUX_STEP, AUX_PINNED, AUX_END = range(3)
NUM_AUX = 3
# queue_key rows: vLLM's free queue, the pinned tier
Q_FREE, Q_PINNED = range(2)
NUM_QUEUES = 2
# index_entry columns: block id, insertion sequence number
IDX_BLOCK, IDX_SEQ = range(2)
NUM_IDX = 2
# lanes of a 64-bit hash (block_hash, index_hash, req_hashes): low, high 32 bits
HASH_LO, HASH_HI = range(2)
HASH_LANES = 2
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
  """The whole cache core state: 15 leaves, and named read-only views of their rows and
  columns (module docstring: every field with its shape and meaning).

  The views are plain slices of the leaves (no copies inside jit; on a host copy from
  `jax.device_get`, NumPy views): `state.free_key` is `state.queue_key[Q_FREE]`.
  """

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
  policy_state: jax.Array

  # ---- queue_key rows, i32[NB] (BIG = not in that queue)
  @property
  def free_key(self) -> jax.Array:
    """i32[NB]: each block's key in vLLM's free queue (smallest pops first), BIG = not in it."""
    return self.queue_key[Q_FREE]

  @property
  def pinned_key(self) -> jax.Array:
    """i32[NB]: each block's key in the pinned tier (smallest demoted first), BIG = not in it."""
    return self.queue_key[Q_PINNED]

  # ---- block_aux columns, i32[NB]
  @property
  def key_step(self) -> jax.Array:
    """i32[NB]: scheduler step (`clock`) in which each block's key was registered, -1 = none."""
    return self.block_aux[:, AUX_STEP]

  @property
  def pinned(self) -> jax.Array:
    """i32[NB]: 1 where the block is pinned (freed into the pinned tier), else 0."""
    return self.block_aux[:, AUX_PINNED]

  @property
  def key_end(self) -> jax.Array:
    """i32[NB]: tokens of the prefix each block's key covers, -1 = no key."""
    return self.block_aux[:, AUX_END]

  # ---- index_entry columns, i32[BK, W]
  @property
  def index_block(self) -> jax.Array:
    """i32[BK, W]: block carrying each index entry's key, -1 = empty way."""
    return self.index_entry[..., IDX_BLOCK]

  @property
  def index_seq(self) -> jax.Array:
    """i32[BK, W]: each index entry's insertion sequence number (oldest duplicate wins)."""
    return self.index_entry[..., IDX_SEQ]

  # ---- req_info columns, i32[R]
  @property
  def req_status(self) -> jax.Array:
    """i32[R]: each slot's `STATUS_*` (empty, waiting, running)."""
    return self.req_info[:, INFO_STATUS]

  @property
  def req_computed(self) -> jax.Array:
    """i32[R]: tokens computed per request, the ones scheduled included."""
    return self.req_info[:, INFO_COMPUTED]

  @property
  def req_tokens(self) -> jax.Array:
    """i32[R]: tokens known per request (prompt + output so far)."""
    return self.req_info[:, INFO_TOKENS]

  @property
  def req_prompt(self) -> jax.Array:
    """i32[R]: prompt tokens per request."""
    return self.req_info[:, INFO_PROMPT]

  @property
  def req_spb(self) -> jax.Array:
    """i32[R]: shared-prefix boundary (Marconi junction) of each request's admission, 0 = none."""
    return self.req_info[:, INFO_SPB]

  # ---- req_group columns, i32[R, G]
  @property
  def group_len(self) -> jax.Array:
    """i32[R, G]: blocks in each request's table row per group."""
    return self.req_group[..., RG_LEN]

  @property
  def group_ncached(self) -> jax.Array:
    """i32[R, G]: blocks of each row offered to the index so far."""
    return self.req_group[..., RG_NCACHED]

  @property
  def group_last(self) -> jax.Array:
    """i32[R, G]: align mode's previous running-state position in the row, -1 = none."""
    return self.req_group[..., RG_LAST]

  # ---- counters, i32 scalars
  @property
  def head_key(self) -> jax.Array:
    """Smallest key of the free queue's head insertions (the next one goes below it)."""
    return self.counters[C_HEAD]

  @property
  def tail_key(self) -> jax.Array:
    """Next free-queue tail key."""
    return self.counters[C_TAIL]

  @property
  def pin_key(self) -> jax.Array:
    """Next pinned-tier key."""
    return self.counters[C_PIN]

  @property
  def clock(self) -> jax.Array:
    """Scheduler steps run so far (the step `key_step` records)."""
    return self.counters[C_STEP]

  @property
  def next_seq(self) -> jax.Array:
    """Next block-index insertion sequence number."""
    return self.counters[C_SEQ]

  @property
  def index_overflows(self) -> jax.Array:
    """Index insertions dropped by a full bucket (each a later miss, never a wrong hit)."""
    return self.counters[C_OVERFLOW]

  @property
  def states_admitted(self) -> jax.Array:
    """Keys registered in recurrent groups (recurrent states admitted to the cache)."""
    return self.counters[C_REC_ADMITTED]

  @property
  def states_evicted(self) -> jax.Array:
    """Keyed recurrent blocks re-allocated (recurrent states evicted)."""
    return self.counters[C_REC_EVICTED]

  @property
  def alpha_milli(self) -> jax.Array:
    """The FLOP-aware eviction weight alpha, in thousandths (0 = LRU)."""
    return self.counters[C_ALPHA_MILLI]

  # ---- params (`runtime_params`), i32 scalars, never changed after `init_state`
  @property
  def num_real_blocks(self) -> jax.Array:
    """The config's `num_blocks`: blocks [0, num_real_blocks) are the real pool, the rest of
    the (padded) pool arrays is padding."""
    return self.params[P_NUM_BLOCKS]

  @property
  def max_batched_tokens(self) -> jax.Array:
    """The token budget of a scheduler step (`max_num_batched_tokens`)."""
    return self.params[P_MAX_BATCHED]

  @property
  def max_model_len(self) -> jax.Array:
    """The config's `max_model_len`."""
    return self.params[P_MAX_MODEL_LEN]

  @property
  def watermark_blocks(self) -> jax.Array:
    """Blocks an admission must leave free while other requests run."""
    return self.params[P_WATERMARK]

  @property
  def full_sequence_must_fit(self) -> jax.Array:
    """1 = an admission needs blocks for its whole sequence, 0 = for its first chunk."""
    return self.params[P_FULL_FIT]

  @property
  def retention_interval(self) -> jax.Array:
    """The config's `retention_interval`, `RETENTION_NONE` (-1) for None (dense)."""
    return self.params[P_RETENTION]

  @property
  def pin_min_drop_size(self) -> jax.Array:
    """Fewest blocks a window drop must release for its blocks to be pinned."""
    return self.params[P_PIN_MIN_DROP]

  @property
  def marconi_junction(self) -> jax.Array:
    """1 = admissions record the shared-prefix boundary (`req_spb`), else 0."""
    return self.params[P_JUNCTION]

  @property
  def free_all_tail(self) -> jax.Array:
    """1 = `free_order="all_tail"`: blocks without a key are freed to the tail too."""
    return self.params[P_ALL_TAIL]


def _by_position(columns: dict[int, jax.Array], axis: int) -> jax.Array:
  """`columns` ({position: array}, every position once) stacked along `axis` in position order."""
  return jnp.stack([columns[i] for i in range(len(columns))], axis=axis)


def aux_columns(step, pinned, end) -> jax.Array:
  """i32[..., NUM_AUX]: `block_aux` rows from their columns (each i32[...], `AUX_*` order)."""
  return _by_position({AUX_STEP: step, AUX_PINNED: pinned, AUX_END: end}, axis=1)


def group_columns(length, ncached, last) -> jax.Array:
  """i32[G, NUM_RG]: a request's `req_group` row from its columns (each i32[G], `RG_*`)."""
  return _by_position({RG_LEN: length, RG_NCACHED: ncached, RG_LAST: last}, axis=1)


def queue_rows(free, pinned) -> jax.Array:
  """i32[NUM_QUEUES, NB]: `queue_key` from its rows (each i32[NB], `Q_*` order)."""
  return _by_position({Q_FREE: free, Q_PINNED: pinned}, axis=0)


# an unkeyed, unpinned block's `block_aux` row
NO_KEY_AUX = np.zeros(NUM_AUX, np.int32)
NO_KEY_AUX[[AUX_STEP, AUX_END]] = -1
NO_KEY_AUX.flags.writeable = False


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
  qk = np.full((NUM_QUEUES, nb), BIG, np.int32)
  qk[Q_FREE, 1:real] = np.arange(1, real, dtype=np.int32)
  counters = np.zeros(NUM_COUNTERS, np.int32)
  counters[C_HEAD] = 1  # smallest key in use; head insertions go below it
  counters[C_TAIL] = real  # next tail key
  counters[C_PIN] = 0
  aux = np.tile(NO_KEY_AUX, (nb, 1))
  rg = np.zeros((r, g, NUM_RG), np.int32)
  rg[:, :, RG_LAST] = -1
  state = CacheState(
    ref_cnt=np.zeros((nb,), np.int32),
    queue_key=qk,
    block_group=np.full((nb,), -1, np.int32),
    block_hash=np.zeros((nb, HASH_LANES), np.uint32),
    block_aux=aux,
    index_entry=np.full((lay.buckets, WAYS, NUM_IDX), -1, np.int32),
    index_hash=np.zeros((lay.buckets, WAYS, HASH_LANES), np.uint32),
    tables=np.zeros((r, g, lay.max_blocks), np.int32),
    req_hashes=np.zeros((r, lay.max_hashes, HASH_LANES), np.uint32),
    req_info=np.zeros((r, NUM_INFO), np.int32),
    req_group=rg,
    counters=counters,
    req_partial=np.zeros((r, g if lay.partial else 0), np.int32),
    params=runtime_params(config),
    policy_state=np.zeros(policy_state_shape(config, lay), np.int32),
  )
  return jax.device_put(state)


def policy_state_shape(config: CacheConfig, lay: Layout) -> tuple[int, int]:
  """(R, S): the `policy_state` leaf's shape (module docstring)."""
  policy = policies.core_policy("admission", config.admission)
  if policy is None:
    return (0, 0)
  return (len(lay.recurrent_groups), policy.STATE_SIZE)


def cdiv(a, b):
  return -(-a // b)


def floor_to(x, m):
  return (x // m) * m
