"""The per-node state of K checkpoint caches over one trie, and the gather that finds their hits.

Part of the checkpoint cache (`checkpoint_cache.py`, issue 15, item 2). Layout for speed (the
same decisions as one object per node): the caches' per-node state is one row each of
`CacheBank`'s [K, nodes] arrays (`present`, `flag`, `nchild`), so a sweep over capacities finds
all K caches' hits with one gather per request (`lookup`); a chain of KV units is added or
dropped by one scatter, and the nearest checkpoint or branch above a node is one gather over its
ancestors (`SeenTrie.ancestors`, the last 64 first: `_marks_above`). In the sequential replay
the units a request creates are written once for all K rows (`CacheBank.insert_fresh`).

A hit of request r is the deepest depth d <= (input - 1) // U such that the first d units are
present and (recurrent models) node d - 1 holds a checkpoint: hits are multiples of U, capped at
input - 1 tokens (the last prompt token is always computed, as in vLLM). Models without
recurrent layers hit at the deepest present unit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
  from hybrid_cache.sim.checkpoint_cache import UnitCache

_CKPT, _BRANCH = 1, 2  # bits of UnitCache._flag
# close and a whole Mooncake path is up to ~1,400 units (a gather of its length per call)
_WINDOW = 64


def _marks_above(flag: np.ndarray, nodes: np.ndarray, ckpt: bool = True) -> tuple[int, int]:
  """(the depth of the deepest node of `nodes` holding a checkpoint, the depth of the deepest
  one holding a checkpoint or being a branch); 0 = none.

  `nodes` is a prefix of a root path (nodes[k] at depth k + 1) and `flag` a cache's flag row.
  ckpt False: the first value is not computed (returned as 0).
  """
  n = len(nodes)
  lo = n - _WINDOW if n > _WINDOW else 0
  f = flag[nodes[lo:]]
  mk = f.nonzero()[0]
  if len(mk):
    top = lo + int(mk[-1]) + 1
    if not ckpt:
      return 0, top
    ck = (f & _CKPT).nonzero()[0]
    if len(ck):
      return lo + int(ck[-1]) + 1, top
  if lo == 0:
    return 0, (lo + int(mk[-1]) + 1 if len(mk) else 0)
  f = flag[nodes]  # the window held no (checkpoint) mark: the whole path
  mk = f.nonzero()[0]
  top = int(mk[-1]) + 1 if len(mk) else 0
  if not ckpt:
    return 0, top
  ck = (f & _CKPT).nonzero()[0]
  return (int(ck[-1]) + 1 if len(ck) else 0), top


def _last_mark(flag: np.ndarray, nodes: np.ndarray) -> int:
  """`_marks_above(flag, nodes, ckpt=False)[1]`: the depth of the deepest checkpoint or
  branch among `nodes` (0: none)."""
  n = len(nodes)
  lo = n - _WINDOW if n > _WINDOW else 0
  mk = flag[nodes[lo:]].nonzero()[0]
  if len(mk):
    return lo + mk.item(-1) + 1
  if lo == 0:
    return 0
  mk = flag[nodes[:lo]].nonzero()[0]  # the window held no mark: the rest of the path
  return mk.item(-1) + 1 if len(mk) else 0


class CacheBank:
  """The per-node state of K caches over one trie as [K, nodes] arrays (a batch axis).

  Row k of `present` (bool), `flag` (uint8: _CKPT | _BRANCH) and `nchild` (int32) is cache k's
  state (`UnitCache` holds row views, re-pointed when the bank grows with the trie). The one
  thing every cache does at every request, finding its hit along the request's path, is done
  for all K rows in one gather (`lookup`).
  """

  def __init__(self):
    self.caches: list[UnitCache] = []
    self.present = np.zeros((0, 0), np.bool_)
    self.flag = np.zeros((0, 0), np.uint8)
    self.nchild = np.zeros((0, 0), np.int32)

  def add(self, cache: UnitCache) -> None:
    self.caches.append(cache)
    self._resize(len(self.caches), self.present.shape[1])

  def grow(self, nodes: int) -> None:
    """Makes room for `nodes` trie nodes (columns double)."""
    cols = self.present.shape[1]
    if nodes > cols:
      self._resize(len(self.caches), max(nodes, 2 * cols, 1 << 12))

  def _resize(self, rows: int, cols: int) -> None:
    for name in ("present", "flag", "nchild"):
      old = getattr(self, name)
      new = np.zeros((rows, cols), old.dtype)
      new[: old.shape[0], : old.shape[1]] = old
      setattr(self, name, new)
    for k, c in enumerate(self.caches):
      c._present, c._flag, c._nchild = self.present[k], self.flag[k], self.nchild[k]

  def insert_fresh(self, pa: np.ndarray, old: int, deepest: int) -> None:
    """Writes, in every row, the chain of units pa[old:deepest] that request r created (so
    no cache holds them) and every cache's `finish` of r adds: present, one present child
    each but the last. The sequential replay calls it after r's lookup and before any cache
    serves r, then passes `fresh=(old, deepest)` to each `finish`, which writes the rest of
    its chain (the units it did not hold among pa[:old]).

    Exact: no cache reads the state of units created by r before its `finish` of r inserts
    them (evictions only walk the root paths of held checkpoints). A new chain's ids are
    consecutive (`SeenTrie.walk`), so this is one strided slice per array for all K rows
    instead of two index scatters per cache (the chain averages ~175 units on the Mooncake
    trace).
    """
    lo, n = int(pa[old]), deepest - old
    if n < 1 or int(pa[deepest - 1]) != lo + n - 1:
      raise ValueError(f"pa[{old}:{deepest}] must be a new chain of consecutive node ids")
    self.present[:, lo : lo + n] = True
    self.nchild[:, lo : lo + n - 1] = 1

  def lookup(self, pa: np.ndarray, cap: int, old: int) -> list[tuple[int, int, int, int, int]]:
    """`lookup` of every cache of the bank, in the order they were added (rows)."""
    return list(zip(*lookup(self.present, self.flag, pa, cap, old), strict=True))


def lookup(present: np.ndarray, flag: np.ndarray, pa: np.ndarray, cap: int, old: int):
  """Hits of K caches along one request's path, in one gather.

  Args:
    present: bool[K, nodes], flag: uint8[K, nodes] (the caches' rows, `CacheBank`).
    pa: int64[L] the request's path (node ids by depth - 1); cap: the hit cap in units;
      old: how many leading units of pa existed before the request (`SeenTrie.last_old`; the
      others were created by it, so no cache holds them).

  Returns:
    Five lists of K ints: the length of the present prefix of pa[:cap] (an attention-only
    cache's hit), the depth of the deepest checkpoint in that prefix (a recurrent cache's hit
    and the checkpoint serving it; 0: none), the depth of the checkpoint above that one (0:
    none), the depth of the deepest checkpoint or branch above it (its chain's top when it is
    a leaf; 0: root), the first absent unit of the whole path (present nodes are
    prefix-closed, so present units along a path are a prefix).
  """
  k = present.shape[0]
  if old == 0:
    z = [0] * k
    return z, z, z, z, z
  pres = present[:, pa[:old]]
  first = np.where(pres[:, -1], old, pres.argmin(axis=1))
  m = max(min(cap, old), 0)
  f = np.minimum(first, m)
  depth = np.arange(1, m + 1)
  fl = flag[:, pa[:m]]
  on = (fl & _CKPT).astype(bool) & (depth <= f[:, None])
  idx = np.where(on, depth, 0)
  last = idx.max(axis=1, initial=0)
  rows = np.flatnonzero(last)
  idx[rows, last[rows] - 1] = 0
  prev = idx.max(axis=1, initial=0)
  top = np.where((fl != 0) & (depth < last[:, None]), depth, 0).max(axis=1, initial=0)
  return f.tolist(), last.tolist(), prev.tolist(), top.tolist(), first.tolist()


__all__ = ["CacheBank", "lookup"]
