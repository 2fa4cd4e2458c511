"""Packing of step results and pool counters into one int32 array (one device -> host copy).

`pack_step` lays out, per entry, the scalars `ENTRY_SCALARS`, the per-group vectors
`ENTRY_VECTORS`, the recurrent groups' state slots (`recurrent_slots.state_slots`), the block-table
row and (partial hits) the copy-on-write pairs, then the pool counters row; `unpack_step` is its
inverse, used by `manager.JaxCacheManager`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_cache.config import CacheConfig
from hybrid_cache.core.groups import recurrent_slots
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.layout import layout
from hybrid_cache.core.state import BIG
from hybrid_cache.core.state import CacheState


def stats(lay: Layout, state: CacheState):
  """Pool counters (null block excluded): free, used, free cached, cached per group, pinned."""
  free_mask = jnp.any(state.queue_key < BIG, axis=0)
  keyed = state.block_group >= 0
  num_free = jnp.sum(free_mask).astype(jnp.int32)
  per_group = (
    jnp.zeros((lay.num_groups,), jnp.int32)
    .at[state.block_group]
    .add(keyed.astype(jnp.int32), mode="drop")
  )
  return dict(
    num_free=num_free,
    num_used=state.num_real_blocks - 1 - num_free,
    num_free_cached=jnp.sum(free_mask & keyed).astype(jnp.int32),
    cached_per_group=per_group,
    num_pinned=jnp.sum(state.pinned_key < BIG).astype(jnp.int32),
  )


ENTRY_SCALARS = ("admission", "hit", "spb", "scheduled", "reason", "computed")
ENTRY_VECTORS = ("alone", "hit_blocks", "lens_before", "lens_after")


STATS_SCALARS = ("num_free", "num_used", "num_free_cached", "num_pinned")


def stats_width(num_groups: int) -> int:
  """Columns of a `pack_stats` row: the scalars, then one cached count per group."""
  return len(STATS_SCALARS) + num_groups


def pack_stats(lay: Layout, st) -> jax.Array:
  """i32[stats_width(G)]: the pool counters (`STATS_SCALARS`, then `cached_per_group`) as one
  array (one host transfer)."""
  head = jnp.stack([st[k] for k in STATS_SCALARS])
  return jnp.concatenate([head, st["cached_per_group"]]).astype(jnp.int32)


def unpack_stats(packed) -> dict:
  """Host side of `pack_stats`: a NumPy row or a list of ints in, its entries by name out
  (`cached_per_group`: the rest of the row, of the same type)."""
  out = {k: packed[i] for i, k in enumerate(STATS_SCALARS)}
  out["cached_per_group"] = packed[len(STATS_SCALARS) :]
  return out


LOOKUP_SCALARS = ("hit", "spb")


def pack_lookup(lk) -> jax.Array:
  """i32[2 + 2G]: a `coordinator.lookup` result for the host: `LOOKUP_SCALARS` (hit tokens,
  shared-prefix boundary), then per group the hit alone (`alone`) and the hit blocks."""
  return jnp.concatenate(
    [
      jnp.stack([lk[k] for k in LOOKUP_SCALARS]),
      lk["alone"],
      jnp.sum(lk["hit_mask"], axis=1).astype(jnp.int32),
    ]
  )


def unpack_lookup(packed, num_groups: int) -> dict:
  """Host side of `pack_lookup`: ints `hit`, `spb`; tuples `alone`, `hit_blocks` (per group)."""
  p = [int(x) for x in np.asarray(packed)]
  s = len(LOOKUP_SCALARS)
  out = {k: p[i] for i, k in enumerate(LOOKUP_SCALARS)}
  out["alone"] = tuple(p[s : s + num_groups])
  out["hit_blocks"] = tuple(p[s + num_groups : s + 2 * num_groups])
  return out


def entry_slots(lay: Layout, out) -> jax.Array:
  """i32[SLOT_WIDTH R]: per recurrent group (`lay.recurrent_groups` order) the
  `recurrent_slots.state_slots` of the entry's scheduled chunk [computed - scheduled, computed)
  in its block-table row."""
  n = out["scheduled"]
  start = out["computed"] - n
  return jnp.concatenate(
    [
      recurrent_slots.state_slots(lay.groups[g], out["row"][g], start, n)
      for g in lay.recurrent_groups
    ]
    or [jnp.zeros((0,), jnp.int32)]
  )


def pack_entry(lay: Layout, out) -> jax.Array:
  """i32[K]: one entry's outputs (`step.schedule_entry`) in one row (columns: `unpack_step`)."""
  cols = [out[k].astype(jnp.int32)[None] for k in ENTRY_SCALARS]
  cols += [out[k].astype(jnp.int32) for k in ENTRY_VECTORS]
  cols.append(entry_slots(lay, out))
  cols.append(out["row"].reshape(-1))
  if "cows" in out:
    cols.append(out["cows"].reshape(-1))
  return jnp.concatenate(cols)


