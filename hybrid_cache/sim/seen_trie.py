"""The trie of every unit any request has computed, shared by the caches of a replay.

Part of the checkpoint cache (`checkpoint_cache.py`, issue 15, item 2). Content is a trie of
U-token *units* (`SeenTrie`: node k of a request covers tokens [kU, (k+1)U); a node is named by
its parent and a 64-bit hash of its U tokens, as vLLM names a block by its chained hash). A
request's computed tokens are its input + output - 1 (the last sampled token is never computed,
as in `core_sim.py`); only whole units are cached. The trie holds what was seen, whether a cache
keeps it or not: the caches keep their own per-node state (`cache_bank.CacheBank`), and the
placement statistics read the trie (`SeenTrie.reach_prior`, `SeenTrie.reused_from`).

Layout for speed: the trie and its flat array of walked paths are shared by every cache of a
replay, so the nearest checkpoint or branch above a node is one gather over its ancestors
(`SeenTrie.ancestors`) instead of a pointer chase.
"""

from __future__ import annotations

import numpy as np

from hybrid_cache.hashing import mix64
from hybrid_cache.sim.trace import Request
from hybrid_cache.sim.vllm_plus import request_tokens

_MASK64 = (1 << 64) - 1
NEVER_REUSED = np.iinfo(np.int64).max  # `SeenTrie.reused_from` of a node not reused
_SEED = 0x5EED_C4EC  # fixed: unit hashes are identical across runs
_ROOT = -1


def grown(a: np.ndarray, n: int, fill=0) -> np.ndarray:
  """`a` if it holds >= n entries, else a copy at least n long (capacity doubles), the new
  entries `fill`: the per-node arrays that grow with the trie."""
  if n <= len(a):
    return a
  out = np.full(max(n, 2 * len(a)), fill, a.dtype)
  out[: len(a)] = a
  return out


def unit_hashes(tokens: np.ndarray, unit: int, weights: np.ndarray) -> list[int]:
  """64-bit hash of each whole `unit`-token chunk of `tokens` (a random linear form, mixed).

  Per unit, not per prefix (`hashing.block_hashes`, `core_scan._prefix_hashes`): `SeenTrie`
  keys a node by its parent and this hash, which chains it (`hashing.py` on the three schemes).
  """
  n = len(tokens) // unit
  if n == 0:
    return []
  t = np.asarray(tokens[: n * unit], np.int64).astype(np.uint64).reshape(n, unit)
  with np.errstate(over="ignore"):
    h = (t * weights[None, :unit]).sum(axis=1, dtype=np.uint64)
    return mix64(h + np.uint64(unit)).tolist()


class SeenTrie:
  """Every unit any request has computed (whether a cache holds it or not).

  Node ids are dense ints; `depth[n]` = units from the root through n (>= 1), `parent[n]`
  (_ROOT = -1 for depth 1), `out[n]` = the node was first computed inside its creator's output.
  Every walked path is also appended to `flat` (int64, all paths end to end) and `home[n]` is the
  offset in `flat` of the path that created n, so n's ancestors are the array view
  `flat[home[n] : home[n] + depth[n] - 1]` (ancestor at depth k at index k - 1): the caches find
  the nearest checkpoint or branch above a node with one numpy gather (`ancestors`), not a
  pointer chase.
  """

  def __init__(self, unit: int):
    self.unit = unit
    self.children: dict[int, int] = {}
    self.parent: list[int] = []
    self.depth: list[int] = []
    self.out: list[bool] = []
    self.home: list[int] = []
    self.flat = np.zeros(1 << 12, np.int64)
    self.flat_len = 0
    self._last: tuple[list[int] | None, np.ndarray] = (None, self.flat[:0])
    self.last_old = 0  # units of the last walked path that existed before it (a prefix)
    # per node: the first request that was served by it in the keep-everything cache after it
    # was superseded (`adaptive_stats.SupersessionStats`; NEVER_REUSED until then):
    # retirement keeps such a checkpoint from that request on (`UnitCache._retire`)
    self.reused_from = np.full(1 << 12, NEVER_REUSED, np.int64)
    self.pending: dict[int, int] = {}  # candidate point -> kind, until a later request passes it
    self.placed: dict[int, float] = {}
    self.reached: dict[int, float] = {}
    rng = np.random.default_rng(_SEED)
    self.weights = rng.integers(1, 2**63, size=unit, dtype=np.int64).astype(np.uint64)
    self.weights |= np.uint64(1)

  def __len__(self) -> int:
    return len(self.parent)

  def register(self, node: int, kind: int) -> None:
    """Records a candidate checkpoint point of `kind` (counted once per node)."""
    if node not in self.pending:
      self.pending[node] = kind
      self.placed[kind] = self.placed.get(kind, 0.0) + 1.0

  def reach_prior(self, kind: int) -> float:
    """(passed + 1) / (registered + 2): how often a point of `kind` was passed later."""
    return (self.reached.get(kind, 0.0) + 1.0) / (self.placed.get(kind, 0.0) + 2.0)

  def ancestors(self, n: int) -> np.ndarray:
    """int64[depth[n] - 1]: the strict ancestors of node n, root side first (a view)."""
    s = self.home[n]
    return self.flat[s : s + self.depth[n] - 1]

  def path_array(self, path: list[int]) -> np.ndarray:
    """int64[len(path)] of a path (the stored view when `path` is the last walked one)."""
    last, arr = self._last
    return arr if path is last else np.asarray(path, np.int64)

  def existed(self, path: list[int]) -> int:
    """How many leading units of `path` existed before it was walked (all, if it is not the
    last walked path)."""
    return self.last_old if path is self._last[0] else len(path)

  def walk(self, req: Request) -> tuple[list[int], int]:
    """Node ids of r's computed units (creating new ones) and how many of its input units
    (up to the hit cap) existed before r."""
    toks = request_tokens(req)
    n_in = req.num_input_tokens
    n_comp = n_in + max(req.num_output_tokens - 1, 0)
    hs = unit_hashes(toks[:n_comp], self.unit, self.weights)
    cap = (n_in - 1) // self.unit
    path: list[int] = []
    seen = 0
    node = _ROOT
    ch = self.children
    start = self.flat_len
    old = -1
    for k, h in enumerate(hs):
      key = ((node + 1) << 64) | h
      nxt = ch.get(key)
      if nxt is None:
        if old < 0:
          old = k
        nxt = len(self.parent)
        ch[key] = nxt
        self.parent.append(node)
        self.depth.append(k + 1)
        self.out.append((k + 1) * self.unit > n_in)
        self.home.append(start)
      elif k < cap and seen == k:
        seen = k + 1
      path.append(nxt)
      node = nxt
    self.reused_from = grown(self.reused_from, len(self.parent), NEVER_REUSED)
    end = start + len(path)
    self.flat = grown(self.flat, end)
    self.flat[start:end] = path
    self.flat_len = end
    self._last = (path, self.flat[start:end])
    self.last_old = len(path) if old < 0 else old
    if self.pending:
      for k in range(seen):
        kind = self.pending.pop(path[k], None)
        if kind is not None:
          self.reached[kind] = self.reached.get(kind, 0.0) + 1.0
    return path, seen


__all__ = ["NEVER_REUSED", "SeenTrie", "grown", "unit_hashes"]
