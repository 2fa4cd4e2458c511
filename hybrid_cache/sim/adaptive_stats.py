"""What `adaptive` learns online from the requests seen so far: where they diverge, and whether
the checkpoints they supersede are used again.

Issue 15, item 3 (`checkpoint_policies.py`). Two statistics of what the cache has seen, both
decayed counts over the requests so far (never the future), so a cut trace replays as the
prefix of the full one:

- `DivergenceStats`, for the continuation point (`checkpoint_placement.candidates`):
  - alignment A: the largest 2^j units (j <= 4) such that >= 90% of the observed divergence
    depths are multiples of A (traces hashed in blocks diverge only on block boundaries:
    Mooncake's 512-token blocks give A = 8 units at U = 64); 1 until 16 divergences are seen;
  - output reuse: the share of divergences that lie in an earlier request's output region
    (chat histories re-send the answer; Mooncake's fresh output ids never match). The
    continuation point is the last multiple of A within r's input (share < 1/2) or within its
    computed tokens (share >= 1/2).
- `SupersessionStats`, for retirement: while the points r's placements supersede (those above
  its deepest new one on its path) are rarely used again (a chat session's next turn continues
  at the last turn's end), the caches drop the superseded checkpoints as r's are inserted
  (`checkpoint_cache.UnitCache`, "Retirement"): with LRU-2 then eligible as a shadow, real
  ShareGPT +14% to +30% at 2e9-4e9, synthetic chat -1% to +11%, the other traces unchanged
  (BENCHMARKS.md, "Retiring superseded checkpoints").
"""

from __future__ import annotations

import numpy as np

from hybrid_cache.sim.seen_trie import SeenTrie
from hybrid_cache.sim.seen_trie import grown

_MAX_ALIGN_LOG2 = 4
_MIN_OBS = 16.0
_DECAY = 0.995
# `SupersessionStats`: retire superseded checkpoints while fewer than this share of them are
# used again (chat-like traces measure <= 0.02, agentic and Mooncake >= 0.23)
RETIRE_SHARE = 0.1


class DivergenceStats:
  """Decayed counts of where requests diverged from what was seen (see the module doc)."""

  def __init__(self):
    self.obs = 0.0
    self.aligned = [0.0] * (_MAX_ALIGN_LOG2 + 1)
    self.out = 0.0

  def alignment(self) -> int:
    if self.obs < _MIN_OBS:
      return 1
    a = 1
    for j in range(1, _MAX_ALIGN_LOG2 + 1):
      if self.aligned[j] >= 0.9 * self.obs:
        a = 1 << j
    return a

  def output_reused(self) -> bool:
    return self.obs >= _MIN_OBS and self.out >= 0.5 * self.obs

  def observe(self, depth: int, in_output: bool) -> None:
    """A request diverged after `depth` >= 1 shared units (in an earlier output or not)."""
    self.obs = self.obs * _DECAY + 1.0
    self.out = self.out * _DECAY + (1.0 if in_output else 0.0)
    for j in range(_MAX_ALIGN_LOG2 + 1):
      self.aligned[j] = self.aligned[j] * _DECAY + (1.0 if depth % (1 << j) == 0 else 0.0)


class SupersessionStats:
  """Whether `adaptive` retires superseded checkpoints: how often a superseded point is used.

  Counted on the trie of everything seen, as if every candidate point were kept (no cache is read,
  so every capacity and setting decides the same way, and online: request r's decision reads
  requests 0..r-1). Request r *supersedes* a point when it places a point deeper on the same path:
  every point above its deepest new one is then superseded (`UnitCache`'s retirement drops such
  checkpoints), counted once until it is *used* again: r's hit in the keep-everything cache (its
  deepest point within the units that existed before it, capped as a hit) is a superseded point. A
  used point is also marked in `SeenTrie.reused_from`, and retirement keeps it from then on: the
  share counts events, and a few points reused often (a shared system prompt's state, passed and
  extended by every new session) must not go with the many never reused (synthetic agentic without
  history truncation: share 0.006, and retiring those states too cost -17% to -58%; with the mark
  +1% to +17%). The decayed share (used + 1) / (superseded + 2) below `RETIRE_SHARE`, with >=
  `_MIN_OBS` (decayed) supersessions, retires. Measured at the end of each trace (U = 64, 0.995
  decay per request): real ShareGPT 0.006-0.018 and synthetic chat 0.005 (sessions continue at the
  last turn's end; 96-97% of requests retire), synthetic agentic 0.23-0.24 (history truncation,
  shared system prompts; 0-0.3% retire), Mooncake conversation 0.70 and synthetic 0.85 (shared
  prefixes; none retire): BENCHMARKS.md, "Retiring superseded checkpoints".
  """

  def __init__(self):
    self.superseded = 0.0
    self.used = 0.0
    self._point = np.zeros(1 << 12, np.bool_)  # per trie node: a candidate point
    self._open = np.zeros(1 << 12, np.bool_)  # per trie node: superseded, not used since

  def share(self) -> float:
    return (self.used + 1.0) / (self.superseded + 2.0)

  def retire(self) -> bool:
    return self.superseded >= _MIN_OBS and self.share() < RETIRE_SHARE

  def observe(
    self, trie: SeenTrie, r: int, pa: np.ndarray, seen: int, cands: list[tuple[int, int]]
  ) -> None:
    """Request r of `trie` (walked) with path array `pa`, `seen` leading units that existed
    before it (capped as a hit) and candidate points `cands` [(depth, kind)]. A superseded
    point r uses is marked in `trie.reused_from` (retirement keeps it from r on)."""
    self._point = grown(self._point, len(trie))
    self._open = grown(self._open, len(trie))
    self.superseded *= _DECAY
    self.used *= _DECAY
    point, open_ = self._point, self._open
    held = np.flatnonzero(point[pa[:seen]])
    q = int(held[-1]) + 1 if len(held) else 0  # r's hit if every point were kept
    if q and open_[pa[q - 1]]:
      self.used += 1.0
      open_[pa[q - 1]] = False
      trie.reused_from[pa[q - 1]] = min(trie.reused_from[pa[q - 1]], r)
    e = max((dq for dq, _ in cands if dq > q and not point[pa[dq - 1]]), default=0)
    for dq, _ in cands:
      point[pa[dq - 1]] = True
    if e:
      seg = pa[: e - 1]
      fresh = seg[point[seg] & ~open_[seg]]
      open_[fresh] = True
      self.superseded += float(len(fresh))


__all__ = ["RETIRE_SHARE", "DivergenceStats", "SupersessionStats"]
