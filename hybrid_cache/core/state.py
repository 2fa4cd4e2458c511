"""`CacheState`: the one pytree the jitted core reads and writes, and the packing of its leaves'
named rows and columns (static sizes: `layout.Layout`; a fresh state: `fresh_state.init_state`;
the `params` leaf: `params`).

Fields (16 leaves, each its own buffer so the state can be donated). Several are stacked
arrays whose rows or columns are addressed by position constants (`Q_*`, `AUX_*`, ...) that
no module but this one uses: every other module reads and writes them by name, through the
leaf's view class (`QueueKeys`, `BlockAux`, `IndexEntry`, `ReqInfo`, `ReqGroup`, `Counters`,
`HashLanes`; the field names are given under each leaf) or the `CacheState` property named
after the column (listed under its leaf, shape after the name). NB = `Layout.num_blocks`
(the padded pool), BK = `Layout.buckets`, W = `layout.WAYS`, R = `max_requests`, G = groups,
MB = `Layout.max_blocks`, MH = `Layout.max_hashes`.

Pool, per block:
* `ref_cnt` i32[NB]: references: table entries naming the block (plus a step's copy-on-write
  holds).
* `queue_key` i32[NUM_QUEUES, NB], rows `Q_*` (`QueueKeys`: `free`, `pinned`; `QueueCounts`
  names the same entries on the last axis of free-block counts): the block's key in vLLM's
  free queue and in the pinned tier (SPEC B1); `BIG` = not in that queue, a block is free iff
  one key is < BIG.
  - `free_key` i32[NB] (row `Q_FREE`): position in the normal free queue (smallest pops first).
  - `pinned_key` i32[NB] (row `Q_PINNED`): position in the pinned tier (oldest demoted first).
* `block_group` i32[NB]: group whose key the block carries, -1 = no key.
* `block_hash` u32[NB, HASH_LANES]: the block's key, a 64-bit chained hash as (low, high)
  uint32 lanes (`HASH_LO`, `HASH_HI`, `HashLanes`: `lo`, `hi`; the lanes of every hash array
  below too).
* `block_aux` i32[NB, NUM_AUX] (i32[NB, NUM_AUX_CHAIN] with the chain features), columns
  `AUX_*` (`BlockAux`, fields named as the properties; `BlockAux.NO_KEY`: an unkeyed row):
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
    the registering request's `group_chain` (its previous kept state's end: `key_end - chain_start`
    tokens of KV back to it); else the block's first token (table position * block size).
  Two more columns exist only for an eviction policy with a clock (`policies.reads_clock`,
  `Layout.eviction_clock`, GreedyDual; it implies the chain features; `eviction` module
  docstring), 0 without a key:
  - `evict_stamp` i32[NB] (`AUX_STAMP`): the eviction clock (`evict_clock`) when the key was
    registered or last hit.
  - `evict_ranked` i32[NB] (`AUX_RANKED`): the priority the last `eviction.prepare` ranked the
    block with, while it has stayed a free candidate since (0 otherwise): evicting the block
    raises `evict_clock` to it.
  Three more exist only for an eviction policy that reads the access history
  (`policies.reads_history`, `Layout.access_history`, LRU-2, `policies/lru2.py`); such a state
  carries the chain and clock columns too (positions stay fixed), idle at their no-key values
  unless the policy also declares those; 0 without a key:
  - `key_last` i32[NB] (`AUX_LAST`): the scheduler step (`clock`) of the key's latest access:
    its registration or its last hit.
  - `key_penult` i32[NB] (`AUX_PENULT`): the step of the access before that (0 = none: the
    key was accessed once), raised by a retirement to the penultimate accesses of the states
    its finishing request's deepest state superseded (`release.retire`).
  - `kv_owner` i32[NB] (`AUX_OWNER`): for a full-attention block, the recurrent state block
    that the last finished request through it needed it for (`core.kv_owner`), -1 = none
    (no key, or no finished request since its registration).

Block index, set-associative `[buckets, ways]` (`block_index`):
* `index_entry` i32[BK, W, NUM_IDX], columns `IDX_*` (`IndexEntry`: `block`, `seq`):
  - `index_block` i32[BK, W] (`IDX_BLOCK`): the block carrying the entry's key, -1 = empty way.
  - `index_seq` i32[BK, W] (`IDX_SEQ`): insertion sequence number (oldest duplicate wins).
* `index_hash` u32[BK, W, HASH_LANES]: the entry's key.

Requests, per slot:
* `tables` i32[R, G, MB]: position-indexed block tables, 0 = null.
* `req_hashes` u32[R, MH, HASH_LANES]: the request's chained fine hashes, one per hash block.
* `req_info` i32[R, NUM_INFO], columns `INFO_*` (`ReqInfo`: `status`, `computed`, `tokens`,
  `prompt`, `spb`):
  - `req_status` i32[R] (`INFO_STATUS`): `STATUS_EMPTY` / `STATUS_WAITING` / `STATUS_RUNNING`.
  - `req_computed` i32[R] (`INFO_COMPUTED`): tokens computed, the ones scheduled included.
  - `req_tokens` i32[R] (`INFO_TOKENS`): tokens known (prompt + output so far).
  - `req_prompt` i32[R] (`INFO_PROMPT`): prompt tokens.
  - `req_spb` i32[R] (`INFO_SPB`): shared-prefix boundary of its admission (Marconi
    junction), 0 = none.
* `req_group` i32[R, G, NUM_RG] (i32[R, G, NUM_RG_CHAIN] with the chain features), columns
  `RG_*` (`ReqGroup`: `length`, `ncached`, `last`, `chain`):
  - `group_len` i32[R, G] (`RG_LEN`): blocks in the group's table row.
  - `group_ncached` i32[R, G] (`RG_NCACHED`): blocks of the row offered to the index so far.
  - `group_last` i32[R, G] (`RG_LAST`): align mode's previous running-state position, -1 = none.
  - `group_chain` i32[R, G] (`RG_CHAIN`): token end of the request's latest kept state (its hit
    at admission, then each state block it registers), 0 = none; read for recurrent groups.
    Only with the chain features (like `key_hits` / `chain_start`).
* `req_partial` i32[R, G] (i32[R, 0] without partial hits, vLLM §2.5): 1 + the table position
  of a recurrent partial entry the request registered on its running state block (0 = none);
  its next allocation moves the key to a fresh copy-on-write block.

Scalars:
* `counters` i32[NUM_COUNTERS], entries `C_*` (`Counters`, fields named as the properties):
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
  - `states_retired` (`C_REC_RETIRED`): recurrent keys retired by the retirement policy
    (`release.retire`; not counted in `states_evicted`).
  - `evict_clock` (`C_EVICT_CLOCK`): an eviction policy's clock (GreedyDual's L: the largest
    ranked priority evicted so far), 0 and untouched unless `Layout.eviction_clock`.
  - `eviction_weighting` (`C_WEIGHTING`): eviction `tuned`'s weighting (0 = GreedyDual, 1 =
    LRU-2, `policies/tuned.py`), 0 and unread otherwise.
  - `order_exact` (`C_ORDER_EXACT`), `order_lazy` (`C_ORDER_LAZY`): with a re-keying
    eviction policy, the free-queue key below which the normal queue is in its exact order
    (BIG: all of it) and the first key of the lazy region that `eviction.prepare` left
    unordered (`eviction` module docstring, "Lazy order"); unread otherwise.
* `params` i32[NUM_PARAMS], entries `P_*` (packed and named in `params`, the one module that
  uses them): the config's runtime parameters (`params.runtime_params`),
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
* `policy_state` i32[R, S]: the admission, placement and retirement policies' own statistics
  across requests (`hybrid_cache.policies`, seams `admission`, `placement`, `retirement`): R =
  recurrent groups, S = the admission policy's `STATE_SIZE` columns, then a stateful placement
  policy's `state_size(lay)` columns, then a retirement policy's `state_size(lay)`
  (`fresh_state.policy_columns`; shape [0, 0] when none has state, as for the built-in `all`,
  `vllm` and `none`). Zero at `init_state`; only the policies' `admit` / `keep` / `observe` /
  `pick` write their own columns; `reset_prefix_cache` keeps it (statistics of the requests
  seen, not cache content).
* `queue_order` i32[NUM_ORDER, NB] (i32[0, NB] unless the eviction policy re-keys the free
  queue, `Layout.rekeys`), rows `O_*` (`QueueOrder`: `recency`, `rank`), meaningful only
  for blocks in the normal free queue (`eviction` module docstring):
  - `free_recency` i32[NB] (`O_RECENCY`): the block's key in vLLM's free queue as `lru` would
    keep it (written with its free-queue key at every free; unique among queued blocks).
  - `free_rank` i32[NB] (`O_RANK`): the primary key the last `eviction.prepare` ordered the
    block by (its class or priority; BIG for blocks it did not order).

Why packed: a stacked leaf is one buffer, donated and updated in place as one, so a block's
key columns are cleared in one row write when it is popped (`block_index.evict_ids`) and a
registration writes its step and token end in one [k, 2] scatter ([k, 4] with the chain
features; one scatter per scheduled entry, not one per column), and the chain-feature columns exist
only in the states whose policy reads them, so that the others' traced program has none of
them (maintained on every step they cost ~13%, issue 14). Whether a state carries them is
static (`CacheState.has_chain`: the width of `block_aux`).

The views are plain indexing: a property or `Packed` field read lowers exactly as the
`leaf[..., COLUMN]` it names; `ReqInfo(state.req_info)[r].computed` gathers one entry of a
dynamic row (not a row and then a column), `ReqInfo(state.req_info[r])` reads columns of the
row once gathered. `Packed.set` / `add` write fields in keyword order and `Packed.stack`
builds rows, so no other module writes a position.

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

from typing import ClassVar

import flax.struct
import jax
import jax.numpy as jnp
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
(
  C_HEAD,
  C_TAIL,
  C_PIN,
  C_STEP,
  C_SEQ,
  C_OVERFLOW,
  C_REC_ADMITTED,
  C_REC_EVICTED,
  C_ALPHA_MILLI,
  C_REC_RETIRED,
  C_EVICT_CLOCK,
  C_WEIGHTING,
  C_ORDER_EXACT,
  C_ORDER_LAZY,
) = range(14)
NUM_COUNTERS = 16
# block_aux columns: registration step, pinned flag, key's token end; with the chain features
# (`Layout.chain_features`) also hits and chain start; with the eviction clock
# (`Layout.eviction_clock`, which implies the chain features) also stamp and ranked priority
# with the access history (`Layout.access_history`) also the last and penultimate access steps
# (after every other column: such a state carries the chain and clock columns, maybe idle)
(
  AUX_STEP,
  AUX_PINNED,
  AUX_END,
  AUX_HITS,
  AUX_CHAIN,
  AUX_STAMP,
  AUX_RANKED,
  AUX_LAST,
  AUX_PENULT,
  AUX_OWNER,
) = range(10)
NUM_AUX = 3  # without the chain features
NUM_AUX_CHAIN = 5
NUM_AUX_CLOCK = 7
NUM_AUX_HISTORY = 10
# queue_key rows: vLLM's free queue, the pinned tier
Q_FREE, Q_PINNED = range(2)
NUM_QUEUES = 2
# queue_order rows (a re-keying eviction policy only): free-queue recency, ranked primary key
O_RECENCY, O_RANK = range(2)
NUM_ORDER = 2
# index_entry columns: block id, insertion sequence number
IDX_BLOCK, IDX_SEQ = range(2)
NUM_IDX = 2
# lanes of a 64-bit hash (block_hash, index_hash, req_hashes): low, high 32 bits
HASH_LO, HASH_HI = range(2)
HASH_LANES = 2


# ---- named views of the packed leaves (the only code outside `CacheState` that uses the
# constants above)


class Packed:
  """A named view of a packed array: a leaf above, a row of one, or an array in its layout.

  `FIELDS` names each entry of the packed axis (`AXIS`: -1 = the last, columns; 0 = the
  first, rows) by its position constant; `WIDTHS`: the axis's sizes (without, with the chain
  features). `view[i]` selects leading indices lazily, so a field read is ONE index of the
  array, exactly the indexing it names: `ReqInfo(state.req_info)[r].computed` is
  `state.req_info[r, ..., INFO_COMPUTED]` (one gather), `ReqInfo(info).computed` the column
  of a row `info` already read. Writes return the new array, one field after the other in
  keyword order: `view.set(name=value, ..., mode=None)` and `view.add(...)` (`.at[...]`; `set`
  on a NumPy array writes a copy); the values are computed before the first write, as any
  call's arguments. `stack(name=array, ...)` builds rows from their fields.
  """

  FIELDS: ClassVar[dict[str, int]] = {}
  AXIS: ClassVar[int] = -1
  WIDTHS: ClassVar[tuple[int, ...]] = ()
  __slots__ = ("array", "at")

  def __init_subclass__(cls, **kw):
    super().__init_subclass__(**kw)
    if list(cls.FIELDS.values()) != list(range(len(cls.FIELDS))):
      raise TypeError(f"{cls.__name__}.FIELDS must list the positions in order")

  def __init__(self, array, at: tuple = ()):
    self.array = array
    self.at = at

  def __getitem__(self, idx) -> Packed:
    return type(self)(self.array, self.at + (idx if isinstance(idx, tuple) else (idx,)))

  def _index(self, name: str) -> tuple:
    c = self.FIELDS[name]
    return (c, *self.at) if self.AXIS == 0 else (*self.at, Ellipsis, c)

  def __getattr__(self, name: str):
    if name not in type(self).FIELDS:
      raise AttributeError(f"{type(self).__name__} has no field {name!r}")
    return self.array[self._index(name)]

  def set(self, mode: str | None = None, **values):
    """The array with each named field set (`.at[...].set(value, mode=mode)`)."""
    if isinstance(self.array, np.ndarray):
      out = self.array.copy()
      for name, v in values.items():
        out[self._index(name)] = v
      return out
    return self._write("set", mode, values)

  def add(self, mode: str | None = None, **values) -> jax.Array:
    """The array with each value added to its named field (`.at[...].add`)."""
    return self._write("add", mode, values)

  def _write(self, op: str, mode: str | None, values: dict) -> jax.Array:
    a, kw = self.array, ({} if mode is None else {"mode": mode})
    for name, v in values.items():
      a = getattr(a.at[self._index(name)], op)(v, **kw)
    return a

  @classmethod
  def stack(cls, **fields) -> jax.Array:
    """The packed array of `fields` (each i32[...]; all of them, the chain features' both or
    neither) stacked along the packed axis in position order."""
    names = list(cls.FIELDS)[: len(fields)]
    if len(fields) not in cls.WIDTHS or set(fields) != set(names):
      raise ValueError(f"{cls.__name__}.stack needs the fields {names} (chain: both or neither)")
    return jnp.stack([fields[k] for k in names], axis=0 if cls.AXIS == 0 else -1)

  @classmethod
  def positions(cls, *names: str) -> tuple[int, ...]:
    """The positions of `names` on the packed axis (for one scatter over several fields)."""
    return tuple(cls.FIELDS[k] for k in names)

  @classmethod
  def width(cls, chain: bool = False) -> int:
    """The packed axis's size, with the chain features if `chain` (`CacheState.has_chain`)."""
    return cls.WIDTHS[-1] if chain else cls.WIDTHS[0]


