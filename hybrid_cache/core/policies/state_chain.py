"""Retention `state_chain`: a finishing request pins only what a hybrid hit can use.

SPEC B1 (`prefix`, the built-in rule) pins every keyed full-attention block of a finished
request, the last window of each sliding-window group and each recurrent group's deepest
keyed state. In a hybrid model a hit needs a recurrent state exactly at its end, so the KV past
the deepest kept state cannot be hit before a later request recomputes that state: pinning it
spends the pinned tier on dead weight. `state_chain` keeps the recurrent rule and cuts the
attention groups at E, the deepest position where a state of the request is kept: the larger
of the prompt's last boundary floored to the hit alignment, floor((P - 1) / align) * align
(where vLLM's align mode keeps the state a continuation resumes from, §2.4.7; that block has
usually been freed, keyed, by the time the request finishes) and the token end of the
deepest keyed state the request still holds. Full attention pins its keyed blocks ending at
or before E, a sliding-window group the keyed blocks of the `swa_need` positions ending at the
block holding E. Twin: `hybrid_cache/twin/policies/state_chain.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.core import groups
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import ReqInfo
from hybrid_cache.core.state import floor_to


def pin(lay: Layout, state: CacheState, slot, keyed, default) -> list[jax.Array]:
  """Per group, bool[MB]: the blocks of request `slot` to pin (`keyed`: its keyed held blocks,
  `default`: SPEC B1's masks, both lists of bool[MB] in group order)."""
  pos = jnp.arange(lay.max_blocks)
  end = floor_to(jnp.maximum(ReqInfo(state.req_info)[slot].prompt - 1, 0), lay.hit_align)
  for g in lay.recurrent_groups:
    bs = lay.groups[g].block_size
    end = jnp.maximum(end, (jnp.max(jnp.where(keyed[g], pos, -1)) + 1) * bs)
  out = []
  for g, spec in enumerate(lay.groups):
    kind = groups.rules(spec)
    last = end // spec.block_size - 1  # the block holding the state's end, -1 = none
    if kind.RECURRENT:
      out.append(default[g])
    elif kind.KEEPS_PREFIX:  # full attention: the whole prefix up to E
      out.append(keyed[g] & (pos <= last))
    else:  # sliding window: the window ending at E
      out.append(keyed[g] & (pos <= last) & (pos > last - spec.swa_need))
  return out
