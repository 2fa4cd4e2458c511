"""A prefix cache whose recurrent checkpoints sit at multiples of a unit U, decoupled from KV pages.

Issue 15, item 2. vLLM keeps a recurrent state only where a chunk ends on a KV block boundary
and pads the state to a KV page; the kernels can emit a state at any chunk boundary (64 tokens)
at no extra compute, so here:

- Content is a trie of U-token *units* (`SeenTrie`: node k of a request covers tokens
  [kU, (k+1)U); a node is named by its parent and a 64-bit hash of its U tokens, as vLLM names a
  block by its chained hash). A request's computed tokens are its input + output - 1 (the last
  sampled token is never computed, as in `core_sim.py`); only whole units are cached.
- A cache holds, per node, the full-attention KV of the unit (*present* nodes are prefix-closed)
  and optionally a *checkpoint* (the recurrent state after the unit, plus the sliding-window KV
  of the last `swa_window` tokens when the model has sliding-window layers).
- A hit of request r is the deepest depth d <= (input - 1) // U such that the first d units are
  present and (recurrent models) node d - 1 holds a checkpoint: hits are multiples of U, capped
  at input - 1 tokens (the last prompt token is always computed, as in vLLM). Models without
  recurrent layers hit at the deepest present unit.
- Bytes are exact, one capacity for both kinds: checkpoints cost `ckpt_bytes` each (never padded
  to a page) and KV is allocated in pages of B tokens (`block_size`). A page is shared by the
  branches that agree on all of its cached tokens; branches that diverge inside a page each hold
  a copy, and a branch that ends inside a page holds a whole page. With N_j = the present nodes
  in which page j ends plus the present leaves that end inside a page, KV bytes =
  kv_bytes_per_token * B * sum N_j (`_node_pages`). B = 1 is token-exact KV.
- A request's life is `admit` (lookup, at its admission) then `finish` (insertion, when it has
  computed everything); `serve` = both, the sequential replay of the other simulators. At r's
  admission the cache (everything but the hit paths of the running requests, which are pinned:
  `pin` counts the running requests whose hit path holds a node) is evicted until cache + the
  working sets of the running requests and r's fit the capacity (a working set: the KV pages of
  the request's tokens after the last whole page of its hit, and one running state), so a
  policy never holds more than the capacity, its running requests included. At r's finish, the
  *placement* rule picks the depths that get a checkpoint; the KV of r's path up to the deepest
  one is kept (KV past the last checkpoint cannot serve a recurrent hit and is dropped); r's
  working set is released and the cache is evicted to the capacity minus the working sets still
  running. With one request at a time (sequential) nothing else is pinned or reserved.
- Admission control (`can_admit`, the concurrent replay): a request waits unless the capacity
  covers the running working sets, a bound on the running requests' pinned hit paths (whole
  pages of the hit + its path's checkpoints, summed without sharing) and its own working set
  without a hit, so the eviction at its admission always fits (recurrent models: once every
  unpinned checkpoint is evicted, only the pinned paths remain).

Eviction is chain-aware GreedyDual (Cao & Irani's GreedyDual-Size-Frequency): the unit is a
checkpoint plus, when it is a leaf, the KV back to the previous checkpoint or branch point
(Marconi's evictable node); an interior checkpoint frees only its state. Its priority is
stamp + w, stamp = the clock when it was inserted or last served a hit (the deepest checkpoint
of a hit path serves it; a change of its unit's shape re-weights it at the same stamp), with

  w = (1 + hits) * p_kind * (eff / eff_ref) ** alpha,  eff = (F(d U) - F(a U)) / bytes,

F = `prefill_flops`, a = the depth of the previous checkpoint on the path (what a hit falls back
to without this one), bytes = what evicting it frees, eff_ref the running mean of eff,
p_kind the prior that a point of its placement kind is passed later (`SeenTrie.reach_prior`), the
clock = the priority of the last eviction (so equal weights evict in LRU order, alpha = 0 is
recency and frequency only, larger alpha favours FLOPs saved per byte).

The replay is online: what happens at request r depends only on requests 0..r (no trace-wide
statistic is read), so replaying a prefix of a trace gives the prefix of the full replay.
"""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np