class QueueKeys(Packed):
  """`queue_key` rows (`Q_*`): `free`, `pinned` (module docstring)."""

  FIELDS = {"free": Q_FREE, "pinned": Q_PINNED}
  AXIS = 0
  WIDTHS = (NUM_QUEUES,)


class QueueOrder(Packed):
  """`queue_order` rows (`O_*`): `recency`, `rank` (module docstring); none without a
  re-keying eviction policy (`Layout.rekeys`)."""

  FIELDS = {"recency": O_RECENCY, "rank": O_RANK}
  AXIS = 0
  WIDTHS = (0, NUM_ORDER)


class QueueCounts(Packed):
  """Free blocks per queue, last axis in `queue_key`'s row order: `free`, `pinned`
  (`block_pool.free_counts`: i32[NUM_QUEUES], or i32[2, NUM_QUEUES] per pool)."""

  FIELDS = QueueKeys.FIELDS
  WIDTHS = (NUM_QUEUES,)


class BlockAux(Packed):
  """`block_aux` columns (`AUX_*`): `key_step`, `pinned`, `key_end`, with the chain
  features `key_hits`, `chain_start`, with the eviction clock `evict_stamp`, `evict_ranked`,
  and with the access history `key_last`, `key_penult` (module docstring). `NO_KEY`: an
  unkeyed, unpinned block's row at the widest width (`no_key`: at any width)."""

  FIELDS = {
    "key_step": AUX_STEP,
    "pinned": AUX_PINNED,
    "key_end": AUX_END,
    "key_hits": AUX_HITS,
    "chain_start": AUX_CHAIN,
    "evict_stamp": AUX_STAMP,
    "evict_ranked": AUX_RANKED,
    "key_last": AUX_LAST,
    "key_penult": AUX_PENULT,
    "kv_owner": AUX_OWNER,
  }
  WIDTHS = (NUM_AUX, NUM_AUX_CHAIN, NUM_AUX_CLOCK, NUM_AUX_HISTORY)
  NO_KEY = np.zeros(NUM_AUX_HISTORY, np.int32)
  NO_KEY[[AUX_STEP, AUX_END, AUX_CHAIN, AUX_OWNER]] = -1
  NO_KEY.flags.writeable = False

  @classmethod
  def width(cls, chain: bool = False, clock: bool = False, history: bool = False) -> int:
    """Columns with the chain features if `chain` (`CacheState.has_chain`), with the
    eviction clock's too if `clock` (`CacheState.has_clock`; implies `chain`), and with every
    column if `history` (`CacheState.has_history`: the access history after the others)."""
    if history:
      return NUM_AUX_HISTORY
    return NUM_AUX_CLOCK if clock else (NUM_AUX_CHAIN if chain else NUM_AUX)

  @classmethod
  def no_key(cls, chain: bool, clock: bool = False, history: bool = False) -> np.ndarray:
    """i32[width(chain, clock, history)]: an unkeyed, unpinned block's row (the first columns
    of `NO_KEY`)."""
    return cls.NO_KEY[: cls.width(chain, clock, history)]


