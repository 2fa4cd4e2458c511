"""Twin of `hybrid_cache.core.policies.superseded`: a finishing request retires the recurrent
states its own deeper checkpoints supersede, while superseded states are rarely used again.
The rule, its source (the simulator's `UnitCache._retire` and `SupersessionStats`, issue 28)
and the integer statistics are documented there; here the same integers, one request at a
time."""

from __future__ import annotations

from hybrid_cache.config import CacheConfig
from hybrid_cache.twin import coordinator
from hybrid_cache.twin.cache_keys import PlacementRequest

SCALE = 1 << 10
SAT = 1 << 30
DECAY_DIV = 200
MIN_OBS = 16
TABLE_BITS = 16  # the core's (why: `core/policies/adaptive.py` TABLE_BITS)
TABLE = 1 << TABLE_BITS
POINT, OPEN, KEEP, CHILD = 1, 2, 4, 8
SHIFT = 4


def should_retire(sup: int, used: int) -> bool:
  """`SupersessionStats.retire()` in fixed point: >= MIN_OBS supersessions and a used share
  (used + 1) / (sup + 2) below 1/10."""
  return sup >= MIN_OBS * SCALE and 10 * used + 8 * SCALE < sup


def _entry(key: int) -> tuple[int, int]:
  """(table entry, tag) of a 64-bit key: its low lane's low bits, then the rest."""
  lo = key & 0xFFFFFFFF
  return lo & (TABLE - 1), lo >> TABLE_BITS


class Retirement:
  """Per recurrent group: the counts [sup, used] and the marks (table entry -> tag * 8 +
  flags); per (group, request): its decision (taken at its admission) and e (1 + its deepest
  new kept position, 0 = none)."""

  def __init__(self, config: CacheConfig):
    self.block_size = {g: config.resolved_groups[g].block_size for g in range(len(config.groups))}
    self.counts: dict[int, list[int]] = {}
    self.marks: dict[int, dict[int, int]] = {}
    self.decision: dict[tuple[int, str], bool] = {}
    self.deepest: dict[tuple[int, str], int] = {}

  def _mark(self, gid: int, key: int) -> tuple[int, bool]:
    """(value, tag matches) of `key`'s mark."""
    slot, tag = _entry(key)
    v = self.marks.setdefault(gid, {}).get(slot, 0)
    return v, v != 0 and v >> SHIFT == tag

  def observe(self, gid: int, req: PlacementRequest, kept: list[int]) -> None:
    """One registration call of request `req.name` in recurrent group `gid`, which keeps the
    state blocks at positions `kept` (increasing)."""
    bs = self.block_size[gid]
    keys = req.keys
    sup, used = self.counts.setdefault(gid, [0, 0])
    name = req.name
    cap = (req.tokens - 1) // bs
    if req.admitted:
      self.decision[gid, name] = should_retire(sup, used)
      sup -= sup // DECAY_DIV
      used -= used // DECAY_DIV
      pts = [p for p in range(min(cap, len(keys))) if self._point(gid, keys[p])]
      if pts:
        key = keys[pts[-1]]
        v, _ = self._mark(gid, key)
        if v & OPEN:
          used += SCALE
          self.marks[gid][_entry(key)[0]] = (v & ~OPEN) | KEEP
      seen = max(req.hit, req.spb) // bs
      if 0 < seen < cap:
        v, same = self._mark(gid, keys[seen - 1])
        if same and v & CHILD:
          self.marks[gid][_entry(keys[seen - 1])[0]] = v | KEEP
    new = [p for p in kept if not self._point(gid, keys[p])]
    e = new[-1] + 1 if new else 0
    # points and parents: per table entry, the block at the largest position writes; values
    # read before any write
    add = {p: POINT for p in kept}
    for p in req.computed:
      if p >= 1:
        add[p - 1] = add.get(p - 1, 0) | CHILD
    last = {_entry(keys[p])[0]: p for p in sorted(add)}
    writes = {slot: self._mark(gid, keys[p]) + (p,) for slot, p in last.items()}
    for slot, (v, same, p) in writes.items():
      self.marks[gid][slot] = v | add[p] if same else _entry(keys[p])[1] * 16 + add[p]
    fresh = [p for p in range(max(e - 1, 0)) if self._point(gid, keys[p], unopened=True)]
    for p in fresh:
      v, _ = self._mark(gid, keys[p])
      self.marks[gid][_entry(keys[p])[0]] = v | OPEN
    sup = min(sup + len(fresh) * SCALE, SAT)
    self.counts[gid] = [sup, used]
    prev = 0 if req.admitted else self.deepest.get((gid, name), 0)
    self.deepest[gid, name] = max(prev, e)

  def _point(self, gid: int, key: int, unopened: bool = False) -> bool:
    """Whether `key` is marked a point (and, with `unopened`, not open)."""
    v, same = self._mark(gid, key)
    return same and bool(v & POINT) and not (unopened and v & OPEN)

  def pick(self, s, r) -> list[int]:
    """The state blocks finishing request `r` retires, group by group in position order
    (read after its blocks are freed): those of its chain above min(e, the units a lookup of
    its own tokens hits now) (not marked `KEEP`) that a lookup finds, carrying that key as
    their own, free (normal queue or pinned tier). The request's decision and e are
    forgotten (the core clears its slot's)."""
    out = []
    hit = coordinator.lookup(s, r.fine_hashes, len(r.tokens))[0].hit_tokens
    for gid, g in enumerate(s.groups):
      decided = self.decision.pop((gid, r.name), False)
      e = min(self.deepest.pop((gid, r.name), 0), hit // s.bs[gid])
      if g.kind != "mamba" or not decided:
        continue
      keys = coordinator.group_hashes(s, r.fine_hashes, s.bs[gid])
      for p in range(min(e - 1, len(keys))):
        v, same = self._mark(gid, keys[p])
        ids = s.index.get((keys[p], gid))
        if (same and v & KEEP) or not ids:
          continue
        b = ids[0]
        if s.key[b] == (keys[p], gid) and s.ref[b] == 0:
          out.append(b)
    return out