from hybrid_cache.sim.cost_model import ModelConfig
from hybrid_cache.sim.trace import Request
from hybrid_cache.sim.vllm_plus import request_tokens

_MASK64 = (1 << 64) - 1
_SEED = 0x5EED_C4EC  # fixed: unit hashes are identical across runs
_ROOT = -1
PRIORS = ("hits", "reach", "none")


def _mix64(x: np.ndarray) -> np.ndarray:
  """splitmix64's finaliser on uint64 (wrapping arithmetic)."""
  x = x ^ (x >> np.uint64(30))
  x = x * np.uint64(0xBF58476D1CE4E5B9)
  x = x ^ (x >> np.uint64(27))
  x = x * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


def unit_hashes(tokens: np.ndarray, unit: int, weights: np.ndarray) -> list[int]:
  """64-bit hash of each whole `unit`-token chunk of `tokens` (a random linear form, mixed)."""
  n = len(tokens) // unit
  if n == 0:
    return []
  t = np.asarray(tokens[: n * unit], np.int64).astype(np.uint64).reshape(n, unit)
  with np.errstate(over="ignore"):
    h = (t * weights[None, :unit]).sum(axis=1, dtype=np.uint64)
    return _mix64(h + np.uint64(unit)).tolist()


class SeenTrie:
  """Every unit any request has computed (whether a cache holds it or not).

  Node ids are dense ints; `depth[n]` = units from the root through n (>= 1), `parent[n]`
  (_ROOT = -1 for depth 1), `out[n]` = the node was first computed inside its creator's output.
  """

  def __init__(self, unit: int):
    self.unit = unit
    self.children: dict[int, int] = {}
    self.parent: list[int] = []
    self.depth: list[int] = []
    self.out: list[bool] = []
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
    for k, h in enumerate(hs):
      key = ((node + 1) << 64) | h
      nxt = ch.get(key)
      if nxt is None:
        nxt = len(self.parent)
        ch[key] = nxt
        self.parent.append(node)
        self.depth.append(k + 1)
        self.out.append((k + 1) * self.unit > n_in)
      elif k < cap and seen == k:
        seen = k + 1
      path.append(nxt)
      node = nxt
    if self.pending:
      for k in range(seen):
        kind = self.pending.pop(path[k], None)
        if kind is not None:
          self.reached[kind] = self.reached.get(kind, 0.0) + 1.0
    return path, seen


@dataclasses.dataclass(frozen=True)
class CacheSizes:
  """Byte model of a cache (see the module docstring)."""

  capacity: int
  unit: int
  block_size: int
  kv_page_bytes: int  # kv_bytes_per_token * block_size
  ckpt_bytes: int  # recurrent state (+ one window of sliding-window KV); 0 = attention only

  @classmethod
  def of(cls, model: ModelConfig, capacity_bytes: float, unit: int, block_size: int):
    for name, v in (("unit", unit), ("block_size", block_size)):
      if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if not (capacity_bytes > 0 and np.isfinite(capacity_bytes)):
      raise ValueError(f"capacity_bytes must be finite and > 0, got {capacity_bytes!r}")
    ckpt = int(model.state_bytes) + int(model.swa_kv_bytes_per_token) * int(model.swa_window)
    return cls(
      int(capacity_bytes),
      int(unit),
      int(block_size),
      int(model.kv_bytes_per_token) * int(block_size),
      ckpt,
    )

  @property
  def recurrent(self) -> bool:
    """A hit needs a checkpoint at its depth (recurrent or sliding-window layers)."""
    return self.ckpt_bytes > 0


