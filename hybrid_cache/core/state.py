"""`CacheState`: the one pytree the jitted core reads and writes, its leaves' named rows and
columns (static sizes: `layout.Layout`; a fresh state and its params leaf:
`fresh_state.init_state`, `fresh_state.runtime_params`; the row builders: `rows`).

Fields (15 leaves, each its own buffer so the state can be donated). Several are stacked
arrays whose rows or columns are addressed by named constants; `CacheState` reads each of them
through a named property (listed under its leaf, shape after the name). NB = `Layout.num_blocks`
(the padded pool), BK = `Layout.buckets`, W = `layout.WAYS`, R = `max_requests`, G = groups,
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
* `block_aux` i32[NB, NUM_AUX] (i32[NB, NUM_AUX_CHAIN] with the chain features), columns
  `AUX_*`:
  - `key_step` i32[NB] (`AUX_STEP`): scheduler step (`clock`) in which the key was
    registered, -1 = no key (the same-step rule, vLLM §2.4.6).
  - `pinned` i32[NB] (`AUX_PINNED`): 1 = pinned (goes to the pinned tier when freed).
  - `key_end` i32[NB] (`AUX_END`): tokens of the prefix the key covers, -1 = no key.
  The last two columns are the chain features an eviction policy may read (`FreeBlocks.hits`,
  `chain_start`); they exist only when the policy declares it reads them
  (`policies.reads_chain`, `Layout.chain_features`), so that the core neither carries nor
  maintains them for the other policies (its traced program is then exactly the one without
  them; maintained on every step they cost ~13%, issue 14):
  - `key_hits` i32[NB] (`AUX_HITS`): admitted allocations that hit the block since its key was
    registered (0 then and without a key; moved with the key by a copy-on-write).
  - `chain_start` i32[NB] (`AUX_CHAIN`): where the key's KV span starts, -1 = no key. Recurrent:
    the registering request's `RG_CHAIN` (its previous kept state's end: `key_end - chain_start`
    tokens of KV back to it); else the block's first token (table position * block size).

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
* `req_group` i32[R, G, NUM_RG] (i32[R, G, NUM_RG_CHAIN] with the chain features), columns
  `RG_*`:
  - `group_len` i32[R, G] (`RG_LEN`): blocks in the group's table row.
  - `group_ncached` i32[R, G] (`RG_NCACHED`): blocks of the row offered to the index so far.
  - `group_last` i32[R, G] (`RG_LAST`): align mode's previous running-state position, -1 = none.
  - `group_chain` i32[R, G] (`RG_CHAIN`): token end of the request's latest kept state (its hit
    at admission, then each state block it registers), 0 = none; read for recurrent groups.
    Only with the chain features (like `AUX_HITS` / `AUX_CHAIN`).
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
  - `states_evicted` (`C_REC_EVICTED`): keyed recurrent blocks re-allocated (or evicted over
    the shared byte budget, `byte_budget.enforce`).
  - `alpha_milli` (`C_ALPHA_MILLI`): the FLOP-aware eviction weight alpha in thousandths.
* `params` i32[NUM_PARAMS], entries `P_*`: the config's runtime parameters (`runtime_params`),
  read inside jit instead of the config so that configs differing only in them share compiled
  programs (`compile_cache.compile_key`); written by `init_state`, never changed:
  `num_real_blocks` (`P_NUM_BLOCKS`, the real id space `CacheConfig.pool_size`),
  `first_slot` (`P_FIRST_SLOT`, the first state-slot id: `num_blocks`, = `num_real_blocks`
  without a second pool), `page_bytes` / `slot_bytes` / `byte_budget` (`P_PAGE_BYTES`,
  `P_SLOT_BYTES`, `P_BYTE_BUDGET`: the shared byte budget of the two pools, 0 = none),
  `max_batched_tokens`
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
by position are built by `rows.aux_columns`, `group_columns` and `queue_rows`. Whether a state
carries the chain features is static (`CacheState.has_chain`: the width of `block_aux`).

Padded pool (`compile_cache.bucket_num_blocks`): the pool arrays have `Layout.num_blocks`
entries (the next power of two); the config's ids `[0, num_real_blocks)` are the real
ones (with a second pool, `CacheConfig.state_slots`: the pages `[0, first_slot)`, then the
state slots `[first_slot, num_real_blocks)`; both share the free queue's key order, each
pool's queue being that order restricted to its ids), the rest are padding: never free
(both queue keys BIG), never held, keyed or indexed, and outside every pool count. Table and
hash rows are likewise `Layout.max_blocks` /
`Layout.max_hashes` wide, the widths of the bucketed `max_model_len`; positions past the real
width are never reached (no request exceeds max_model_len).

Free-queue order is an int32 key per block: head insertions get keys below every existing key,
tail insertions keys above; popping takes the smallest key (a doubly-linked list, exactly).
"""

