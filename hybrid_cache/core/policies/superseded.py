"""Retirement `superseded`: a finishing request drops the keys of the recurrent states its own
deeper checkpoints supersede, while superseded states are rarely used again.

Source: the simulator's retirement (`hybrid_cache/sim/checkpoint_cache.py`, module doc
"Retirement", `UnitCache._retire`) decided by `hybrid_cache/sim/adaptive_stats.py`
`SupersessionStats`, ported to the cache core's retirement seam (issue 28, item 1: the
retirement part). Twin: `hybrid_cache/twin/policies/superseded.py` (exactly the same integers).

What is retired. At the finish (not the preemption) of request r, for each recurrent group g of
block B: let e = 1 + the deepest position of a state block r kept that was new (not yet a
point, below) when it kept it, over all of r's registration calls (0 = none), bounded by what a
lookup of r's own tokens hits now, h (`coordinator.lookup` at the finish, in units of B): e =
min(e, h). A state supersedes only if a lookup can reach it: a state kept past the attention's
keys (with fine keys, one in an output's partly filled page) cannot, and the shallower hittable
state it would supersede is the chain's deepest reachable one (the simulator's unit cache keeps
KV at every unit, so there every checkpoint is reachable; without this bound retirement cost 4%
on real ShareGPT at B = 512, U = 64, and gains 1.5% with it, 2026-11-29).
Every position p < e - 1 of r's chain (its own key at p, `coordinator.group_hashes`) whose
state block the index finds (`block_index.probe`: the block a lookup hits) is retired when the
block's own (primary) key is that key in g, it is free (ref 0: no running request holds it; in
the normal queue or the pinned tier, SPEC B1: a superseded state pinned at an earlier finish is
unpinned), and its mark (below) does not say "keep". A chat session's turn N+1 hits turn N's
end state and extends it: turn N's end state (and any state above it left by an earlier turn)
goes, the new deepest one stays. Retiring = the block's keys dropped (un-hittable) and the
block moved to the free queue's head, as vLLM frees an unkeyed block (`block_pool.to_head`,
`release.retire`): it is the first to be reused. The slot's decision and e are then cleared.

Example (B = 4, mode all, retirement decided on): turn 1 (9 tokens) keeps states 4 and 8
(positions 0, 1; e = 2) and at its finish retires 4; turn 2 (turn 1's 8 tokens + 9) hits 8,
keeps 12 and 16 (e = 4) and at its finish retires 8 and 12 (position order, 8 in front at the
queue's head); 16 stays, and so does all the attention KV
(`tests/hybrid_cache/retirement_policy_test.py`). Only recurrent state
blocks are retired; the attention KV of the chain stays (it is the deeper chain's prefix), as
in the simulator, which drops a superseded checkpoint's state only.

The decision (`SupersessionStats`), per recurrent group, taken at r's admission from the
statistics as of then (kept for r's slot): retire iff the decayed count of supersessions
`SUP` >= `MIN_OBS` and the share of them used again (USED + 1) / (SUP + 2) < 1/10, in fixed
point (counts times `SCALE`): 10 * USED + 8 * SCALE < SUP. The statistics are counted on
marks of what was ever kept (the simulator's trie "as if every candidate point were kept"),
not on what the index still holds, so retiring does not hide the reuses that would turn it
off:

- Points. Every state block a request keeps (placement's mask, `cache_keys.cache_blocks`'
  `offered`) is marked a point in a direct-mapped table of `TABLE` entries per recurrent group,
  indexed by the low `TABLE_BITS` bits of its key's low lane and tagged by the remaining 16
  bits (as `adaptive`'s marks): value tag * 16 + flags, flags `POINT` 1, `OPEN` 2
  (superseded, not used since), `KEEP` 4 (never retire), `CHILD` 8 (some request computed the
  block after this one); 0 = empty. Writing flags to an entry whose tag differs replaces it
  (the new tag and those flags only); in one call, per table entry, the block at the largest
  position writes (its points and the parents of its computed blocks).
- A supersession. In each registration call, e_call = 1 + the deepest position this call keeps
  that was not a point; then every point at a position < e_call - 1 of r's chain that is not
  open becomes open, and SUP += SCALE each (r's own shallower points included, as the
  simulator marks the candidates before it counts).
- A use. At r's admission (decay first: x -> x - x // 200 for SUP and USED, 0.995 per request),
  q = 1 + the deepest position < (tokens - 1) // B whose key is a point (r's hit if every point
  were kept). If that point is open: USED += SCALE, it is closed and marked `KEEP` (the
  simulator's `SeenTrie.reused_from`: a point reused after a supersession, e.g. a shared
  system prompt's state, is never retired from then on).
- A branch. At r's admission, with seen = max(hit, spb) // B units shared with the cache
  (`adaptive`'s divergence: 0 < seen < (tokens - 1) // B), the key at seen - 1 is marked
  `KEEP` if it is marked `CHILD`: another request computed a block after it and r continues
  differently, so that point now has two children (the simulator retires only checkpoints
  with a single present child). A request extending a chain's end (a chat turn) is no branch.

Deviations from the simulator, which walks a trie of everything seen and knows a request's
whole placement at once: the marks are a bounded table (a collision loses a mark); a branch is
a sticky mark (the simulator reads the present children at each retirement, eviction may make
a branch single again); e_call is per registration call, so the hit q does not bound e (the
simulator takes only points deeper than q); r's whole chain above e is scanned, not only the
segment the simulator's path array holds (the same set: r's path); a preempted request's
re-admission counts as a new request (its own earlier points are then points, not new); the
index's duplicates other than the one a lookup hits are not retired; the points are the state
blocks the placement keeps as they are computed (the simulator places a request's points at
once, before its lookup); the counts are fixed point (2^-10), not floats.

Policy state (`CacheState.policy_state`, the retirement's own columns after the admission's
and a stateful placement's: `state_size`), per recurrent group row, i32: `SUP`, `USED` (fixed
point, `SCALE` = 2^10; SUP saturates at `SAT` = 2^30 so every sum below fits int32), the
`TABLE` marks, then per request slot its decision (0/1), then per slot its e (from
`deepest_col`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.core import block_index
from hybrid_cache.core import coordinator
from hybrid_cache.core.cache_keys import PlacementRequest
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.state import BIG
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import ReqInfo

SCALE = 1 << 10  # fixed point of the decayed counts
SAT = 1 << 30  # SUP saturates here (10 * USED + 8 * SCALE and SUP + SCALE * MB stay in int32)
DECAY_DIV = 200  # one admission decays the counts by x // 200 (0.995)
MIN_OBS = 16  # supersessions (decayed) before retiring
TABLE_BITS = 16  # 65,536 marks per recurrent group: why, `policies/adaptive.py` TABLE_BITS
TABLE = 1 << TABLE_BITS  # marks per recurrent group
POINT, OPEN, KEEP, CHILD = 1, 2, 4, 8  # mark flags (value = tag * 16 + flags)
SHIFT = 4
# columns of a recurrent group's row
SUP, USED = 0, 1
MARKS = 2  # TABLE columns
DECISIONS = MARKS + TABLE  # one decision per request slot, then one e per slot (`deepest_col`)


def state_size(lay: Layout) -> int:
  """Columns per recurrent group in `policy_state`: counts, marks, a decision and e per slot."""
  return DECISIONS + 2 * lay.max_requests


def deepest_col(lay: Layout) -> int:
  """The first of the per-slot e columns."""
  return DECISIONS + lay.max_requests


def should_retire(sup, used) -> jax.Array:
  """bool: `SupersessionStats.retire()` in fixed point (module doc)."""
  return (sup >= MIN_OBS * SCALE) & (10 * used + 8 * SCALE < sup)


def _marks(t, slot, tag):
  """(values i32[MB], tag matches bool[MB]) of the marks of keys (`slot`, `tag`) in row `t`."""
  v = t[MARKS + slot]
  return v, (v != 0) & ((v >> SHIFT) == tag)


def observe(lay: Layout, r, g: int, pos, table, req: PlacementRequest, kept) -> jax.Array:
  """table': the retirement columns (i32[R, state_size], R = `lay.recurrent_groups`) after one
  registration call of request slot `r` in recurrent group g (module doc: the decision and a
  use at an admission, then this call's points and supersessions).

  `req`: the call (`cache_keys.PlacementRequest`: admitted, hit, spb, tokens, keys u32[MB, 2]);
  `kept` bool[MB]: the state blocks the call keeps (masked by `ok`). Nothing changes when
  `req.admitted` is False and `kept` is empty.
  """
  row = lay.recurrent_groups.index(g)
  t = table[row]
  width = t.shape[0]
  bs = lay.groups[g].block_size
  mb = pos.shape[0]
  dcol = deepest_col(lay)
  lo = req.keys[:, 0]
  slot = (lo & jnp.uint32(TABLE - 1)).astype(jnp.int32)
  tag = (lo >> TABLE_BITS).astype(jnp.int32)
  adm = req.admitted
  sup, used = t[SUP], t[USED]
  decision = jnp.where(adm, should_retire(sup, used).astype(jnp.int32), t[DECISIONS + r])
  sup = jnp.where(adm, sup - sup // DECAY_DIV, sup)
  used = jnp.where(adm, used - used // DECAY_DIV, used)
  cap = (req.tokens - 1) // bs
  # a use: r's hit if every point were kept
  v, match = _marks(t, slot, tag)
  pts = match & ((v & POINT) != 0) & (pos < cap)
  q = jnp.max(jnp.where(pts, pos + 1, 0))
  qi = jnp.clip(q - 1, 0, mb - 1)
  reuse = adm & (q > 0) & ((v[qi] & OPEN) != 0)
  used = jnp.where(reuse, used + SCALE, used)
  t = t.at[jnp.where(reuse, MARKS + slot[qi], width)].set((v[qi] & ~OPEN) | KEEP, mode="drop")
  # a branch: r leaves the cache's chain after `seen` units
  seen = jnp.maximum(req.hit, req.spb) // bs
  branch = adm & (seen > 0) & (seen < cap)
  bi = jnp.clip(seen - 1, 0, mb - 1)
  vb = t[MARKS + slot[bi]]
  branch = branch & ((vb >> SHIFT) == tag[bi]) & ((vb & CHILD) != 0)
  t = t.at[jnp.where(branch, MARKS + slot[bi], width)].set(vb | KEEP, mode="drop")
  # this call's points and parents: per table entry, the block at the largest position writes
  v, match = _marks(t, slot, tag)
  new = kept & ~(match & ((v & POINT) != 0))
  e = jnp.max(jnp.where(new, pos + 1, 0))
  parent = jnp.concatenate([req.computed[1:], jnp.zeros((1,), bool)])
  add = jnp.where(kept, POINT, 0) | jnp.where(parent, CHILD, 0)
  win = jnp.full((TABLE,), -1, jnp.int32).at[jnp.where(add > 0, slot, TABLE)]
  win = win.max(pos.astype(jnp.int32), mode="drop")
  writes = (add > 0) & (win[slot] == pos)
  t = t.at[jnp.where(writes, MARKS + slot, width)].set(
    jnp.where(match, v | add, tag * 16 + add), mode="drop"
  )
  # supersessions: the points above the deepest new one that are not open
  v, match = _marks(t, slot, tag)
  fresh = (pos < e - 1) & match & ((v & POINT) != 0) & ((v & OPEN) == 0)
  t = t.at[jnp.where(fresh, MARKS + slot, width)].set(v | OPEN, mode="drop")
  sup = jnp.minimum(sup + jnp.sum(fresh).astype(jnp.int32) * SCALE, SAT)
  deepest = jnp.where(adm, e, jnp.maximum(t[dcol + r], e))
  t = t.at[SUP].set(sup).at[USED].set(used)
  t = t.at[DECISIONS + r].set(decision).at[dcol + r].set(deepest)
  return table.at[row].set(t)


def pick(lay: Layout, state: CacheState, slot, table) -> tuple[jax.Array, jax.Array]:
  """(i32[R * MB], table'): the state blocks finishing request `slot` retires (0 = none),
  recurrent group by group, in position order (module doc, "What is retired"), and the
  retirement columns with the slot's decision and e cleared (the slot's next request starts
  from none, even if it finishes unadmitted).

  `table`: the retirement columns i32[R, state_size]. Read before `release` clears the
  request's hashes, after its blocks are freed (a block it held is then ref 0 unless another
  request holds it). A picked block carries its chain key as its primary key, in its group,
  and is free; `release.retire` drops its keys, unpins it and moves it to the normal head.
  """
  hashes = state.req_hashes[slot]
  tokens = ReqInfo(state.req_info)[slot].tokens
  pos = jnp.arange(lay.max_blocks)
  dcol = deepest_col(lay)
  hit = coordinator.lookup(lay, state, hashes, tokens)["hit"]
  out = []
  for row, g in enumerate(lay.recurrent_groups):
    t = table[row]
    keys, valid = coordinator.group_hashes(lay, hashes, tokens, g)
    lo = keys[:, 0]
    tag = (lo >> TABLE_BITS).astype(jnp.int32)
    v, match = _marks(t, (lo & jnp.uint32(TABLE - 1)).astype(jnp.int32), tag)
    keep = match & ((v & KEEP) != 0)
    e = jnp.minimum(t[dcol + slot], hit // lay.groups[g].block_size)
    cand = valid & (pos < e - 1) & (t[DECISIONS + slot] != 0) & ~keep
    blk = block_index.probe(state, keys, jnp.full((lay.max_blocks,), g, jnp.int32))
    safe = jnp.maximum(blk, 0)
    own = (state.block_group[safe] == g) & jnp.all(state.block_hash[safe] == keys, axis=-1)
    free = (state.ref_cnt[safe] == 0) & (
      (state.free_key[safe] < BIG) | (state.pinned_key[safe] < BIG)
    )
    out.append(jnp.where(cand & (blk > 0) & own & free, blk, 0))
  table = table.at[:, DECISIONS + slot].set(0).at[:, dcol + slot].set(0)
  return jnp.concatenate(out), table
