"""Twin of `hybrid_cache.core.policies.adaptive`: states at the branch point and at the last
multiple of a learned alignment A within the prompt (or within the known tokens once
divergences are seen to lie in earlier outputs). The rule, its source (the simulator's
`checkpoint_placement.candidates` / `adaptive_stats.DivergenceStats`, issues 15 and 28) and the
integer statistics are documented there; here the same integers, one request at a time."""

from __future__ import annotations

from hybrid_cache.config import CacheConfig
from hybrid_cache.twin.cache_keys import PlacementRequest

MAX_ALIGN_LOG2 = 4
MIN_OBS = 16
SCALE = 1 << 16
DECAY_DIV = 200
TABLE_BITS = 16  # the core's (why: `core/policies/adaptive.py` TABLE_BITS)
TABLE = 1 << TABLE_BITS


def learned(stats: list[int]) -> tuple[int, bool]:
  """(A in units, output flag) from the decayed counts [obs, out, aligned_1 .. aligned_4]."""
  obs, out = stats[0], stats[1]
  if obs < MIN_OBS * SCALE:
    return 1, False
  a = 1
  for j in range(1, MAX_ALIGN_LOG2 + 1):
    if 10 * stats[1 + j] >= 9 * obs:
      a = 1 << j
  return a, 2 * out >= obs


def observe(stats: list[int], seen: int, in_output: bool) -> list[int]:
  """The counts after one divergence after `seen` >= 1 shared units."""
  events = [1, int(in_output)] + [int(seen % (1 << j) == 0) for j in range(1, MAX_ALIGN_LOG2 + 1)]
  return [x - x // DECAY_DIV + e * SCALE for x, e in zip(stats, events)]


def continuation(decision: tuple[int, bool], prompt: int, tokens: int, bs: int) -> int:
  """The continuation point in blocks of `bs` under `decision` (A, output flag): the last
  multiple of A within `tokens` (output flag) or within min(`prompt`, `tokens`)."""
  a, out = decision
  limit = (tokens if out else min(prompt, tokens)) // bs
  return limit // a * a


class Placement:
  """Per recurrent group: the decayed counts and the marks (table entry -> tag * 4 + flag);
  per (group, request): its decision (A, output flag) taken at its admission; the blocks the
  current call keeps (`start`, then `keep` per block)."""

  def __init__(self, config: CacheConfig):
    self.block_size = {g: config.resolved_groups[g].block_size for g in range(len(config.groups))}
    self.stats: dict[int, list[int]] = {}
    self.marks: dict[int, dict[int, int]] = {}
    self.decision: dict[tuple[int, str], tuple[int, bool]] = {}
    self.kept: set[int] = set()

  def learned(self, gid: int) -> tuple[int, bool]:
    """What group `gid` has learned so far: (A in units, output flag)."""
    return learned(self.stats.get(gid, [0] * (2 + MAX_ALIGN_LOG2)))

  def start(self, gid: int, req: PlacementRequest) -> None:
    """One registration call of request `req.name`, group `gid`: its admission's decision and
    divergence, the blocks it keeps (answered by `keep`), then the marks of its blocks."""
    bs = self.block_size[gid]
    stats = self.stats.setdefault(gid, [0] * (2 + MAX_ALIGN_LOG2))
    marks = self.marks.setdefault(gid, {})
    if req.admitted:
      self.decision[gid, req.name] = learned(stats)
      seen = max(req.hit, req.spb) // bs
      if 0 < seen < (req.tokens - 1) // bs:
        lo = req.keys[seen - 1] & 0xFFFFFFFF
        mark = marks.get(lo & (TABLE - 1), 0)
        in_output = (mark & 3) == 2 and (mark >> 2) == (lo >> TABLE_BITS)
        self.stats[gid] = observe(stats, seen, in_output)
    c = continuation(self.decision.get((gid, req.name), (1, False)), req.prompt, req.tokens, bs)
    self.kept = {p for p in (c - 1, req.spb // bs - 1 if req.spb > 0 else -1) if p >= 0}
    # per table entry, the computed block at the largest position writes; old values are read
    # before any write (the jitted twin's one scatter)
    last = {(req.keys[i] & 0xFFFFFFFF) & (TABLE - 1): i for i in req.computed}
    new = {}
    for slot, i in last.items():
      tag = (req.keys[i] & 0xFFFFFFFF) >> TABLE_BITS
      old = marks.get(slot, 0)
      same = old != 0 and (old >> 2) == tag
      new[slot] = old if same else tag * 4 + (2 if (i + 1) * bs > req.prompt else 1)
    marks.update(new)

  def chunk_cuts(self, s, req, admitted: bool) -> list[int]:
    """Per recurrent group, the continuation point c * B that `start` keeps for `req` (its
    decision as `start` takes it: at an admission the one learned so far), where an align-mode
    chunk is cut (core `chunk_cuts`); none where c = 0."""
    out = []
    for gid, g in enumerate(s.groups):
      if g.kind != "mamba":
        continue
      bs = self.block_size[gid]
      decision = self.learned(gid) if admitted else self.decision.get((gid, req.name), (1, False))
      c = continuation(decision, req.num_prompt_tokens, len(req.tokens), bs)
      if c > 0:
        out.append(c * bs)
    return out

  def keep(self, config, i: int, block_size: int, alignment: int, boundaries, default) -> bool:
    """Whether state block i is kept in the current call (`start`); `default` is not read."""
    return i in self.kept
