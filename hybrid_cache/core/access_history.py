"""The access history's own columns (eviction `lru2`, `Layout.access_history`): each request
slot's inherited access and the retained history of dropped keys (LRU-K's ghosts).

Source: the simulator's unit cache with an access history (`hybrid_cache/sim/checkpoint_cache.py`:
`UnitCache._take_hit` sets `_inherit`, `_insert` gives a placed checkpoint the previous access
of the checkpoint that served its request's hit, or the last access its point had before it
was evicted, `lastref`, kept after the eviction) and LRU-K's "retained information" about
evicted pages (O'Neil, O'Neil & Weikum, SIGMOD'93, section 2.1.3). Twin:
`hybrid_cache/twin/access_history.py` (the same integers).

Inherit. At a request's admission (`allocate.allocate_slots`) the block serving its hit (per
recurrent group the deepest hit block, the state the request resumes from; without a
recurrent group, per full-attention group the deepest hit block) is accessed as every hit
block is (penult = its last, last = now); the slot remembers `inherit` = the largest of those
blocks' penultimate access after the update (their access before this hit; 0 without a hit).
Every key the request registers from then on (state and attention blocks: the simulator's
checkpoint owns its KV) takes penult = max(inherit, its ghost below), last = now. A released
slot's inherit is 0.

Ghosts. When a key is dropped (evicted from the free queue, retired, its partial key replaced
by a full one, evicted by a byte budget: `block_index.evict`, `evict_ids`) its last access is
kept in a direct-mapped table of `TABLE` entries per group: entry g * TABLE + (low lane &
(TABLE - 1)), tag = low lane >> TABLE_BITS (18 bits), value its last access. A write keeps the
larger (last, tag) of the entry and the written ghost, lexicographically (a batch of drops is
order-free: one scatter-max of the lasts, one of the tags among the winners), so an entry holds
the most recently accessed of the keys that met in it. A registered key whose tag matches its
entry recalls that last access (`recall`; 0 otherwise). Deviations from the simulator, whose
`lastref` is exact and unbounded: a collision loses a ghost (the older one), and an entry is not
cleared when its key is registered again (it keeps the key's last access before the eviction,
until a later access of a key that meets it replaces it); a re-registered key takes the larger
of its ghost and the request's inherit (the simulator takes the ghost alone).

TABLE_BITS = 14: 16,384 ghosts per group. On real ShareGPT at 2e9 bytes (marconi_7b, 64-token
pages) the pool holds 477 pages and 74 state slots, the whole replay registers ~2,400 states
and ~20,000 attention pages: the table holds every state ever dropped and the most recent
~30x the attention pool, so the ghosts a session's next turn needs (dropped within the few
hundred requests between turns) are rarely lost; 2^12 would hold under 9x the pool.

Columns (`CacheState.policy_state` row 0, after every other policy's columns:
`fresh_state.policy_columns`; the leaf has at least one row with the history): per request
slot its inherit, then per group `TABLE` tags, then per group `TABLE` lasts (0 = empty).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.core.state import CacheState

TABLE_BITS = 14
TABLE = 1 << TABLE_BITS


def width(max_requests: int, num_groups: int) -> int:
  """Columns of the history in `policy_state`: an inherit per slot, a tag and a last per
  group entry."""
  return max_requests + 2 * num_groups * TABLE


def _base(state: CacheState) -> tuple[int, int, int]:
  """(inherit, tag, last) column offsets of the history, the last columns of `policy_state`
  (read off the static shapes: `tables` is [R, G, MB])."""
  r, g = state.tables.shape[:2]
  off = state.policy_state.shape[1] - width(r, g)
  return off, off + r, off + r + g * TABLE


def _entry(keys: jax.Array, groups: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(entry i32[k], tag i32[k]) of keys u32[k, 2] in groups i32[k] (>= 0)."""
  lo = keys[:, 0]
  entry = groups * TABLE + (lo & jnp.uint32(TABLE - 1)).astype(jnp.int32)
  return entry, (lo >> TABLE_BITS).astype(jnp.int32)


def inherit(state: CacheState, slot) -> jax.Array:
  """i32: request `slot`'s inherited access (0 = none)."""
  return state.policy_state[0, _base(state)[0] + slot]


def set_inherit(state: CacheState, slot, value) -> CacheState:
  """The state with request `slot`'s inherited access set to `value`."""
  col = _base(state)[0] + slot
  return state.replace(policy_state=state.policy_state.at[0, col].set(value))


def record(state: CacheState, ids: jax.Array, grp: jax.Array | None = None) -> CacheState:
  """Keeps the ghosts of blocks `ids` (i32[k], 0 = none) that carry a key, before their keys
  are dropped: entry (group, low lane) <- the larger (last, tag) of it and each ghost (module
  doc). `grp` (optional i32[k]): the caller's `block_group[ids]`."""
  _, t0, l0 = _base(state)
  ps = state.policy_state
  safe = jnp.maximum(ids, 0)
  if grp is None:
    grp = state.block_group[safe]
  ok = (ids > 0) & (grp >= 0)
  entry, tag = _entry(state.block_hash[safe], jnp.maximum(grp, 0))
  last = state.key_last[safe]
  drop = ps.shape[1]  # an out-of-range column: dropped
  old = ps[0, l0 + entry]
  ps = ps.at[0, jnp.where(ok, l0 + entry, drop)].max(last, mode="drop")
  top = ps[0, l0 + entry]  # each entry's largest last, old or new
  # the entry's tag: the largest among the ghosts with that last (the old one's included
  # unless a written ghost has a later last: then cleared first, to -1)
  ps = ps.at[0, jnp.where(ok & (top > old), t0 + entry, drop)].set(-1, mode="drop")
  return state.replace(
    policy_state=ps.at[0, jnp.where(ok & (last == top), t0 + entry, drop)].max(tag, mode="drop")
  )


def recall(state: CacheState, keys: jax.Array, groups: jax.Array) -> jax.Array:
  """i32[k]: the ghost's last access of each key (u32[k, 2] in groups i32[k]) whose tag
  matches its entry, else 0."""
  _, t0, l0 = _base(state)
  entry, tag = _entry(keys, jnp.maximum(groups, 0))
  row = state.policy_state[0]
  return jnp.where((groups >= 0) & (row[t0 + entry] == tag), row[l0 + entry], 0)
