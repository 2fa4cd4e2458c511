"""Marconi's vLLM+ baseline (`marconi_compat_vllm`) on a compressed block tree.

Semantics (Marconi's `radix_cache_vllm.py`, marconi_and_peers.md §1.2, §1.7, §6.2): a trie of
token blocks of `block_size` (32) tokens; every block node holds one recurrent state + its KV;
the last block of a sequence may be partial (< block_size tokens) and is then a leaf.
- match(input): from the root, descend into the child whose key equals the next full block;
  when none does, the first child (in the parent's insertion order) that is a *partial* block
  and a prefix of the rest is matched and the walk stops. Reused = tokens of matched blocks.
  The root and every matched *full* block get timestamp `now` (a matched partial block does not).
- insert(input + output): clock +1, then a match (clock +1, same refreshes); bytes needed =
  (n - B * accessed) / B states + KV(n - B * accessed) with `accessed` = matched blocks + 1 (the
  root), as floats exactly as Marconi; if size + need > capacity, evict the excess first; then
  walk: descend into a child whose key is a prefix of the rest and whose common prefix with the
  rest is the largest among the children (a partial block is filled up to B tokens, re-keyed,
  hence moved last in its parent's order); otherwise add new blocks. Every visited or new block
  gets `now`.
- evict(bytes): clock +1; pop leaf blocks in timestamp order (LRU; timestamps are
  non-increasing from a node to its descendants, and two leaves never share one) counting
  state + KV(block tokens) each, until the count reaches the request; a parent whose last child
  goes becomes a leaf.
- each request: match(input) (recorded as [hit, input, reused]) then insert(input + output).

Representation: a radix tree of *edges*, each a run of blocks (int64 tokens, a per-block
int64 timestamp array); children split into `full` (keyed by the first block's bytes) and
`part` (single partial-block edges, in insertion order). Eviction takes the LRU leaf edge and
removes, in one step, its tail blocks that share the tail's timestamp (they would be popped one
after the other). This gives the same answers as the one-node-per-block tree
(`tests/hybrid_cache/sim/vllm_plus_test.py` checks it against a literal version).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np

from hybrid_cache.sim.cost_model import CostModel
from hybrid_cache.sim.trace import Request
from hybrid_cache.sim.trace import Trace

VLLM_PLUS_BLOCK = 32


class _Edge:
  __slots__ = ("tok", "ts", "parent", "full", "part", "alive")

  def __init__(self, tok: np.ndarray, ts: np.ndarray, parent: _Edge | None):
    self.tok = tok
    self.ts = ts
    self.parent = parent
    self.full: dict[bytes, _Edge] = {}
    self.part: dict[bytes, _Edge] = {}
    self.alive = True

  def has_children(self) -> bool:
    return bool(self.full) or bool(self.part)


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
  n = min(len(a), len(b))
  if n == 0:
    return 0
  d = a[:n] != b[:n]
  i = int(d.argmax())
  return i if d[i] else n


def request_tokens(req: Request) -> np.ndarray:
  """int64 tokens of input + output (the token-level expansion of `trace.py`)."""
  widths = np.diff(req.cum)
  if len(widths) == int(req.cum[-1]):  # one symbol per token
    return req.seq
  return np.repeat(req.seq - req.cum[:-1], widths) + np.arange(req.cum[-1], dtype=np.int64)


class VllmPlusTree:
  """Marconi's vLLM+ block tree (see module docstring).

  Args:
    model: cost model (state bytes = n_recurrent * state_bytes_per_layer, KV per token).
    capacity_bytes: the single byte budget for KV + states.
    block_size: tokens per block (Marconi: 32).
  """

  def __init__(self, model: CostModel, capacity_bytes: float, block_size: int = VLLM_PLUS_BLOCK):
    if not capacity_bytes > 0:
      raise ValueError(f"capacity_bytes must be > 0, got {capacity_bytes!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
      raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
    self.model = model
    self.capacity = capacity_bytes
    self.B = block_size
    self.state_bytes = model.state_bytes
    self.now = 0
    self.root = _Edge(np.zeros(0, np.int64), np.zeros(0, np.int64), None)
    self.num_blocks = 0
    self.num_tokens = 0
    self.states_admitted = 0
    self.states_evicted = 0
    self.history: list[tuple[bool, int, int]] = []
    self._heap: list[tuple[int, int, _Edge]] = []
    self._seq = 0

  # ---- bookkeeping ----
  @property
  def tree_bytes(self) -> int:
    return self.num_blocks * self.state_bytes + self.model.kv_bytes(self.num_tokens)

  def _nb(self, e: _Edge) -> int:
    return len(e.ts)

  def _push(self, e: _Edge) -> None:
    if e is not self.root and not e.has_children() and len(e.ts):
      self._seq += 1
      heapq.heappush(self._heap, (int(e.ts[-1]), self._seq, e))

  def _touch(self, e: _Edge, k: int) -> None:
    """Refreshes the first k blocks of `e`."""
    if k <= 0:
      return
    e.ts[:k] = self.now
    if k == len(e.ts):
      self._push(e)

  def _key(self, tok: np.ndarray) -> tuple[bool, bytes]:
    """(is_full, dict key) of an edge whose tokens are `tok`."""
    if len(tok) >= self.B:
      return True, tok[: self.B].tobytes()
    return False, tok.tobytes()

  def _attach(self, parent: _Edge, e: _Edge) -> None:
    e.parent = parent
    full, k = self._key(e.tok)
    (parent.full if full else parent.part)[k] = e

  def _detach(self, e: _Edge) -> None:
    full, k = self._key(e.tok)
    del (e.parent.full if full else e.parent.part)[k]

  def _new_edge(self, parent: _Edge, tok: np.ndarray) -> _Edge:
    nb = -(-len(tok) // self.B)
    e = _Edge(np.array(tok, np.int64), np.full(nb, self.now, np.int64), parent)
    self._attach(parent, e)
    self.num_blocks += nb
    self.num_tokens += len(tok)
    self.states_admitted += nb
    self._push(e)
    return e

  # ---- match ----
  def match(self, key: np.ndarray, record: bool) -> tuple[int, int]:
    """Marconi's match_prefix: returns (reused tokens, nodes accessed incl. the root)."""
    self.now += 1
    B = self.B
    node, pos, n = self.root, 0, len(key)
    reused, accessed = 0, 1
    while True:
      c = node.full.get(key[pos : pos + B].tobytes()) if n - pos >= B else None
      if c is not None:
        L = len(c.tok)
        i = _lcp(c.tok, key[pos:])
        if i == L:
          self._touch(c, L // B)  # a partial tail block is not refreshed
          reused += L
          accessed += len(c.ts)
          pos += L
          if L % B:
            break
          node = c
          continue
        k = i // B
        self._touch(c, k)
        reused += k * B
        accessed += k
        break
      rest = key[pos:]
      for p in node.part.values():
        if len(p.tok) <= len(rest) and np.array_equal(p.tok, rest[: len(p.tok)]):
          reused += len(p.tok)
          accessed += 1
          break
      break
    if record:
      self.history.append((reused > 0, n, reused))
    return reused, accessed

  # ---- insert ----
  def insert(self, seq: np.ndarray) -> None:
    self.now += 1
    _, accessed = self.match(seq, record=False)
    m = self.model
    extra = len(seq) - self.B * accessed
    need = extra / self.B * m.n_recurrent * m.state_bytes_per_layer + m.kv_bytes(extra)
    size = self.tree_bytes
    if size + need > self.capacity:
      self.evict(size + need - self.capacity)
    self._insert(seq)

  def _extend(self, c: _Edge, more: np.ndarray) -> None:
    """Fills c's partial tail block and appends `more` tokens (all blocks refreshed)."""
    B = self.B
    if len(more) == 0:
      c.ts[:] = self.now
      self._push(c)
      return
    rekey = len(c.ts) == 1  # the partial block is c's first block: its key changes
    if rekey:
      self._detach(c)
    old_nb = len(c.ts)
    c.tok = np.concatenate([c.tok, more])
    nb = -(-len(c.tok) // B)
    c.ts = np.full(nb, self.now, np.int64)
    self.num_blocks += nb - old_nb
    self.num_tokens += len(more)
    self.states_admitted += nb - old_nb
    if rekey:
      self._attach(c.parent, c)  # moves it last in the parent's order
    self._push(c)

  def _split(self, c: _Edge, k: int) -> None:
    """Cuts c after its first k blocks (0 < k < blocks); the rest becomes c's only child."""
    B = self.B
    c2 = _Edge(c.tok[k * B :], c.ts[k:].copy(), c)
    c2.full, c2.part = c.full, c.part
    for ch in (*c2.full.values(), *c2.part.values()):
      ch.parent = c2
    c.tok, c.ts = c.tok[: k * B], c.ts[:k].copy()
    c.full, c.part = {}, {}
    self._attach(c, c2)
    self._push(c2)

  def _insert(self, seq: np.ndarray) -> None:
    B = self.B
    node, pos, n = self.root, 0, len(seq)
    while pos < n:
      c = node.full.get(seq[pos : pos + B].tobytes()) if n - pos >= B else None
      if c is not None:
        L = len(c.tok)
        i = _lcp(c.tok, seq[pos:])
        if i == L:
          if L % B == 0:
            self._touch(c, len(c.ts))
            pos += L
            node = c
            continue
          self._extend(c, seq[pos + L :])
          return
        k = i // B
        self._touch(c, k)
        if pos + k * B == n:
          return
        self._split(c, k)
        self._new_edge(c, seq[pos + k * B :])
        return
      rest = seq[pos:]
      cand = None
      for p in node.part.values():
        lp = len(p.tok)
        if lp <= len(rest) and (cand is None or lp > len(cand.tok)):
          if np.array_equal(p.tok, rest[:lp]):
            cand = p
      if cand is not None and self._is_max(node, cand, rest):
        self._extend(cand, rest[len(cand.tok) :])
        return
      self._new_edge(node, rest)
      return

  def _is_max(self, node: _Edge, cand: _Edge, rest: np.ndarray) -> bool:
    """No other child of `node` shares more than len(cand) tokens with `rest`."""
    p = len(cand.tok)
    if len(rest) == p:
      return True
    head = rest[: p + 1]
    for e in (*node.full.values(), *node.part.values()):
      if e is not cand and len(e.tok) > p and np.array_equal(e.tok[: p + 1], head):
        return False
    return True

  # ---- eviction ----
  def evict(self, bytes_to_remove) -> None:
    self.now += 1
    B = self.B
    per_state = self.state_bytes
    kv = self.model.kv_bytes_per_token
    full_block = per_state + kv * B
    evicted = 0
    while evicted < bytes_to_remove and self._heap:
      t, _, e = heapq.heappop(self._heap)
      if not e.alive or e.has_children() or not len(e.ts) or int(e.ts[-1]) != t:
        continue  # stale
      nb = len(e.ts)
      seg = int(np.searchsorted(-e.ts, -t, side="left"))  # first block with ts == t
      tail = len(e.tok) - B * (nb - 1)
      evicted += per_state + kv * tail
      cnt = 1
      m = nb - 1 - seg
      if m > 0 and evicted < bytes_to_remove:
        k = max(1, math.ceil((bytes_to_remove - evicted) / full_block))
        while k > 1 and evicted + (k - 1) * full_block >= bytes_to_remove:
          k -= 1
        while k < m and evicted + k * full_block < bytes_to_remove:
          k += 1
        k = min(k, m)
        evicted += k * full_block
        cnt += k
      keep = nb - cnt
      removed_tokens = len(e.tok) - B * keep
      self.num_blocks -= cnt
      self.num_tokens -= removed_tokens
      self.states_evicted += cnt
      if keep == 0:
        self._detach(e)
        e.alive = False
        parent = e.parent
        if parent is not self.root and not parent.has_children():
          self._push(parent)
      else:
        tok = e.tok[: B * keep]
        if tok.base is not None and 2 * len(tok) < len(tok.base):
          tok = tok.copy()
        e.tok, e.ts = tok, e.ts[:keep]
        self._push(e)

  # ---- driver ----
  def step(self, req: Request) -> tuple[bool, int, int]:
    """Replays one request; returns its (hit, input tokens, reused tokens) record."""
    seq = request_tokens(req)
    self.match(seq[: req.num_input_tokens], record=True)
    self.insert(seq)
    return self.history[-1]


def run_vllm_plus(
  trace: Trace | Sequence[Request],
  model: CostModel,
  capacity_bytes: float,
  block_size: int = VLLM_PLUS_BLOCK,
) -> tuple[list[tuple[bool, int, int]], VllmPlusTree]:
  """Replays a trace under vLLM+; returns the per-request triples and the final tree."""
  reqs = trace.requests if isinstance(trace, Trace) else trace
  tree = VllmPlusTree(model, capacity_bytes, block_size)
  for r in reqs:
    tree.step(r)
  return tree.history, tree