class IndexEntry(Packed):
  """`index_entry` columns (`IDX_*`): `block`, `seq` (module docstring)."""

  FIELDS = {"block": IDX_BLOCK, "seq": IDX_SEQ}
  WIDTHS = (NUM_IDX,)


class ReqInfo(Packed):
  """`req_info` columns (`INFO_*`): `status`, `computed`, `tokens`, `prompt`, `spb`."""

  FIELDS = {
    "status": INFO_STATUS,
    "computed": INFO_COMPUTED,
    "tokens": INFO_TOKENS,
    "prompt": INFO_PROMPT,
    "spb": INFO_SPB,
  }
  WIDTHS = (NUM_INFO,)


class ReqGroup(Packed):
  """`req_group` columns (`RG_*`): `length`, `ncached`, `last`, and with the chain features
  `chain` (module docstring)."""

  FIELDS = {"length": RG_LEN, "ncached": RG_NCACHED, "last": RG_LAST, "chain": RG_CHAIN}
  WIDTHS = (NUM_RG, NUM_RG_CHAIN)


class Counters(Packed):
  """`counters` entries (`C_*`), named as `CacheState`'s views of them (module docstring)."""

  FIELDS = {
    "head_key": C_HEAD,
    "tail_key": C_TAIL,
    "pin_key": C_PIN,
    "clock": C_STEP,
    "next_seq": C_SEQ,
    "index_overflows": C_OVERFLOW,
    "states_admitted": C_REC_ADMITTED,
    "states_evicted": C_REC_EVICTED,
    "alpha_milli": C_ALPHA_MILLI,
    "states_retired": C_REC_RETIRED,
    "evict_clock": C_EVICT_CLOCK,
    "eviction_weighting": C_WEIGHTING,
    "order_exact": C_ORDER_EXACT,
    "order_lazy": C_ORDER_LAZY,
  }
  AXIS = 0
  WIDTHS = (NUM_COUNTERS,)


