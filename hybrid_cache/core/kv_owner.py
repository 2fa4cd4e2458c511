"""KV owners: which recurrent state each full-attention block was kept for.

Why. In a hybrid model a hit needs a recurrent state at its boundary and every KV block before
it. The simulator's unit cache (`hybrid_cache/sim/checkpoint_cache.py`, Marconi's radix tree,
M§1.4) evicts a checkpoint together with its leaf KV, the span back to the checkpoint above
it: a chain lives or dies as one unit. The cache core evicts blocks one by one, so a policy
that ranks each block by its own history (LRU-2, `policies/lru2.py`) keeps a chain's KV while
its state is gone (KV no state can use) and drops KV a kept state needs (the state is then
dead, `eviction.dead_states`). Measured on real ShareGPT (seed 0, 2e9 bytes, marconi_7b,
64-token pages, `adaptive` placement and `superseded` retirement): LRU-2 per block saves
3.56e15 FLOPs, with owners 6.63e15 (the unit cache's LRU-2: 6.71e15).

Rule. When a request finishes (after its retirement, `release.release`), each of its
full-attention blocks still keyed under its own prefix (a lookup of its own tokens,
`coordinator.probe_all`) records as its owner (`CacheState.kv_owner`) the request's nearest
kept state at or after the block: the block found for the request's key in the first recurrent
group at the smallest position whose state ends at or after the KV block's end. That is the
checkpoint whose unit holds this KV in the unit cache (the leaf's span back to the checkpoint
above, or an interior checkpoint's own span). A later finishing request through the same
block overwrites it (the latest chain wins). A key registration or drop resets it to -1.

How an eviction policy reads it (`owned_priority`): a candidate full-attention block whose
owner still holds a key in a recurrent group ranks as the later of its own priority and its
owner's (a chain's KV goes no earlier than its state); one whose owner has lost its key ranks
0 (first, least recently freed first): KV whose state is gone. So does a full-attention block
without an owner: no finished request kept a state at or after it (KV past a request's deepest
kept state, or of a request that kept none), so no hit can end past it until a later request
computes it again and keeps a state there; the unit cache drops such KV at once (KV past the
last checkpoint, `checkpoint_cache.py` module doc). Measured with `lru2` (real ShareGPT,
`adaptive` placement, `superseded` retirement, 64-token pages; FLOPs saved 1e15): seed 2 at
3e9 bytes 7.903 -> 7.948, seed 0 at 2e9 6.691 -> 6.714, seed 1 at 2e9 7.287 -> 7.452, seed 2
at 2e9 6.156 -> 6.176 (ranked by their own priority before). Other groups' blocks (sliding
window) keep their own priority.

Deviations from the unit cache: one owner per block (the latest finished request's), so a
KV block shared by two chains follows the one that finished last and may go with it while
the other chain's state still needs it (that state is then dead and goes first); the owner is
a block id, so an owner evicted and re-keyed as another state in the same group counts as
alive. Twin: `hybrid_cache/twin/kv_owner.py` (same rule, same integers).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.core import coordinator
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.state import BIG
from hybrid_cache.core.state import BlockAux
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import ReqInfo


def record(lay: Layout, state: CacheState, slot, enabled=True) -> CacheState:
  """`kv_owner` of finishing request `slot`'s full-attention blocks (module doc); nothing
  where `enabled` (bool, traced or not) is False or without a recurrent or full-attention
  group. Reads the request's hashes and token count: call before they are cleared."""
  if not lay.recurrent_groups or not lay.prefix_groups:
    return state
  found = coordinator.probe_all(
    lay, state, state.req_hashes[slot], ReqInfo(state.req_info[slot]).tokens
  )
  rg = lay.recurrent_groups[0]
  bsr = lay.groups[rg].block_size
  mb = lay.max_blocks
  pos = jnp.arange(mb)
  # per recurrent position: the first kept state at or after it (BIG = none)
  kept_at = jnp.where(found[rg] > 0, pos, BIG)
  next_kept = jnp.flip(jax.lax.cummin(jnp.flip(kept_at)))
  aux = state.block_aux
  for g in lay.prefix_groups:
    bs = lay.groups[g].block_size
    first = jnp.minimum(((pos + 1) * bs + bsr - 1) // bsr - 1, mb - 1)
    q = next_kept[first]
    owner = found[rg, jnp.minimum(q, mb - 1)]
    kv = found[g]
    ok = (q < BIG) & (kv > 0) & enabled
    aux = BlockAux(aux)[jnp.where(ok, kv, lay.num_blocks)].set(kv_owner=owner, mode="drop")
  return state.replace(block_aux=aux)


def owned_priority(lay: Layout, state: CacheState, own: jax.Array, owner: jax.Array) -> jax.Array:
  """i32[NB]: `own` (a policy's priority per block) with full-attention blocks ranked by
  their owner (module doc): max(own, own[owner]) while the owner holds a recurrent key, else 0
  (owner lost its key, or none). Other blocks: `own`. Without a recurrent or a full-attention
  group (no owners are recorded): `own`. `owner` i32[NB] (`FreeBlocks.owner`)."""
  if not lay.recurrent_groups or not lay.prefix_groups:
    return own
  rec = jnp.isin(state.block_group, jnp.asarray(lay.recurrent_groups, jnp.int32))
  full = jnp.isin(state.block_group, jnp.asarray(lay.prefix_groups, jnp.int32))
  o = jnp.maximum(owner, 0)
  alive = full & (owner >= 0) & rec[o]
  return jnp.where(alive, jnp.maximum(own, own[o]), jnp.where(full, 0, own))
