"""Releasing a request's blocks when it finishes or is preempted (§1.6, SPEC B1), plain Python.

Jitted twin: `core/release.py` (`pin_finished`, `release`). A finished (not preempted) request
first pins what keeps its prefix hittable (`rules.finish_pin_indices`, or the retention policy's
pick), then frees its blocks tail first, one batch per group in group order, then retires what
the retirement policy picks (`retire`), handing the retired states' access history to the
state that superseded them when the eviction policy reads it (LRU-2).
"""

from __future__ import annotations

from hybrid_cache import policies
from hybrid_cache.twin import block_pool
from hybrid_cache.twin import coordinator
from hybrid_cache.twin import kv_owner
from hybrid_cache.twin import rules
from hybrid_cache.twin.state import NULL
from hybrid_cache.twin.state import Request
from hybrid_cache.twin.state import TwinState


def pin_finished(s: TwinState, r: Request) -> None:
  """Flags the blocks that keep a finishing request's prefix hittable (SPEC B1), or those the
  retention policy picks (`hybrid_cache.policies`, seam `retention`)."""
  keyed, sel, kinds = [], [], []
  for gid, row in enumerate(r.rows):
    g = s.groups[gid]
    keyed.append([i for i, b in enumerate(row) if b != NULL and s.key[b] is not None])
    need = rules.swa_need(g.window, s.bs[gid], g.eagle) if g.kind == "swa" else 1
    sel.append(rules.finish_pin_indices(g.kind, keyed[-1], need))
    kinds.append((g.kind, s.bs[gid], need))
  if s.retention is not None:
    sel = s.retention.pin(s.config, kinds, keyed, sel, r.num_prompt_tokens, s.align)
  for row, idx in zip(r.rows, sel):
    for i in idx:
      s.pinned[row[i]] = True


def retire(s: TwinState, r: Request) -> None:
  """Retires what the retirement policy picks for finished request `r` (its blocks freed):
  only free blocks (normal queue or pinned tier) keyed in a recurrent group, whatever the
  pick; their keys are dropped, a pinned one is unpinned, and they move to the normal free
  queue's head, the first picked in front (core `release.retire`)."""
  out = []
  for b in s.retirement.pick(s, r):
    key = s.key[b]
    if s.ref[b] == 0 and key is not None and s.groups[key[1]].kind == "mamba":
      out.append(b)
  if policies.reads_history(s.config.eviction):
    heirs = _heirs(s, r, out)
  for b in out:
    block_pool.evict_key(s, b)
    if b in s.pinned_free:
      s.pinned_free.remove(b)
    else:
      s.free.remove(b)
    s.pinned[b] = False
  s.free[0:0] = out
  if policies.reads_history(s.config.eviction):
    for b, key, inherited in heirs:
      if s.key[b] == key:
        s.penult[b] = max(s.penult[b], inherited)


def _heirs(s: TwinState, r: Request, retired: list[int]) -> list[tuple[int, tuple, int]]:
  """History inheritance (core `release.inherit_history`): per recurrent group g, (the block
  a lookup finds for r's own key at position h - 1 of g, h = the units of g a lookup of r's
  own tokens hits; that key; the largest penultimate access of the `retired` blocks keyed in
  g), for the groups where h > 0 and the key is indexed. Read before `retired` lose keys."""
  out = []
  hit = coordinator.lookup(s, r.fine_hashes, len(r.tokens))[0].hit_tokens
  for gid, g in enumerate(s.groups):
    h = hit // s.bs[gid]
    keys = coordinator.group_hashes(s, r.fine_hashes, s.bs[gid])
    if g.kind != "mamba" or h < 1 or h > len(keys) or not s.index.get((keys[h - 1], gid)):
      continue
    inherited = max((s.penult[b] for b in retired if s.key[b][1] == gid), default=0)
    out.append((s.index[keys[h - 1], gid][0], (keys[h - 1], gid), inherited))
  return out


def release(s: TwinState, r: Request, finished: bool) -> None:
  """Frees a request's blocks tail first, group by group; a finished one pins first and then
  retires what the retirement policy picks (`retire`)."""
  if finished and s.config.pinning:
    pin_finished(s, r)
  for row in r.rows:
    block_pool.free_blocks(s, list(reversed(row)))
  if finished and s.retirement is not None:
    retire(s, r)
  if finished and policies.reads_history(s.config.eviction):  # after retirement
    kv_owner.record(s, r)
  r.rows = []
  r.num_cached = None
  r.last_state.clear()
  r.state_col.clear()
  r.partial.clear()
  r.chain.clear()
  r.inherit = 0