class HashLanes(Packed):
  """The lanes of a 64-bit hash array (`HASH_*`, last axis): `lo`, `hi`."""

  FIELDS = {"lo": HASH_LO, "hi": HASH_HI}
  WIDTHS = (HASH_LANES,)


def _view(view: type[Packed], leaf: str, field: str, doc: str) -> property:
  """A read-only `CacheState` property: `field` of `leaf` through `view` (a plain slice)."""
  return property(lambda s: getattr(view(getattr(s, leaf)), field), doc=doc)


@flax.struct.dataclass
class CacheState(ParamViews):
  """The whole cache core state: 16 leaves, and named read-only views of their rows and
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
  queue_order: jax.Array

  # ---- queue_key rows, i32[NB] (BIG = not in that queue)
  free_key = _view(QueueKeys, "queue_key", "free", "i32[NB]: key in vLLM's free queue.")
  pinned_key = _view(QueueKeys, "queue_key", "pinned", "i32[NB]: key in the pinned tier.")

  # ---- queue_order rows, i32[NB] (a re-keying eviction policy only)
  free_recency = _view(QueueOrder, "queue_order", "recency", "i32[NB]: free-queue recency.")
  free_rank = _view(QueueOrder, "queue_order", "rank", "i32[NB]: primary key at last ranking.")

  # ---- block_aux columns, i32[NB]
  key_step = _view(BlockAux, "block_aux", "key_step", "i32[NB]: step the key was registered.")
  pinned = _view(BlockAux, "block_aux", "pinned", "i32[NB]: 1 = pinned (freed to the tier).")
  key_end = _view(BlockAux, "block_aux", "key_end", "i32[NB]: tokens the key covers, -1 = none.")
  key_hits = _view(BlockAux, "block_aux", "key_hits", "i32[NB]: hits on the key (chain only).")
  chain_start = _view(BlockAux, "block_aux", "chain_start", "i32[NB]: chain start (chain only).")

  evict_stamp = _view(BlockAux, "block_aux", "evict_stamp", "i32[NB]: stamp (clock only).")
  evict_ranked = _view(BlockAux, "block_aux", "evict_ranked", "i32[NB]: ranked (clock only).")
  key_last = _view(BlockAux, "block_aux", "key_last", "i32[NB]: last access (history only).")
  key_penult = _view(BlockAux, "block_aux", "key_penult", "i32[NB]: penultimate (history only).")
  kv_owner = _view(BlockAux, "block_aux", "kv_owner", "i32[NB]: KV owner (history only).")

  @property
  def has_chain(self) -> bool:
    """Whether the state carries the chain features' columns (static: `Layout.chain_features`,
    or idle with `Layout.access_history`)."""
    return self.block_aux.shape[-1] >= NUM_AUX_CHAIN

  @property
  def has_clock(self) -> bool:
    """Whether the state carries the eviction clock's columns (static: `Layout.eviction_clock`,
    or with `Layout.access_history`, idle at 0 unless the policy declares the clock too: then
    the clock never rises, as no block is ranked)."""
    return self.block_aux.shape[-1] >= NUM_AUX_CLOCK

  @property
  def has_history(self) -> bool:
    """Whether the state carries the access history's columns (static:
    `Layout.access_history`; the chain and clock columns then exist too, idle)."""
    return self.block_aux.shape[-1] == NUM_AUX_HISTORY

  # ---- index_entry columns, i32[BK, W]
  index_block = _view(IndexEntry, "index_entry", "block", "i32[BK, W]: block, -1 = empty way.")
  index_seq = _view(IndexEntry, "index_entry", "seq", "i32[BK, W]: insertion sequence number.")

  # ---- req_info columns, i32[R]
  req_status = _view(ReqInfo, "req_info", "status", "i32[R]: `STATUS_*` of each slot.")
  req_computed = _view(ReqInfo, "req_info", "computed", "i32[R]: tokens computed (scheduled).")
  req_tokens = _view(ReqInfo, "req_info", "tokens", "i32[R]: tokens known.")
  req_prompt = _view(ReqInfo, "req_info", "prompt", "i32[R]: prompt tokens.")
  req_spb = _view(ReqInfo, "req_info", "spb", "i32[R]: shared-prefix boundary, 0 = none.")

  # ---- req_group columns, i32[R, G]
  group_len = _view(ReqGroup, "req_group", "length", "i32[R, G]: blocks in the table row.")
  group_ncached = _view(ReqGroup, "req_group", "ncached", "i32[R, G]: blocks offered so far.")
  group_last = _view(ReqGroup, "req_group", "last", "i32[R, G]: align's previous state, -1.")
  group_chain = _view(ReqGroup, "req_group", "chain", "i32[R, G]: latest kept state's end.")

  # ---- counters, i32 scalars
  head_key = _view(Counters, "counters", "head_key", "Smallest head-insertion queue key.")
  tail_key = _view(Counters, "counters", "tail_key", "Next free-queue tail key.")
  pin_key = _view(Counters, "counters", "pin_key", "Next pinned-tier key.")
  clock = _view(Counters, "counters", "clock", "Scheduler steps run so far.")
  next_seq = _view(Counters, "counters", "next_seq", "Next index insertion sequence number.")
  index_overflows = _view(Counters, "counters", "index_overflows", "Insertions dropped.")
  states_admitted = _view(Counters, "counters", "states_admitted", "Recurrent keys registered.")
  states_evicted = _view(Counters, "counters", "states_evicted", "Recurrent keys evicted.")
  alpha_milli = _view(Counters, "counters", "alpha_milli", "FLOP-aware alpha in thousandths.")
  states_retired = _view(Counters, "counters", "states_retired", "Recurrent keys retired.")
  evict_clock = _view(Counters, "counters", "evict_clock", "Eviction clock (clock policies).")
  eviction_weighting = _view(
    Counters, "counters", "eviction_weighting", "Eviction `tuned`'s weighting (0 GD, 1 LRU-2)."
  )
  order_exact = _view(
    Counters, "counters", "order_exact", "Free-queue keys below it are in exact order."
  )
  order_lazy = _view(Counters, "counters", "order_lazy", "First key of the lazy region.")


def cdiv(a, b):
  return -(-a // b)


def floor_to(x, m):
  return (x // m) * m
