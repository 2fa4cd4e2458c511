"""Marconi's simulator semantics (marconi_and_peers.md §1.1-1.4, §6.3), re-implemented fast.

Policies (the names of the CLI):
  marconi_compat_sglang        V1: leaf + branch states, LRU over leaves, whole path refreshed.
  marconi_compat_static:<a>    V3: FLOP-aware eviction with a fixed alpha.
  marconi_compat               V2: alpha = 0 until tuned once by replaying the bootstrap window
                               under V3 for alpha in {0, 0.1, ..., 2.0}.
  (marconi_compat_vllm, vLLM+, lives in `vllm_plus.py`.)

One tree holds KV and states; every non-root node = one recurrent checkpoint (the state after
its last token) + the KV of its edge. Requests replay strictly in order:
`match(input)` (recorded) then `insert(input + output)`; a logical clock advances by 1 on every
match, insert and evict call. Exactly as Marconi (quirks kept on purpose, §6.3):
- match walks children by first token; a child fully covered by the key adds its tokens to the
  reusable prefix; after a *partial* edge match the walk continues into that child's children
  with the rest of the key (so `prefix_len` and, rarely, the reusable count include tokens past
  the divergence). branch = prefix_len > reusable.
- insert charges `(2 if branch else 1) * state + KV(len - prefix_len)` and evicts
  `size + need - capacity` bytes first when `size + need > capacity`.
- V1 refreshes every node on the match/insert path; V2/V3 refresh only the last fully matched
  node on each match (the insert's own match too) and stamp new nodes.
- V2/V3 eviction: candidates = non-root nodes with <= 1 child in DFS (child insertion) order;
  utility = minmax(1 / (now - ts)) + alpha * minmax(FLOPs / bytes) with
  FLOPs = n_rec F_rec(L_e) + n_attn (F_attn(L) - F_attn(L_p)) + n_mlp (F_mlp(L) - F_attn(L_p)) and
  bytes = state + KV(L) (L = tokens root->node, L_e = edge, L_p = L - L_e); the first minimum is
  evicted, scores are recomputed after each victim. A leaf is deleted; a single-child node is
  merged into its child (only the state is freed). The loop's byte count for a leaf adds the edge
  KV of the *last candidate in DFS order*, not of the victim.
- the tuner's choice among alphas with equal FLOPs (Marconi's order is process-completion order)
  is the smallest alpha here.

Speed: the tree is over *symbols* (see `trace.py`), edges are NumPy views, V2/V3 score all
candidates with vectorised float64 arithmetic that is bit-identical to Marconi's Python floats
(all integers involved stay below 2**53; larger ones fall back to exact Python division).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from hybrid_cache.sim.cost_model import CostModel
from hybrid_cache.sim.trace import Request
from hybrid_cache.sim.trace import Trace

TUNER_ALPHAS = tuple(i / 10 for i in range(21))
TUNER_LAST_N = 500
_EXACT = float(2**53)


class _Node:
  __slots__ = ("children", "parent", "sym", "ntok", "ltot", "ts", "slot")

  def __init__(self, parent, sym, ntok, ltot, ts, slot):
    self.children: dict[int, _Node] = {}
    self.parent = parent
    self.sym = sym
    self.ntok = ntok
    self.ltot = ltot
    self.ts = ts
    self.slot = slot


def _common(edge: np.ndarray, key: np.ndarray, pos: int) -> int:
  """Length of the common prefix of `edge` and `key[pos:]` in symbols."""
  n = min(len(edge), len(key) - pos)
  if n == 1:
    return 1  # the first symbol matched through the children dict
  d = edge[:n] != key[pos : pos + n]
  i = int(d.argmax())
  return i if d[i] else n


def _normalize(v: np.ndarray) -> np.ndarray:
  if len(v) > 1:
    mn, mx = v.min(), v.max()
    if mn != mx:
      return (v - mn) / (mx - mn)
  return np.ones(len(v))


class MarconiTree:
  """Marconi's hybrid radix tree (V1, V2 or V3); see the module docstring.

  Args:
    model: cost model (`marconi_7b` reproduces Marconi's byte and FLOP formulas).
    capacity_bytes: the single byte budget for KV + states.
    version: 1 (SGLang+), 2 (Marconi, tuned alpha) or 3 (static alpha).
    alpha: the FLOP-efficiency weight (V3; V2 starts from it, Marconi uses 0).
    bootstrap_multiplier: V2's window = multiplier x requests seen at the first eviction.
  """

  def __init__(
    self,
    model: CostModel,
    capacity_bytes: float,
    version: int = 2,
    alpha: float = 0.0,
    bootstrap_multiplier: int = 5,
  ):
    if version not in (1, 2, 3):
      raise ValueError(f"version must be 1, 2 or 3, got {version!r}")
    if not capacity_bytes > 0:
      raise ValueError(f"capacity_bytes must be > 0, got {capacity_bytes!r}")
    self.model = model
    self.capacity = capacity_bytes
    self.version = version
    self.alpha = alpha
    self.bootstrap_multiplier = bootstrap_multiplier
    self.state_bytes = model.state_bytes
    self.now = 0
    self.root = _Node(None, None, 0, 0, 0, 0)
    self.num_nodes = 0
    self.total_tokens = 0
    self.history: list[tuple[bool, int, int]] = []
    self.num_reqs_before_eviction: int | None = None
    self.bootstrap_window: int | None = None
    self.tuned_alpha: float | None = None
    self.states_admitted = 0
    self.states_evicted = 0
    self._window: list[Request] = []
    # Slot arrays for vectorised V2/V3 scoring (slot 0 = root, never a candidate).
    cap = 1024
    self._nodes: list[_Node | None] = [self.root]
    self._free: list[int] = []
    self._ts = np.zeros(cap, np.int64)
    self._ltot = np.zeros(cap, np.int64)
    self._le = np.zeros(cap, np.int64)
    self._nch = np.zeros(cap, np.int64)
    self._alive = np.zeros(cap, bool)
    self._heap: list[tuple[int, int, _Node]] = []  # V1 leaves (lazy)
    self._seq = 0

  # ---- bookkeeping ----
  @property
  def tree_bytes(self) -> int:
    return self.num_nodes * self.state_bytes + self.model.kv_bytes(self.total_tokens)

  def _new_node(self, parent, sym, ntok, ltot, ts) -> _Node:
    if self._free:
      slot = self._free.pop()
    else:
      slot = len(self._nodes)
      self._nodes.append(None)
      if slot >= len(self._ts):
        n = 2 * len(self._ts)
        for name in ("_ts", "_ltot", "_le", "_nch", "_alive"):
          a = getattr(self, name)
          b = np.zeros(n, a.dtype)
          b[: len(a)] = a
          setattr(self, name, b)
    node = _Node(parent, sym, ntok, ltot, ts, slot)
    self._nodes[slot] = node
    self._ts[slot] = ts
    self._ltot[slot] = ltot
    self._le[slot] = ntok
    self._nch[slot] = 0
    self._alive[slot] = True
    self.num_nodes += 1
    self.states_admitted += 1
    return node

  def _drop_slot(self, node: _Node) -> None:
    self._alive[node.slot] = False
    self._nodes[node.slot] = None
    self._free.append(node.slot)
    self.num_nodes -= 1
    self.states_evicted += 1

  def _touch(self, node: _Node) -> None:
    node.ts = self.now
    self._ts[node.slot] = self.now

  def _push_leaf(self, node: _Node) -> None:
    if node is not self.root and not node.children:
      self._seq += 1
      heapq.heappush(self._heap, (node.ts, self._seq, node))

  # ---- match ----
  def match(self, key: np.ndarray, cum: np.ndarray, record: bool) -> tuple[int, int]:
    """Marconi's match_prefix: returns (reusable tokens, prefix_len tokens)."""
    self.now += 1
    v1 = self.version == 1
    node = self.root
    pos = 0
    n = len(key)
    reusable = 0
    last_full = None
    while True:
      if v1:
        self._touch(node)
      if pos == n:
        break
      child = node.children.get(int(key[pos]))
      if child is None:
        break
      m = _common(child.sym, key, pos)
      if m == len(child.sym):
        reusable += child.ntok
        last_full = child
      pos += m
      node = child
    prefix_len = int(cum[pos])
    if record:
      self.history.append((reusable > 0, int(cum[n]), reusable))
    if v1:
      self._push_leaf(node)
    elif last_full is not None:
      self._touch(last_full)
    return reusable, prefix_len

  # ---- insert ----
  def insert(self, key: np.ndarray, cum: np.ndarray) -> None:
    """Marconi's insert(input + output) with eviction first when the budget overflows."""
    self.now += 1
    if (
      self.version == 2
      and self.bootstrap_window is not None
      and len(self.history) == self.bootstrap_window
    ):
      self.alpha = self.tuned_alpha = tune_alpha(
        self._window, self.model, self.capacity, self.alpha
      )
    reusable, prefix_len = self.match(key, cum, record=False)
    need = (2 if prefix_len > reusable else 1) * self.state_bytes + self.model.kv_bytes(
      int(cum[-1]) - prefix_len
    )
    size = self.tree_bytes
    if size + need > self.capacity:
      self.evict(size + need - self.capacity)
    self._insert(key, cum)

  def _insert(self, key: np.ndarray, cum: np.ndarray) -> None:
    v1 = self.version == 1
    node = self.root
    pos = 0
    n = len(key)
    while True:
      if v1:
        self._touch(node)
      if pos == n:
        break
      child = node.children.get(int(key[pos]))
      if child is None:
        ntok = int(cum[n] - cum[pos])
        leaf = self._new_node(node, key[pos:], ntok, node.ltot + ntok, self.now)
        node.children[int(key[pos])] = leaf
        self._nch[node.slot] += 1
        self.total_tokens += ntok
        node = leaf
        break
      m = _common(child.sym, key, pos)
      if m == len(child.sym):
        if pos + m == n:
          break  # the sequence is already in the tree (child untouched)
        pos += m
        node = child
        continue
      # Split `child` after m symbols: the new node holds the branch state.
      mt = int(cum[pos + m] - cum[pos])
      mid = self._new_node(child.parent, child.sym[:m], mt, child.ltot - child.ntok + mt, self.now)
      node.children[int(key[pos])] = mid
      child.sym = child.sym[m:]
      child.ntok -= mt
      child.parent = mid
      mid.children[int(child.sym[0])] = child
      self._le[child.slot] = child.ntok
      self._nch[mid.slot] = 1
      pos += m
      node = mid
    if v1:
      self._push_leaf(node)

  # ---- eviction ----
  def evict(self, bytes_to_remove) -> None:
    self.now += 1
    if self.num_reqs_before_eviction is None:
      self.num_reqs_before_eviction = len(self.history)
      self.bootstrap_window = self.bootstrap_multiplier * len(self.history)
    if self.version == 1:
      self._evict_v1(bytes_to_remove)
    else:
      self._evict_v2(bytes_to_remove)

  def _delete_leaf(self, leaf: _Node) -> _Node:
    parent = leaf.parent
    del parent.children[int(leaf.sym[0])]
    self._nch[parent.slot] -= 1
    self.total_tokens -= leaf.ntok
    self._drop_slot(leaf)
    return parent

  def _evict_v1(self, bytes_to_remove) -> None:
    evicted = 0
    per_state = self.state_bytes
    kv = self.model.kv_bytes_per_token
    while evicted < bytes_to_remove and self._heap:
      ts, _, node = heapq.heappop(self._heap)
      if self._nodes[node.slot] is not node or node.children or node.ts != ts:
        continue  # stale entry
      evicted += per_state + kv * node.ntok
      parent = self._delete_leaf(node)
      if parent is not self.root and not parent.children:
        self._push_leaf(parent)

  def _scores(self, idx: np.ndarray) -> np.ndarray:
    m = self.model
    lt = self._ltot[idx]
    le = self._le[idx]
    lp = lt - le
    fl_attn_p = m.attn_flops(lp)
    flops = (
      m.n_recurrent * m.recurrent_flops(le)
      + m.n_attn * (m.attn_flops(lt) - fl_attn_p)
      + m.n_mlp * (m.mlp_flops(lt) - fl_attn_p)
    )
    if m.n_swa:
      flops = flops + m.n_swa * (m.swa_flops(lt) - m.swa_flops(lp))
    mem = self.state_bytes + m.kv_bytes(lt)
    if np.abs(flops).max() < _EXACT and mem.max() < _EXACT:
      eff = flops.astype(np.float64) / mem.astype(np.float64)
    else:  # exact Python int division, as Marconi
      eff = np.array([int(a) / int(b) for a, b in zip(flops.tolist(), mem.tolist())])
    rec = 1 / (self.now - self._ts[idx])
    return self.alpha * _normalize(eff) + _normalize(rec)

  def _dfs_key(self, node: _Node) -> tuple[int, ...]:
    path = []
    while node.parent is not None:
      path.append(list(node.parent.children).index(int(node.sym[0])))
      node = node.parent
    return tuple(reversed(path))

  def _evict_v2(self, bytes_to_remove) -> None:
    evicted = 0
    n_slots = len(self._nodes)
    kv = self.model.kv_bytes_per_token
    while evicted < bytes_to_remove and self.num_nodes > 0:
      n_slots = len(self._nodes)
      idx = np.flatnonzero(self._alive[:n_slots] & (self._nch[:n_slots] <= 1))
      s = self._scores(idx)
      ties = idx[s == s.min()]
      if len(ties) == 1:
        victim = self._nodes[int(ties[0])]
      else:
        victim = min((self._nodes[int(t)] for t in ties), key=self._dfs_key)
      if not victim.children:
        last = self.root  # Marconi adds the KV of the last candidate in DFS order
        while last.children:
          last = next(reversed(last.children.values()))
        evicted += self.state_bytes + kv * last.ntok
        self._delete_leaf(victim)
      else:
        evicted += self.state_bytes
        self._merge_into_child(victim)

  def _merge_into_child(self, node: _Node) -> None:
    (child,) = node.children.values()
    parent = node.parent
    child.sym = np.concatenate([node.sym, child.sym])
    child.ntok += node.ntok
    child.parent = parent
    child.ts = max(node.ts, child.ts)
    parent.children[int(node.sym[0])] = child
    self._ts[child.slot] = child.ts
    self._le[child.slot] = child.ntok
    self._drop_slot(node)

  # ---- driver ----
  def step(self, req: Request) -> tuple[bool, int, int]:
    """Replays one request; returns its (hit, input tokens, reused tokens) record."""
    n_in = req.num_input_symbols
    if (
      self.version == 2
      and self.bootstrap_window is None
      or (self.version == 2 and len(self.history) < (self.bootstrap_window or 0))
    ):
      self._window.append(req)
    self.match(req.seq[:n_in], req.cum[: n_in + 1], record=True)
    self.insert(req.seq, req.cum)
    return self.history[-1]


def replay(tree: MarconiTree, requests: Sequence[Request]) -> list[tuple[bool, int, int]]:
  return [tree.step(r) for r in requests]


def tune_alpha(window: Sequence[Request], model: CostModel, capacity, default: float) -> float:
  """Marconi's one-shot tuner: replay `window` under V3 per alpha, keep the max FLOPs saved
  over the last 500 replayed requests (ties: the smallest alpha)."""
  best, best_flops = default, None
  for a in TUNER_ALPHAS:
    t = MarconiTree(model, capacity, version=3, alpha=a)
    t.now = 1  # Marconi snapshots the tree after the first match's clock tick
    hist = replay(t, window)[-TUNER_LAST_N:]
    flops = sum(model.prefill_flops(r) for _, _, r in hist if r)
    if best_flops is None or flops > best_flops:
      best, best_flops = a, flops
  return best


def run_marconi(
  trace: Trace,
  model: CostModel,
  capacity_bytes: float,
  version: int,
  alpha: float = 0.0,
  bootstrap_multiplier: int = 5,
) -> tuple[list[tuple[bool, int, int]], MarconiTree]:
  """Replays a trace; returns the per-request triples and the final tree."""
  tree = MarconiTree(model, capacity_bytes, version, alpha, bootstrap_multiplier)
  return replay(tree, trace.requests), tree
