"""Eviction `lru2`: LRU-2 over the free blocks, by the step of each key's penultimate access.

Source: LRU-K with K = 2 (O'Neil, O'Neil & Weikum, SIGMOD'93, "The LRU-K page replacement
algorithm": evict the page whose second-to-last reference is oldest), as the simulator's unit
cache runs it (`hybrid_cache/sim/chain_eviction.py` with `penultimate=True`, and the history a
retirement hands on, `hybrid_cache/sim/checkpoint_cache.py` `UnitCache._retire`). Ported to the
cache core's eviction seam with the access history (`Reads(history=True)`).

Rule. Every keyed block has two access times in scheduler steps (`CacheState.clock`):
`key_last` and `key_penult`. Registering a key is an access: last = now, penult = 0 (none
before). A hit on the block (each block of an admitted hit, the event that counts `key_hits`)
is one: penult = last, last = now. A candidate's priority is its penult (`FreeBlocks.penult`),
lower evicted first, ties least recently freed first (the frame's rule,
`hybrid_cache.core.eviction`). So blocks accessed once go first, in LRU order, then the others
by their penultimate access: a block touched twice recently outlives a burst of blocks touched
once since (LRU-2's resistance to scans), and a chain hit every few turns outlives one hit once.

History inheritance (`core.release.retire`, whenever the state carries the history): when a
finishing request retires recurrent states its own deeper checkpoints supersede, the state of
its chain that a lookup of its own tokens reaches (position h - 1, h = the units hit) takes
penult = max(its own, the largest of the retired states' in its group), if it still carries
that key. A chat session's chain keeps its history: turn N+1 hits turn N's end state (penult =
turn N's registration step after the hit), and at turn N+1's finish that state is retired and
its penult passes to the new deepest state, which would otherwise have none.

Deviations from the simulator's unit cache:
* The unit is a block, not a checkpoint with its leaf KV: every block of a hit (attention KV
  and the state at its end) is accessed, not only the deepest checkpoint serving the hit.
* A key registered without an earlier access has penult 0: the sim gives a checkpoint placed
  by a request with a hit the previous access of the checkpoint that served the hit (the chain
  was last used then), and one without a hit `now - NO_HISTORY`; here only retirement hands a
  history on, and keys accessed once tie at 0 (then least recently freed first; the sim orders
  them by placement time, the same order but for blocks freed out of placement order).
* Time is the scheduler step (`clock`, several requests per step), not a count of lookups;
  the sim keeps the last access of an evicted checkpoint (a point placed again is not new),
  the core drops a key's history with the key.
* Timing: priorities are ranked once per scheduler step (`eviction.prepare`); a block freed
  after the ranking goes to the queue's tail, after every ranked one.

Reads the access history alone (`Reads(history=True)`): no cost fields, chain features or
clock. Twin: `hybrid_cache/twin/policies/lru2.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.core.eviction import FreeBlocks
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.state import CacheState


def priority(lay: Layout, state: CacheState, blocks: FreeBlocks) -> jax.Array:
  """i32[NB]: each candidate's penultimate access step (0 = none), clipped to the frame's
  priority range [0, 2^30] (steps stay far below it)."""
  del lay, state
  return jnp.clip(blocks.penult, 0, 1 << 30)