class UnitCache:
  """One cache over a shared `SeenTrie` (per-node arrays indexed by trie node id)."""

  def __init__(
    self,
    trie: SeenTrie,
    sizes: CacheSizes,
    model: ModelConfig,
    alpha: float | None,
    prior: str = "hits",
    frequency: bool = True,
  ):
    """alpha: the eviction weight's exponent (>= 0); None = plain LRU (every weight 1).
    prior: "hits" (share of this cache's checkpoints of the kind that served a hit), "reach"
    (share of the kind's candidate points a later request passed, `SeenTrie.reach_prior`) or
    "none"; frequency: multiply by 1 + hits."""
    if prior not in PRIORS:
      raise ValueError(f"prior must be one of {PRIORS}, got {prior!r}")
    self.trie, self.sizes, self.model = trie, sizes, model
    self.alpha, self.prior, self.frequency = alpha, prior, frequency
    self.present: list[bool] = []
    self.nchild: list[int] = []
    self.ckpt: list[bool] = []
    self.ver: list[int] = []
    self.hits: list[int] = []
    self.kind: list[int] = []
    self.pin: list[int] = []  # running requests whose hit path holds the node
    self.reserved = 0  # working sets of the running requests (bytes)
    self.pinned_bound = 0  # bound on their pinned hit paths (bytes, module doc)
    self.running: dict[int, tuple[list[int], int, int, int]] = {}  # r -> path, d, work, bound
    self.stamp: list[float] = []  # the clock when checkpoint n was last inserted or hit
    self.root_children = 0
    self.pages = 0
    self.nckpt = 0
    self.heap: list = []
    self.clock = 0.0
    self.seq = 0
    self.eff_sum, self.eff_n = 0.0, 0
    self.kind_placed: dict[int, float] = {}
    self.kind_hit: dict[int, float] = {}
    self.evicted_ckpts = 0
    self.admitted_ckpts = 0
    self._flops_cache: dict[int, int] = {}

  # ---- sizes ----
  def _grow(self) -> None:
    n = len(self.trie) - len(self.present)
    if n > 0:
      self.present += [False] * n
      self.nchild += [0] * n
      self.ckpt += [False] * n
      self.ver += [0] * n
      self.hits += [0] * n
      self.kind += [0] * n
      self.pin += [0] * n
      self.stamp += [0.0] * n

  @property
  def used(self) -> int:
    return self.pages * self.sizes.kv_page_bytes + self.nckpt * self.sizes.ckpt_bytes

  def _node_pages(self, n: int, leaf: bool) -> int:
    """Pages charged to present node n: pages ending in it (+1 if a leaf ending mid-page)."""
    u, b = self.sizes.unit, self.sizes.block_size
    end = self.trie.depth[n] * u
    k = end // b - (end - u) // b
    return k + (1 if leaf and end % b else 0)

  def _leaf_bonus(self, n: int) -> int:
    return 1 if (self.trie.depth[n] * self.sizes.unit) % self.sizes.block_size else 0

  def _add_node(self, n: int, refresh: list[int]) -> None:
    p = self.trie.parent[n]
    if p == _ROOT:
      self.root_children += 1
    else:
      if self.nchild[p] == 0:
        self.pages -= self._leaf_bonus(p)
        if self.ckpt[p]:
          refresh.append(p)  # no longer a leaf: its unit is now its state alone
      self.nchild[p] += 1
    self.present[n] = True
    self.pages += self._node_pages(n, True)

  def _remove_leaf(self, n: int) -> None:
    self.present[n] = False
    self.pages -= self._node_pages(n, True)
    p = self.trie.parent[n]
    if p == _ROOT:
      self.root_children -= 1
    else:
      self.nchild[p] -= 1
      if self.nchild[p] == 0:
        self.pages += self._leaf_bonus(p)

  def flops(self, depth: int) -> int:
    f = self._flops_cache.get(depth)
    if f is None:
      f = int(self.model.prefill_flops(depth * self.sizes.unit))
      self._flops_cache[depth] = f
    return f

  # ---- lookup ----
  def hit_depth(self, path: list[int], cap: int) -> tuple[int, list[int]]:
    """(hit depth in units, the checkpoint nodes on the hit path)."""
    present, ckpt = self.present, self.ckpt
    best, on_path = 0, []
    rec = self.sizes.recurrent
    for k in range(min(cap, len(path))):
      n = path[k]
      if not present[n]:
        break
      if ckpt[n]:
        on_path.append(n)
        best = k + 1
      elif not rec:
        best = k + 1
    return best, on_path

  # ---- eviction units ----
  def _prev_ckpt_depth(self, n: int) -> int:
    p = self.trie.parent[n]
    while p != _ROOT and not self.ckpt[p]:
      p = self.trie.parent[p]
    return 0 if p == _ROOT else self.trie.depth[p]

  def _unit_bytes(self, n: int) -> int:
    """Bytes evicting checkpoint n frees (state, + its leaf chain's KV pages)."""
    b = self.sizes.ckpt_bytes
    if self.nchild[n]:
      return b
    pages = self._node_pages(n, True)
    p = self.trie.parent[n]
    while p != _ROOT and not self.ckpt[p] and self.nchild[p] == 1:
      pages += self._node_pages(p, False)
      p = self.trie.parent[p]
    return b + pages * self.sizes.kv_page_bytes

  def _push(self, n: int, touch: bool = True) -> None:
    """(Re)computes checkpoint n's GreedyDual priority and pushes it; `touch` = it was
    inserted or hit now (else it keeps its last stamp: only its unit's shape changed)."""
    self.ver[n] += 1
    self.seq += 1
    if touch:
      self.stamp[n] = self.clock
    if self.alpha is None:
      heapq.heappush(self.heap, (self.stamp[n] + 1.0, self.seq, n, self.ver[n]))
      return
    gain = self.flops(self.trie.depth[n]) - self.flops(self._prev_ckpt_depth(n))
    eff = gain / max(self._unit_bytes(n), 1)
    self.eff_sum += eff
    self.eff_n += 1
    ref = self.eff_sum / self.eff_n
    rel = eff / ref if ref > 0 else 1.0
    w = rel**self.alpha if rel > 0 else 0.0
    if self.frequency:
      w *= 1 + self.hits[n]
    if self.prior == "reach":
      w *= self.trie.reach_prior(self.kind[n])
    elif self.prior == "hits":
      w *= (self.kind_hit.get(self.kind[n], 0.0) + 1.0) / (
        self.kind_placed.get(self.kind[n], 0.0) + 2.0
      )
    heapq.heappush(self.heap, (self.stamp[n] + w, self.seq, n, self.ver[n]))

  def _evict_one(self) -> bool:
    """Evicts the lowest-priority unpinned unit; False when none is left."""
    held = []
    ok = False
    while self.heap:
      prio, _, n, v = heapq.heappop(self.heap)
      if not self.ckpt[n] or self.ver[n] != v:
        continue
      if self.pin[n]:
        held.append(n)
        continue
      if self.sizes.ckpt_bytes == 0 and self.nchild[n]:
        continue  # a zero-byte interior hit point frees nothing (re-pushed once a leaf)
      self.clock = max(self.clock, prio)
      self._drop(n)
      ok = True
      break
    for n in held:
      self._push(n, touch=False)
    return ok

  def _drop(self, n: int) -> None:
    self.ckpt[n] = False
    self.nckpt -= 1
    self.evicted_ckpts += 1
    self.ver[n] += 1
    if self.nchild[n]:
      return
    p = n
    while True:
      self._remove_leaf(p)
      p = self.trie.parent[p]
      if p == _ROOT or self.ckpt[p] or self.nchild[p] or self.pin[p]:
        break
    if p != _ROOT and self.ckpt[p] and self.nchild[p] == 0:
      self._push(p, touch=False)  # became a leaf: its unit now includes its chain

  def fit(self, limit: int) -> bool:
    """Evicts until `used` <= limit; False if the pinned items alone exceed it."""
    while self.used > limit:
      if not self._evict_one():
        return False
    return True

  def _pin(self, nodes: list[int], delta: int) -> None:
    pin = self.pin
    for n in nodes:
      pin[n] += delta

  # ---- one request ----
  def serve(self, r: int, path: list[int], cap: int, n_comp: int, place) -> int:
    """Replays request r alone (`admit` then `finish`); returns its hit in tokens."""
    h = self.admit(r, path, cap, n_comp)
    self.finish(r, place)
    return h

  def _work(self, n_comp: int, hit_tokens: int) -> int:
    s = self.sizes
    pages = -(-n_comp // s.block_size) - hit_tokens // s.block_size
    return pages * s.kv_page_bytes + (s.ckpt_bytes if s.recurrent else 0)

  def can_admit(self, n_comp: int) -> bool:
    """Admission control (module docstring): True when nothing runs or a request computing
    `n_comp` tokens fits beside the running ones whatever its hit."""
    need = self.reserved + self.pinned_bound + self._work(n_comp, 0)
    return not self.running or need <= self.sizes.capacity

  def admit(self, r: int, path: list[int], cap: int, n_comp: int) -> int:
    """Looks request r up, pins its hit path and reserves its working set (module docstring);
    returns its hit in tokens."""
    self._grow()
    s = self.sizes
    d, on_path = self.hit_depth(path, cap)
    self._pin(path[:d], 1)
    if on_path:  # the hit is served by the deepest checkpoint; shallower ones are not used
      n = on_path[-1]
      self.hits[n] += 1
      self.kind_hit[self.kind[n]] = self.kind_hit.get(self.kind[n], 0.0) + 1.0
      self._push(n)
    hit_tokens = d * s.unit
    work = self._work(n_comp, hit_tokens)
    if not self.fit(s.capacity - self.reserved - work):
      self._pin(path[:d], -1)  # the hit path does not fit beside the working set: recompute
      d, hit_tokens, on_path = 0, 0, []
      work = self._work(n_comp, 0)
      self.fit(s.capacity - self.reserved - work)
    bound = -(-hit_tokens // s.block_size) * s.kv_page_bytes + len(on_path) * s.ckpt_bytes
    self.reserved += work
    self.pinned_bound += bound
    self.running[r] = (path, d, work, bound)
    return hit_tokens

  def finish(self, r: int, place) -> int:
    """Inserts admitted request r's placements and releases it; returns the checkpoints added.

    `place(hit_depth)` returns the depths (1-based units, <= len(path)) that get a checkpoint,
    with their kind: a list of (depth, kind).
    """
    self._grow()
    s = self.sizes
    path, d, work, bound = self.running.pop(r)
    self.reserved -= work
    self.pinned_bound -= bound
    if s.recurrent:
      places = place(d)
    else:  # attention only: every unit is a zero-byte hit point
      places = [(k + 1, 0) for k in range(d, len(path))]
    deepest = max((q for q, _ in places), default=0)
    refresh: list[int] = []
    for k in range(deepest):
      n = path[k]
      if not self.present[n]:
        self._add_node(n, refresh)
    new = []
    for q, kind in places:
      n = path[q - 1]
      if self.ckpt[n]:
        continue
      self.ckpt[n] = True
      self.nckpt += 1
      self.admitted_ckpts += 1
      self.kind[n] = kind
      self.hits[n] = 0
      self.kind_placed[kind] = self.kind_placed.get(kind, 0.0) + 1.0
      new.append(n)
    for n in refresh:
      if n not in new:
        self._push(n, touch=False)
    for n in new:
      self._push(n)
    self._pin(path[:d], -1)
    self.fit(s.capacity - self.reserved)
    return len(new)


__all__ = ["CacheSizes", "SeenTrie", "UnitCache", "unit_hashes"]