def pack_step(lay: Layout, body, st) -> jax.Array:
  """i32[E + 1, K]: the entries' packed rows (`pack_entry`), the pool counters last."""
  tail = jnp.zeros((1, body.shape[1]), jnp.int32)
  stats_row = pack_stats(lay, st)
  tail = tail.at[0, : stats_row.shape[0]].set(stats_row)
  return jnp.concatenate([body, tail], axis=0)


@dataclasses.dataclass(frozen=True)
class EntryColumns:
  """Where `pack_entry` puts each output in an entry's row (G groups, MB blocks per table,
  R recurrent groups).

  `scalars` holds `ENTRY_SCALARS` in order; then one G-vector per `ENTRY_VECTORS` name
  (`alone` = each group's hit looked up alone, `hit_blocks`, `lens_before`, `lens_after`); then
  the [R, 4] state slots (`entry_slots`: read, write, first checkpoint column, checkpoint
  count); then the [G, MB] block-table row; then, with partial hits, the [G, 2] copy-on-write
  (source, copy) pairs (`cow_sources`, `cow_copies`: each one per group).
  """

  num_groups: int
  max_blocks: int
  partial: bool
  num_recurrent: int = 0

  @property
  def scalars(self) -> slice:
    return slice(0, len(ENTRY_SCALARS))

  def scalar(self, name: str) -> int:
    """The column of scalar `name` (`ENTRY_SCALARS`)."""
    return self.scalars.start + ENTRY_SCALARS.index(name)

  def vector(self, name: str) -> slice:
    start = len(ENTRY_SCALARS) + ENTRY_VECTORS.index(name) * self.num_groups
    return slice(start, start + self.num_groups)

  @property
  def slots(self) -> slice:
    start = len(ENTRY_SCALARS) + len(ENTRY_VECTORS) * self.num_groups
    return slice(start, start + recurrent_slots.SLOT_WIDTH * self.num_recurrent)

  @property
  def row(self) -> slice:
    start = self.slots.stop
    return slice(start, start + self.num_groups * self.max_blocks)

  @property
  def cows(self) -> slice:
    start = self.row.stop
    return slice(start, start + 2 * self.num_groups if self.partial else start)

  @property
  def cow_sources(self) -> slice:
    """Each group's copy-on-write source (0 = none): the first of its pair in `cows`."""
    return slice(self.cows.start, self.cows.stop, 2)

  @property
  def cow_copies(self) -> slice:
    """Each group's copy-on-write copy (0 = none): the second of its pair in `cows`."""
    return slice(self.cows.start + 1, self.cows.stop, 2)

  @property
  def width(self) -> int:
    """K, the columns of an entry's row."""
    return self.cows.stop


def entry_columns(lay: Layout) -> EntryColumns:
  return EntryColumns(lay.num_groups, lay.max_blocks, lay.partial, len(lay.recurrent_groups))


def unpack_step(config: CacheConfig, packed) -> tuple[dict, dict]:
  """Host side of the packed `schedule_step` output: (per-entry dict of arrays, stats)."""
  lay = layout(config)
  cols = entry_columns(lay)
  p = np.asarray(packed)
  body, g, n = p[:-1], lay.num_groups, p.shape[0] - 1
  out = {k: body[:, cols.scalar(k)] for k in ENTRY_SCALARS}
  out.update({k: body[:, cols.vector(k)] for k in ENTRY_VECTORS})
  out["slots"] = body[:, cols.slots].reshape(n, cols.num_recurrent, recurrent_slots.SLOT_WIDTH)
  out["row"] = body[:, cols.row].reshape(n, g, lay.max_blocks)
  if lay.partial:  # [n, G, 2] (source, copy) pairs, and each by name
    out["cows"] = body[:, cols.cows].reshape(n, g, 2)
    out["cow_source"], out["cow_copy"] = body[:, cols.cow_sources], body[:, cols.cow_copies]
  return out, unpack_stats(p[-1, : stats_width(g)])
