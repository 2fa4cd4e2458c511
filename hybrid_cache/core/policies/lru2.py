"""Eviction `lru2`: LRU-2 over the free blocks, by the step of each key's penultimate access.

Source: LRU-K with K = 2 (O'Neil, O'Neil & Weikum, SIGMOD'93, "The LRU-K page replacement
algorithm": evict the page whose second-to-last reference is oldest), as the simulator's unit
cache runs it (`hybrid_cache/sim/chain_eviction.py` with `penultimate=True`, `NO_HISTORY`;
`hybrid_cache/sim/checkpoint_cache.py`: the inherited access `UnitCache._take_hit`, the
retained history `lastref` read by `_insert`, the history a retirement hands on `_retire`).
Ported to the cache core's eviction seam with the access history (`Reads(history=True)`).

Rule. Every keyed block has two access times in scheduler steps (`CacheState.clock`):
`key_last` and `key_penult`. A hit on the block (each block of an admitted hit, the event that
counts `key_hits`) is an access: penult = last, last = now. Registering a key is one: last =
now, penult = the access before it the key inherits, the later of two (0 = none):
* the request's (`core.access_history`, rule of the sim's `_take_hit`): at its admission the
  block serving its hit (per recurrent group its deepest hit block, the state it resumes from;
  without one, per full-attention group its deepest hit block) was accessed, and the request
  keeps that block's previous access (its penult after the hit; 0 without a hit) for every key
  it registers, state and attention blocks alike (the sim's checkpoint owns its KV): a chat
  turn's new blocks continue the history of the chain they extend;
* the key's ghost (LRU-K's retained history, the sim's `lastref` kept after an eviction): a
  dropped key (evicted, retired, its partial key replaced, over a byte budget) leaves its last
  access in a bounded direct-mapped table (2^14 entries per group, `access_history`), and a
  key registered again whose entry's tag matches takes it: a point placed again is not new.
A candidate's priority is its penult (`FreeBlocks.penult`), lower evicted first, ties least
recently freed first (the frame's rule, `hybrid_cache.core.eviction`). So blocks without an
earlier access go first, in LRU order, then the others by their penultimate access: a block
touched twice recently outlives a burst of blocks touched once since (LRU-2's resistance to
scans), and a chain hit every few turns outlives one hit once.

History inheritance at retirement (`core.release.retire`, whenever the state carries the
history): when a finishing request retires recurrent states its own deeper checkpoints
supersede, the state of its chain that a lookup of its own tokens reaches (position h - 1, h =
the units hit) takes penult = max(its own, the largest of the retired states' in its group), if
it still carries that key (the sim's `_retire`). With the request's inherit this mostly hands on
what the new state already has; it matters where a retired state had a later access.

Chains (`core.kv_owner`): a full-attention block ranks by the state it was kept for, the
nearest kept state at or after it of the last finished request through it: max(its penult,
its owner's) while the owner holds a key, 0 (first) once the owner lost it or without one
(KV past every kept state). So a chain's KV goes with its state, as the unit cache evicts a
checkpoint with its leaf KV. Without it LRU-2
per block kept KV no state could use and dropped KV kept states needed: real ShareGPT seed 0,
2e9 bytes, 64-token pages, `adaptive` placement, `superseded` retirement: 3.56e15 FLOPs saved
per block, 6.68e15 with owners (the unit cache's LRU-2 6.71e15, its `adaptive` 6.56e15).

Deviations from the simulator's unit cache:
* The unit is a block, not a checkpoint with its leaf KV (the owners above stand in for it):
  every block of a hit (attention KV and the state at its end) is accessed, not only the
  deepest checkpoint serving the hit.
* A key without an earlier access has penult 0 (ties then least recently freed first); the
  sim gives a checkpoint of a request without a hit `now - NO_HISTORY` (by placement time).
* A re-registered key takes the later of its ghost and the request's inherit (the sim: the
  ghost alone). The ghosts are a bounded table: a collision keeps the later (last, tag) and
  loses the other ghost; an 18-bit tag may match another key's ghost (2^-18 per meeting).
* Time is the scheduler step (`clock`, several requests per step), not a count of lookups.
* Timing: priorities are ranked once per scheduler step (`eviction.prepare`); a block freed
  after the ranking goes to the queue's tail, after every ranked one.

Reads the access history (with the KV owners) alone (`Reads(history=True)`): no cost fields,
chain features or clock. Twin: `hybrid_cache/twin/policies/lru2.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.core import kv_owner
from hybrid_cache.core.eviction import FreeBlocks
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.state import CacheState


def priority(lay: Layout, state: CacheState, blocks: FreeBlocks) -> jax.Array:
  """i32[NB]: each candidate's penultimate access step (0 = none), clipped to the frame's
  priority range [0, 2^30] (steps stay far below it)."""
  own = jnp.clip(blocks.penult, 0, 1 << 30)
  return kv_owner.owned_priority(lay, state, own, blocks.owner)
