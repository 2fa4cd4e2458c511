"""Admission `second_sighting`: a recurrent state is registered only once its prefix recurs.

Marconi (MLSys'25) admits a state only where it expects reuse; the simplest such rule is to
cache a prefix's state the second time any request computes it: the first request leaves a mark,
a later one that computes the same prefix again registers the state, and the one after that
hits. It trades the hits of prefixes seen exactly twice for fewer one-off states in the pool
(vLLM issue #45238 reports the cost of this "third sighting" for agents).

The marks are a table of `STATE_SIZE` bits per recurrent group (`CacheState.policy_state`
i32[R, STATE_SIZE]), indexed by the low `TABLE_BITS` bits of the block's key (its prefix hash,
low lane): distinct prefixes may share a mark (a false "seen", never a false "unseen"). The
twin (`hybrid_cache/twin/policies/second_sighting.py`) keeps the same table.
"""

from __future__ import annotations

import jax.numpy as jnp

from hybrid_cache.core.layout import Layout

TABLE_BITS = 12
STATE_SIZE = 1 << TABLE_BITS  # marks per recurrent group


def admit(lay: Layout, table, g: int, keys, candidates):
  """(table', bool[MB]): which candidates are admitted, and the marks after this request.

  `table` i32[R, STATE_SIZE] (R = `lay.recurrent_groups`); `keys` u32[MB, 2] group g's block
  keys; `candidates` bool[MB]: the blocks this request offers, in block order. A candidate is
  admitted iff its mark was set before it was offered: by an earlier request, or by an earlier
  candidate of this request with the same mark. Every candidate sets its mark.
  """
  row = lay.recurrent_groups.index(g)
  slot = (keys[:, 0] & jnp.uint32(STATE_SIZE - 1)).astype(jnp.int32)
  pos = jnp.arange(slot.shape[0])
  earlier = (slot[:, None] == slot[None, :]) & candidates[None, :] & (pos[None, :] < pos[:, None])
  seen = (table[row, slot] > 0) | jnp.any(earlier, axis=1)
  marks = table[row].at[jnp.where(candidates, slot, STATE_SIZE)].set(1, mode="drop")
  return table.at[row].set(marks), seen