from __future__ import annotations

import flax.struct
import jax
import numpy as np

from hybrid_cache.core.params import ParamViews

BIG = np.int32(2**31 - 1)

# req_info columns
INFO_STATUS, INFO_COMPUTED, INFO_TOKENS, INFO_PROMPT, INFO_SPB = range(5)
NUM_INFO = 5
STATUS_EMPTY, STATUS_WAITING, STATUS_RUNNING = 0, 1, 2
# req_group columns: table blocks, blocks offered, align's previous state; with the chain
# features (`Layout.chain_features`) also the latest kept state's end
RG_LEN, RG_NCACHED, RG_LAST, RG_CHAIN = range(4)
NUM_RG = 3  # without the chain features
NUM_RG_CHAIN = 4
# counters
C_HEAD, C_TAIL, C_PIN, C_STEP, C_SEQ, C_OVERFLOW, C_REC_ADMITTED, C_REC_EVICTED, C_ALPHA_MILLI = (
  range(9)
)
NUM_COUNTERS = 16
# block_aux columns: registration step, pinned flag, key's token end; with the chain features
# (`Layout.chain_features`) also hits and chain start
AUX_STEP, AUX_PINNED, AUX_END, AUX_HITS, AUX_CHAIN = range(5)
NUM_AUX = 3  # without the chain features
NUM_AUX_CHAIN = 5
# queue_key rows: vLLM's free queue, the pinned tier
Q_FREE, Q_PINNED = range(2)
NUM_QUEUES = 2
# index_entry columns: block id, insertion sequence number
IDX_BLOCK, IDX_SEQ = range(2)
NUM_IDX = 2
# lanes of a 64-bit hash (block_hash, index_hash, req_hashes): low, high 32 bits
HASH_LO, HASH_HI = range(2)
HASH_LANES = 2


@flax.struct.dataclass
class CacheState(ParamViews):
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

  @property
  def has_chain(self) -> bool:
    """Whether the state carries the chain features (static: `Layout.chain_features`)."""
    return self.block_aux.shape[-1] == NUM_AUX_CHAIN

  @property
  def key_hits(self) -> jax.Array:
    """i32[NB]: prefix-cache hits on each block since its key was registered (0: no key);
    chain-feature states only (`has_chain`)."""
    return self.block_aux[:, AUX_HITS]

  @property
  def chain_start(self) -> jax.Array:
    """i32[NB]: token where each key's chain span starts (module docstring), -1 = no key;
    chain-feature states only (`has_chain`)."""
    return self.block_aux[:, AUX_CHAIN]

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

  @property
  def group_chain(self) -> jax.Array:
    """i32[R, G]: token end of each request's latest kept state per group, 0 = none;
    chain-feature states only (`has_chain`)."""
    return self.req_group[..., RG_CHAIN]

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


def cdiv(a, b):
  return -(-a // b)


def floor_to(x, m):
  return (x // m) * m
