"""Placement `adaptive`: a recurrent state at the branch point and at one continuation point,
the continuation on a learned alignment.

Source: the simulator's `adaptive` (issue 15, item 3; `hybrid_cache/sim/checkpoint_placement.py`
`candidates`, `hybrid_cache/sim/adaptive_stats.py` `DivergenceStats`), ported to the cache
core's placement seam (issue 28, item 1: the placement part; its eviction, retirement and
tuning are other seams). Twin: `hybrid_cache/twin/policies/adaptive.py` (exactly the same
integers).

The unit. The simulator counts depths in checkpoint units U; here the unit of recurrent group
g is its block size B (a state can be kept only where a block ends; with `fine_keys` and a
recurrent group of block `hash_block_size` = U, mode "all", that is every U, the simulator's
grid; in mode align a state exists only where a chunk ends: the core cuts a chunk at the
continuation point below, `chunk_cuts` / `core/step.py` `placement_cuts`, and the branch point
is the junction, where vLLM's split cuts already). Request r keeps the state block ending at

- the branch point: its shared-prefix boundary `spb` (vLLM's Marconi junction: the deepest
  prefix the cache's attention still holds beyond r's hit, `CacheConfig.marconi_junction`),
  floored to B: block spb // B - 1. (The simulator's branch point is the deepest unit r shares
  with anything ever seen; the core knows what its index still holds.)
- the continuation point: the last multiple of A units within r's prompt (L = prompt tokens),
  or within its known tokens when divergences were seen to lie in earlier requests' outputs
  (L = `tokens`: prompt + output so far): block c - 1 with c = (L // B) // A * A, if c > 0.

The learned alignment A and the output flag are those of `DivergenceStats`, as of r's
admission (decided once, before r's own divergence is counted, and kept for r's slot):
A = the largest 2^j (j <= `MAX_ALIGN_LOG2`) such that >= 90% of the decayed divergence depths
are multiples of 2^j units, 1 until the decayed count of divergences reaches `MIN_OBS` (at
0.995 per divergence: the 17th); the output flag: >= `MIN_OBS` divergences and >= half of them
(decayed) inside an earlier request's output.

A divergence. At its admission r's prefix left what the cache has seen at d = max(hit, spb)
tokens: seen = d // B units (the simulator reads the trie of everything computed; the core reads
what its index still holds, so an eviction can make d shallower). As in the simulator, it counts
when 0 < seen < cap, cap = (tokens - 1) // B (the deepest hit possible). It lies in an earlier
output when the prefix of `seen` units was first computed past its computing request's prompt:
the policy keeps, for every block a request computes, a mark in a direct-mapped table of `TABLE`
entries per recurrent group, indexed by the low `TABLE_BITS` bits of the block's key (its prefix
hash, low lane) and tagged by the key's remaining 16 low-lane bits: value tag * 4 + flag (flag
1: the block ends within the computing request's prompt, 2: past it; 0 = empty). A mark is
replaced only by a different tag (first computation wins, as the simulator's trie keeps its
creator's flag); a mark whose tag does not match reads as "not in an output". In one call, per
table entry, the block at the largest position writes (the twin applies the same rule).

Online deviations from the simulator, which knows a request's whole output when placing it:
the core registers a state when its block is computed. With the output flag on, the
continuation point follows `tokens`: while the prompt is computed (the output still unknown) it
is the last multiple of A within the prompt, and each later multiple of A that decoding reaches
is kept as `tokens` grows (one-token decode steps keep every one; `hybrid_cache.sim.core_sim`
appends a request's output at once: the prompt's point and the output's last one). Superseded
points stay until evicted (retiring them is a seam of its own, issue 28). A preempted request
counts its divergence again when re-admitted. Without `marconi_junction` `spb` is 0: no branch
point, and d = the hit.

Policy state (`CacheState.policy_state`, the placement's own columns after the admission
policy's: `state_size`), per recurrent group row, i32: the decayed counts as fixed point with
`SCALE` = 2^16 (decay x -> x - x // 200, i.e. 0.995 per divergence; the counts stay below
201 * SCALE, so 10 * count fits int32): `OBS` divergences, `OUT` those in an output,
`ALIGNED + j - 1` those at a multiple of 2^j units (j = 1..4); then the `TABLE` marks; then
one decision per request slot, A * 2 + output flag (0 before the slot's first admission,
read as A = 1, no output).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.core.cache_keys import PlacementRequest
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.state import BIG

MAX_ALIGN_LOG2 = 4  # A <= 2^4 units
MIN_OBS = 16  # divergences (decayed) before A and the output flag are learned
SCALE = 1 << 16  # fixed point of the decayed counts
DECAY_DIV = 200  # one divergence decays the counts by x // 200 (0.995)
TABLE_BITS = 16
TABLE = 1 << TABLE_BITS  # marks per recurrent group
# columns of a recurrent group's row
OBS, OUT, ALIGNED = 0, 1, 2  # ALIGNED + j - 1: divergences at a multiple of 2^j units
MARKS = ALIGNED + MAX_ALIGN_LOG2  # the marks table, TABLE columns
DECISIONS = MARKS + TABLE  # one decision per request slot


def state_size(lay: Layout) -> int:
  """Columns per recurrent group in `policy_state`: counts, marks, one decision per slot."""
  return DECISIONS + lay.max_requests


def learned(stats) -> tuple[jax.Array, jax.Array]:
  """(A in units, output flag) from a row's counts `stats` i32[MARKS] (the module doc)."""
  obs = stats[OBS]
  enough = obs >= MIN_OBS * SCALE
  a = jnp.int32(1)
  for j in range(1, MAX_ALIGN_LOG2 + 1):
    a = jnp.where(10 * stats[ALIGNED + j - 1] >= 9 * obs, jnp.int32(1 << j), a)
  return jnp.where(enough, a, 1), enough & (2 * stats[OUT] >= obs)


def observe(stats, seen, in_output) -> jax.Array:
  """i32[MARKS]: the counts after one divergence after `seen` >= 1 shared units."""
  events = [jnp.int32(1), in_output.astype(jnp.int32)]
  events += [(seen % (1 << j) == 0).astype(jnp.int32) for j in range(1, MAX_ALIGN_LOG2 + 1)]
  return stats - stats // DECAY_DIV + jnp.stack(events) * SCALE


def continuation(t, r, admitted, prompt, tokens, bs: int) -> tuple[jax.Array, jax.Array]:
  """(decision, c): request slot `r`'s decision A * 2 + output flag (at an admission the one
  learned from row `t`'s counts so far, else the slot's) and its continuation point in blocks
  of `bs`, c = (L // bs) // A * A with L = `tokens` under the output flag, else
  min(`prompt`, `tokens`) (module doc; 0 = none)."""
  a, out = learned(t[:MARKS])
  decision = jnp.where(admitted, a * 2 + out.astype(jnp.int32), t[DECISIONS + r])
  a_r = jnp.maximum(decision >> 1, 1)
  limit = jnp.where((decision & 1) == 1, tokens, jnp.minimum(prompt, tokens)) // bs
  return decision, limit // a_r * a_r


def chunk_cuts(lay: Layout, table, r, admitted, prompt, tokens) -> tuple:
  """i32 token positions, one per recurrent group (`BIG` = none): the continuation point c * B
  that `keep` keeps for request slot `r` (`continuation`), so that an align-mode chunk ends
  there (`split.split`; without the cut align mode computes a state only at the prompt end,
  the junction and block ends a chunk happens to stop at, and a point at A > 1 units inside a
  chunk is lost).

  `table` i32[R, state_size]: the placement's columns; `admitted` bool (the entry is new)."""
  out = []
  for row, g in enumerate(lay.recurrent_groups):
    bs = lay.groups[g].block_size
    _, c = continuation(table[row], r, admitted, prompt, tokens, bs)
    out.append(jnp.where(c > 0, c * bs, BIG))
  return tuple(out)


def keep(lay: Layout, r, g: int, pos, boundaries, default, table, req: PlacementRequest):
  """(table', bool[MB]): which of group g's state blocks request slot `r` keeps, and the
  placement's columns after this registration call (module doc).

  `table` i32[R, state_size] (R = `lay.recurrent_groups`); `req`: admitted, hit, spb, prompt,
  tokens, computed bool[MB], keys u32[MB, 2].
  `boundaries` and `default` (vLLM's mask) are not read. Every write is masked by
  `req.admitted` (the decision and the divergence) or `req.computed` (the marks).
  """
  row = lay.recurrent_groups.index(g)
  t = table[row]
  bs = lay.groups[g].block_size
  width = t.shape[0]
  lo = req.keys[:, 0]
  slot = (lo & jnp.uint32(TABLE - 1)).astype(jnp.int32)
  tag = (lo >> TABLE_BITS).astype(jnp.int32)
  marks = t[MARKS:DECISIONS]
  stats = t[:MARKS]
  # the divergence of an admission, read before this call's marks
  seen = jnp.maximum(req.hit, req.spb) // bs
  cap = (req.tokens - 1) // bs
  at = jnp.clip(seen - 1, 0, pos.shape[0] - 1)
  mark = marks[slot[at]]
  in_output = ((mark & 3) == 2) & ((mark >> 2) == tag[at])
  decision, c = continuation(t, r, req.admitted, req.prompt, req.tokens, bs)
  counted = req.admitted & (seen > 0) & (seen < cap)
  stats = jnp.where(counted, observe(stats, seen, in_output), stats)
  # the kept blocks: the branch point and the continuation point
  mask = ((c > 0) & (pos == c - 1)) | ((req.spb > 0) & (pos == req.spb // bs - 1))
  # this call's marks: per table entry, the computed block at the largest position
  win = jnp.full((TABLE,), -1, jnp.int32).at[jnp.where(req.computed, slot, TABLE)]
  win = win.max(pos.astype(jnp.int32), mode="drop")
  writes = req.computed & (win[slot] == pos)
  old = marks[slot]
  flag = jnp.where((pos + 1) * bs > req.prompt, 2, 1)
  value = jnp.where((old != 0) & ((old >> 2) == tag), old, tag * 4 + flag)
  t = t.at[jnp.where(writes, MARKS + slot, width)].set(value, mode="drop")
  t = t.at[:MARKS].set(stats).at[DECISIONS + r].set(decision)
  return table.at[row].set(t), mask
