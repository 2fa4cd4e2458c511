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
  `_pin` counts the running requests whose hit path holds a node) is evicted until cache + the
  working sets of the running requests and r's fit the capacity (a working set: the KV pages of
  the request's tokens after the last whole page of its hit, and one running state), so a
  policy never holds more than the capacity, its running requests included. At r's finish, the
  *placement* rule picks the depths that get a checkpoint; the KV of r's path up to the deepest
  one is kept (KV past the last checkpoint cannot serve a recurrent hit and is dropped); r's
  working set is released and the cache is evicted to the capacity minus the working sets still
  running. With one request at a time (sequential) nothing else is pinned or reserved.
- Retirement (`retire=True` at r's finish, decided by the placement rule: `adaptive` sets it
  while the checkpoints its requests supersede are rarely used again,
  `checkpoint_policies.SupersessionStats`): once r's new checkpoints are in, every checkpoint
  on r's path above its deepest new one that has a single present child is *superseded* (a
  request reaching it continues to the deeper one) and is dropped at once, its state only (its
  KV is the deeper chain's prefix), unless the trie saw that point reused after an earlier
  supersession (`SeenTrie.reused_from` <= r: a shared system prompt's state, which each new
  session passes and extends). A chat session's previous turn keeps a state that only a
  regenerated answer would use: without retirement each session holds one state (~409 tokens of
  KV on marconi_7b) per turn until eviction reaches it. With an access history (LRU-2, below)
  the deepest new checkpoint takes the latest penultimate access of those it retires, so the
  session's chain keeps its history.
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

LRU-2 on chains (`penultimate=True`, a fixed weighting of `adaptive`): a checkpoint's
priority is the time of its penultimate access instead (O'Neil et al., SIGMOD'93: evict the
oldest second-to-last reference). An access is a hit served by the checkpoint, or its placement;
a checkpoint placed by a request inherits the previous access of the checkpoint that served the
request's hit (the chain was last used then), and one placed without a hit has none (it goes
first). Time counts lookups. The last access of an evicted checkpoint is kept (LRU-K's retained
information), so a point placed again is not new. Sessions whose turns interleave (real
ShareGPT: a chain's last interval predicts its next, Spearman 0.45-0.57) are where it wins.

The replay is online: what happens at request r depends only on requests 0..r (no trace-wide
statistic is read), so replaying a prefix of a trace gives the prefix of the full replay.

Layout for speed (same decisions as one object per node): the trie and its flat array of walked
paths are shared by every cache of a replay; the caches' per-node state is one row each of
`CacheBank`'s [K, nodes] arrays, so a sweep over capacities finds all K caches' hits with one
gather per request (`lookup`); a chain of KV units is added or dropped by one scatter, its pages
telescoped (`UnitCache._chain_pages`), and the nearest checkpoint or branch above a node is one
gather over its ancestors (`SeenTrie.ancestors`, the last 64 first: `_marks_above`). In the
sequential replay the units a request creates are written once for all K rows
(`CacheBank.insert_fresh`), `UnitCache.serve` is admit + finish in one call, the GreedyDual heap
is compacted when stale entries pile up and per-checkpoint dicts hold only held checkpoints
(BENCHMARKS.md, "Capacity sweep under `adaptive`", for what each bought). The sequential
replay's default is `compiled_replay`, this class's step compiled with numba (same decisions,
checked against this class by `tests/hybrid_cache/sim/compiled_replay_test.py`): a change here
must be made there too.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq

import numpy as np

from hybrid_cache.sim.cost_model import ModelConfig
from hybrid_cache.sim.trace import Request
from hybrid_cache.sim.vllm_plus import request_tokens

_MASK64 = (1 << 64) - 1
NEVER_REUSED = np.iinfo(np.int64).max  # `SeenTrie.reused_from` of a node not reused
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


def grown(a: np.ndarray, n: int, fill=0) -> np.ndarray:
  """`a` if it holds >= n entries, else a copy at least n long (capacity doubles), the new
  entries `fill`: the per-node arrays that grow with the trie."""
  if n <= len(a):
    return a
  out = np.full(max(n, 2 * len(a)), fill, a.dtype)
  out[: len(a)] = a
  return out


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
    # was superseded (`checkpoint_policies.SupersessionStats`; NEVER_REUSED until then):
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


_CKPT, _BRANCH = 1, 2  # bits of UnitCache._flag
# LRU-2's penultimate access of a checkpoint that has none (`UnitCache(penultimate=True)`):
# now - NO_HISTORY, below every real access time, so such checkpoints go first, oldest first
NO_HISTORY = 1e12
# `UnitCache._compact` runs when the heap holds more than 2 x its valid entries + this: stale
# entries (a checkpoint re-pushed or evicted) of high priority are rarely popped and piled up to
# ~40x the live checkpoints (Mooncake, adaptive, 5e10: 3,000 entries for 77 checkpoints), which
# made every pop and push pay for them
_COMPACT_MIN = 256
# `_marks_above` gathers the last `_WINDOW` nodes of a path first: the nearest mark is usually
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


class FlopsTable:
  """`int(model.prefill_flops(d * unit))` for d = 0, 1, ..., extended on demand; one table is
  shared by every cache of a replay (`flops_table`)."""

  def __init__(self, model: ModelConfig, unit: int):
    self.model, self.unit = model, unit
    self.values: list[int] = []

  def extend(self, depth: int) -> list[int]:
    """The table, holding at least depths 0..depth."""
    v = self.values
    while len(v) <= depth:
      v.append(int(self.model.prefill_flops(len(v) * self.unit)))
    return v


_TABLES: dict[tuple[ModelConfig, int], FlopsTable] = {}


def flops_table(model: ModelConfig, unit: int) -> FlopsTable:
  """The shared `FlopsTable` of (model, unit)."""
  t = _TABLES.get((model, unit))
  if t is None:
    t = _TABLES[(model, unit)] = FlopsTable(model, unit)
  return t


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


class UnitCache:
  """One cache over a shared `SeenTrie`.

  Per-node state is two numpy arrays indexed by trie node id, grown with the trie: `_present`
  (bool) and `_nchild` (int32: present children), and `_flag` (uint8 bits: _CKPT = holds a
  checkpoint, _BRANCH = >= 2 present children), so the nearest checkpoint or branch above a node
  is one gather over its ancestors. What only checkpoints carry (`entry`, `hits`, `kind`, `stamp`)
  lives in dicts keyed by node. The pinned nodes are `path[:d]` of each running request with a
  hit of d units (`_pins`: r -> (path, d); one entry at most in the sequential replay), not a
  per-node field: a node of depth k is pinned iff some entry has d >= k and path[k - 1] == it.
  Chains are handled by depth arithmetic: the
  KV pages of the nodes at depths a+1..e of one root path telescope to `(e U) // B - (a U) // B`
  (+1 when e ends mid-page as a leaf), so adding or dropping a chain costs one numpy
  gather/scatter, not a step per node.
  """

  def __init__(
    self,
    trie: SeenTrie,
    sizes: CacheSizes,
    model: ModelConfig,
    alpha: float | None,
    prior: str = "hits",
    frequency: bool = True,
    bank: CacheBank | None = None,
    retuned: bool = False,
    penultimate: bool = False,
  ):
    """alpha: the eviction weight's exponent (>= 0); None = plain LRU (every weight 1).
    prior: "hits" (share of this cache's checkpoints of the kind that served a hit), "reach"
    (share of the kind's candidate points a later request passed, `SeenTrie.reach_prior`) or
    "none"; frequency: multiply by 1 + hits. bank: the `CacheBank` holding this cache's row
    (a new one of its own when None). retuned: alpha, prior and frequency may be changed
    between requests (the live cache of `adaptive`'s online re-tuning). penultimate: evict by
    the time of each checkpoint's penultimate access instead (LRU-2 on chains, module doc;
    alpha, prior and frequency are then unused).

    With alpha 0 fixed (not retuned) the FLOPs term is (eff / eff_ref) ** 0 = 1 whenever
    eff > 0, and eff = (F(d U) - F(a U)) / bytes > 0 for a < d when F = `prefill_flops` is
    strictly increasing: the cost model's F is a sum of nondecreasing polynomials in L with
    nonnegative coefficients, strictly increasing once F(U) > F(0) (checked here). Such a cache
    skips eff and its running mean (`_flat_weight`), which nothing else reads."""
    if prior not in PRIORS:
      raise ValueError(f"prior must be one of {PRIORS}, got {prior!r}")
    self.trie, self.sizes, self.model = trie, sizes, model
    self.alpha, self.prior, self.frequency = alpha, prior, frequency
    self.bank = CacheBank() if bank is None else bank
    self.row = len(self.bank.caches)  # this cache's row in the bank
    self.bank.add(self)  # sets the row views _present, _flag, _nchild
    self._absent = 0  # first absent unit of the last admitted path (drops lower it)
    self._cur = -1  # the last admitted request while nothing else changed the cache since
    self._cur_pa = self._nchild[:0]  # its path (int64 array)
    # per held checkpoint n (entries are deleted when it is evicted, so the dicts stay as
    # small as the cache: keeping evicted nodes' entries made a 16-point sweep's 96 caches
    # hold ~5M of them, and every lookup a cache miss)
    self.entry: dict[int, int] = {}  # seq of n's valid heap entry (older entries are stale)
    self.hits: dict[int, int] = {}
    self.kind: dict[int, int] = {}
    self.stamp: dict[int, float] = {}  # the clock when checkpoint n was last inserted or hit
    self._pins: dict[int, tuple[list[int], int]] = {}  # running r with a hit -> (path, d)
    self.reserved = 0  # working sets of the running requests (bytes)
    self.pinned_bound = 0  # bound on their pinned hit paths (bytes, module doc)
    # r -> (path, path array, d, work, bound) of the admitted, unfinished requests
    self.running: dict[int, tuple[list[int], np.ndarray, int, int, int]] = {}
    self.root_children = 0
    self.pages = 0
    self.nckpt = 0
    self.heap: list = []
    self._compact_at = _COMPACT_MIN  # heap length that triggers `_compact`
    self.clock = 0.0
    self.seq = 0
    self.eff_sum, self.eff_n = 0.0, 0
    self.kind_placed: dict[int, float] = {}
    self.kind_hit: dict[int, float] = {}
    self.evicted_ckpts = 0
    self.admitted_ckpts = 0
    self.retired_ckpts = 0  # superseded checkpoints dropped at insertion (`_retire`)
    self._flops = flops_table(model, sizes.unit)
    self.retuned = retuned
    self.penultimate = penultimate
    # LRU-2 on chains (kept when it is the weighting, or may become it: a re-tuned cache, whose
    # tuner may list an LRU-2 weighting): per checkpoint its last
    # access, also after it is evicted (LRU-K's retained history: without it a re-placed point
    # counts as new and LRU-2 starves, real ShareGPT 2e9: 1.39e15 vs 5.70e15 FLOPs saved), and
    # per held checkpoint its penultimate one (`_now` counts the lookups; a checkpoint without
    # an earlier access has penultimate `_now - NO_HISTORY`)
    self._history = penultimate or retuned
    self.lastref: dict[int, int] = {}
    self.penult: dict[int, float] = {}
    self._now = 0
    self._inherit = 0.0  # the penultimate access a new checkpoint of the current request gets
    fl = self._flops.extend(1)
    self._flat_weight = alpha == 0 and not retuned and fl[1] > fl[0]
    self._recurrent = sizes.recurrent

  # ---- per-node views (copies, for checks) ----
  @property
  def present(self) -> list[bool]:
    return self._present[: len(self.trie)].tolist()

  @property
  def ckpt(self) -> list[bool]:
    return (self._flag[: len(self.trie)] & _CKPT).astype(bool).tolist()

  @property
  def nchild(self) -> list[int]:
    return self._nchild[: len(self.trie)].tolist()

  # ---- sizes ----
  def _grow(self) -> None:
    self.bank.grow(len(self.trie))

  @property
  def used(self) -> int:
    return self.pages * self.sizes.kv_page_bytes + self.nckpt * self.sizes.ckpt_bytes

  def _chain_pages(self, a: int, e: int) -> int:
    """Pages charged to a leaf chain of present nodes at depths a+1..e of one root path:
    pages ending in them (telescoped) + 1 if the leaf ends mid-page."""
    u, b = self.sizes.unit, self.sizes.block_size
    end = e * u
    return end // b - (a * u) // b + (1 if end % b else 0)

  def _leaf_bonus(self, depth: int) -> int:
    return 1 if (depth * self.sizes.unit) % self.sizes.block_size else 0

  def flops(self, depth: int) -> int:
    return self._flops.extend(depth)[depth]

  # ---- eviction units ----
  def _push(self, n: int, touch: bool = True, prev: int = -1, a: int = -1) -> None:
    """(Re)computes checkpoint n's GreedyDual priority and pushes it; `touch` = it was
    inserted or hit now (else it keeps its last stamp: only its unit's shape changed).
    `prev` (the depth of the previous checkpoint above n) and `a` (leaf: the depth its chain
    hangs from) are found from n's ancestors unless the caller knows them."""
    seq = self.seq = self.seq + 1
    self.entry[n] = seq
    if touch:
      stamp = self.stamp[n] = self.clock
    else:
      stamp = self.stamp[n]
    heap = self.heap
    if self.penultimate:
      heapq.heappush(heap, (self.penult[n], seq, n))
      if len(heap) > self._compact_at:
        self._compact()
      return
    if self.alpha is None:
      w = 1.0
    else:
      if self._flat_weight:  # fixed alpha 0: the FLOPs term is 1 (see __init__)
        w = 1.0
      else:
        w = self._flops_term(n, prev, a)
      if self.frequency:
        w *= 1 + self.hits[n]
      prior = self.prior
      if prior == "reach":
        w *= self.trie.reach_prior(self.kind[n])
      elif prior == "hits":
        kind = self.kind[n]
        w *= (self.kind_hit.get(kind, 0.0) + 1.0) / (self.kind_placed.get(kind, 0.0) + 2.0)
    heapq.heappush(heap, (stamp + w, seq, n))
    if len(heap) > self._compact_at:
      self._compact()

  def reweigh(self) -> None:
    """Re-pushes every held checkpoint at its stamp with the current weighting (alpha,
    prior, frequency), after the re-tuning changed it: every valid heap entry is then
    stamp + w under one weighting (the older entries go stale)."""
    for n in list(self.entry):
      self._push(n, touch=False)

  def _compact(self) -> None:
    """Drops the heap's stale entries in place (those `_evict_one` would skip: the node was
    re-pushed since, or holds no checkpoint). Exact: entries are totally ordered by
    (priority, seq), so the valid ones pop in the same order from any heap holding them."""
    heap, entry = self.heap, self.entry
    heap[:] = [e for e in heap if entry.get(e[2]) == e[1]]
    heapq.heapify(heap)
    self._compact_at = 2 * len(heap) + _COMPACT_MIN

  def _flops_term(self, n: int, prev: int, a: int) -> float:
    """(eff / eff_ref) ** alpha of checkpoint n, eff_ref updated (see the module doc)."""
    dn = self.trie.depth[n]
    leaf = not self._nchild.item(n)
    if prev < 0 or (leaf and a < 0):
      # the previous checkpoint (0: root) and (leaf) the nearest checkpoint or branch above n
      prev, a = _marks_above(self._flag, self.trie.ancestors(n))
    sizes = self.sizes
    nbytes = sizes.ckpt_bytes  # interior: evicting it frees its state only
    if leaf:  # + the KV back to the previous checkpoint or branch point
      u, b = sizes.unit, sizes.block_size
      end = dn * u
      pages = end // b - (a * u) // b + (1 if end % b else 0)  # _chain_pages(a, dn)
      nbytes += pages * sizes.kv_page_bytes
    fl = self._flops.values  # holds every served depth (serve extends it)
    # the FLOPs difference (an exact int) rounded to a float first, as `compiled_replay` does
    eff = float(fl[dn] - fl[prev]) / max(nbytes, 1)
    self.eff_sum += eff
    self.eff_n += 1
    ref = self.eff_sum / self.eff_n
    rel = eff / ref if ref > 0 else 1.0
    return rel**self.alpha if rel > 0 else 0.0

  def _evict_one(self, pins: list[tuple[list[int], int]] | None = None) -> bool:
    """Evicts the lowest-priority unpinned unit; False when none is left. `pins`: the
    values of `_pins` (read here when None)."""
    held = []
    ok = False
    entry, nchild, heap = self.entry, self._nchild, self.heap
    depth = self.trie.depth
    if pins is None:
      pins = list(self._pins.values())
    zero_state = self.sizes.ckpt_bytes == 0
    while heap:
      prio, seq, n = heapq.heappop(heap)
      if entry.get(n) != seq:  # stale: re-pushed or evicted since (held <=> in `entry`)
        continue
      if pins:
        dn = depth[n]
        for pp, pd in pins:
          if dn <= pd and pp[dn - 1] == n:
            break
        else:
          dn = 0
        if dn:
          held.append(n)
          continue
      if zero_state and nchild.item(n):
        continue  # a zero-byte interior hit point frees nothing (re-pushed once a leaf)
      if not self.penultimate:  # GreedyDual's clock (LRU-2's priorities are access times)
        self.clock = max(self.clock, prio)
      self._drop(n)
      ok = True
      break
    for n in held:
      self._push(n, touch=False)
    return ok

  def _drop_state(self, n: int) -> None:
    """Drops checkpoint n's state and per-checkpoint entries (not its KV)."""
    self._flag[n] = self._flag.item(n) & _BRANCH  # .item: Python ints, no NumPy scalars
    self.nckpt -= 1
    del self.entry[n], self.hits[n], self.kind[n], self.stamp[n]
    if self._history:
      del self.penult[n]  # its last access stays: a ghost, read if n is placed again

  def _drop(self, n: int) -> None:
    """Evicts checkpoint n; a leaf also drops its KV chain up to the nearest ancestor that is
    a checkpoint, a branch (>= 2 children) or pinned."""
    flag, nchild = self._flag, self._nchild
    self._drop_state(n)
    self.evicted_ckpts += 1
    if nchild.item(n):
      return
    trie = self.trie
    dn = trie.depth[n]
    s0 = trie.home[n]
    flat = trie.flat  # n's root path is flat[s0 : s0 + dn]: its ancestors, then n
    a = _last_mark(flag, flat[s0 : s0 + dn - 1])  # depth of the node the chain hangs from
    for pp, pd in self._pins.values():  # a pinned ancestor deeper than a stops it too
      # the nodes pinned by (pp, pd) are pp[:pd]; n's ancestors agree with pp on a prefix
      k = min(pd, dn - 1)
      if a < k and flat.item(s0 + a) == pp[a]:
        lo, hi = a, k  # ancestor lo == pp[lo]; ancestor hi != pp[hi] or hi == k
        if flat.item(s0 + k - 1) == pp[k - 1]:
          lo = k - 1
        while hi - lo > 1:
          mid = (lo + hi) // 2
          if flat.item(s0 + mid) == pp[mid]:
            lo = mid
          else:
            hi = mid
        a = lo + 1
    chain = flat[s0 + a : s0 + dn]  # the dropped nodes, n included
    self._present[chain] = False
    nchild[chain] = 0
    self.pages -= self._chain_pages(a, dn)
    if a < self._absent and flat.item(s0 + a) == self._cur_pa.item(a):
      self._absent = a  # the chain left the last admitted path from depth a + 1 on
    if a == 0:
      self.root_children -= 1
      return
    p = flat.item(s0 + a - 1)
    c = nchild.item(p) - 1
    nchild[p] = c
    if c == 1:
      flag[p] = flag.item(p) & _CKPT
    elif c == 0:
      self.pages += self._leaf_bonus(a)
      if flag.item(p) & _CKPT:
        self._push(p, touch=False)  # became a leaf: its unit now includes its chain

  def fit(self, limit: int) -> bool:
    """Evicts until `used` <= limit; False if the pinned items alone exceed it."""
    page, state = self.sizes.kv_page_bytes, self.sizes.ckpt_bytes
    if self.pages * page + self.nckpt * state <= limit:
      return True
    pins = list(self._pins.values())  # evictions never change the pins
    while self.pages * page + self.nckpt * state > limit:
      if not self._evict_one(pins):
        return False
    return True

  # ---- one request ----
  def serve(
    self,
    r: int,
    path: list[int],
    cap: int,
    n_comp: int,
    place,
    found: tuple[int, int, int, int, int] | None = None,
    fresh: tuple[int, int] | None = None,
    retire: bool = False,
  ) -> int:
    """Replays request r alone; returns its hit in tokens.

    Same decisions as `admit(r, ..., bound=False)` then `finish(r, place, fresh, retire)` (the two
    share `_take_hit` and `_insert`), in one call without the running-request bookkeeping,
    which nothing reads between the two when nothing else runs: the sequential replay calls
    this K times per request, and what it skips was ~10% of a call (Mooncake sweep, 2026-11-25).
    """
    pa = self._path_and_flops(path)
    if found is None:
      found = self._lookup_one(path, pa, cap)
    d, _ = self._take_hit(r, path, pa, found)
    s = self.sizes
    bs, page, state = s.block_size, s.kv_page_bytes, s.ckpt_bytes
    room = s.capacity - self.reserved  # nothing else is admitted during this call
    npages = -(-n_comp // bs)
    work = (npages - (d * s.unit) // bs) * page + state  # `_work` (state = 0: attention only)
    if self.pages * page + self.nckpt * state > room - work and not self.fit(room - work):
      self._pins.pop(r, None)  # the hit path does not fit beside the working set: recompute
      d = 0
      self.fit(room - npages * page - state)
    self._cur = -1
    self._insert(r, path, pa, d, place, fresh, retire)
    self._pins.pop(r, None)
    if self.pages * page + self.nckpt * state > room:
      self.fit(room)
    return d * s.unit

  def _work(self, n_comp: int, hit_tokens: int) -> int:
    """A working set: the KV pages after the hit's last whole page, + one running state."""
    s = self.sizes
    pages = -(-n_comp // s.block_size) - hit_tokens // s.block_size
    return pages * s.kv_page_bytes + (s.ckpt_bytes if s.recurrent else 0)

  def can_admit(self, n_comp: int) -> bool:
    """Admission control (module docstring): True when nothing runs or a request computing
    `n_comp` tokens fits beside the running ones whatever its hit."""
    need = self.reserved + self.pinned_bound + self._work(n_comp, 0)
    return not self.running or need <= self.sizes.capacity

  def _path_and_flops(self, path: list[int]) -> np.ndarray:
    """The path's array; the FLOPs table extended to its depth (pushes read it)."""
    if len(self._flops.values) <= len(path):
      self._flops.extend(len(path))
    return self.trie.path_array(path)

  def _lookup_one(self, path: list[int], pa: np.ndarray, cap: int):
    """This cache's row of `lookup` (when the caller did not look up the whole bank)."""
    self._grow()
    old = self.trie.existed(path)
    return tuple(x[0] for x in lookup(self._present[None], self._flag[None], pa, cap, old))

  def _take_hit(self, r: int, path: list[int], pa: np.ndarray, found) -> tuple[int, int]:
    """Applies r's lookup row `found` (see `admit`): pins the hit path and re-weights the
    checkpoint serving it; returns (the hit depth d in units, the serving checkpoint's depth)."""
    f, last, prev, top, self._absent = found
    self._cur, self._cur_pa = r, pa
    d = last if self._recurrent else f
    if d:
      self._pins[r] = (path, d)
    if self._history:
      now = self._now = self._now + 1
      self._inherit = now - NO_HISTORY  # new checkpoints of a request without a hit
    if last:  # the hit is served by the deepest checkpoint; shallower ones are not used
      n = path[last - 1]
      if self._history:
        before = self.lastref[n]
        self.penult[n] = self._inherit = before  # the chain's access before this one
        self.lastref[n] = now
      self.hits[n] += 1
      kind = self.kind[n]
      self.kind_hit[kind] = self.kind_hit.get(kind, 0.0) + 1.0
      self._push(n, prev=prev, a=top)
    return d, last

  def admit(
    self,
    r: int,
    path: list[int],
    cap: int,
    n_comp: int,
    found: tuple[int, int, int, int, int] | None = None,
    bound: bool = True,
  ) -> int:
    """Looks request r up, pins its hit path and reserves its working set (module docstring);
    returns its hit in tokens.

    `found`: this cache's row of `CacheBank.lookup(path, cap)` when the caller looked up all
    caches of the bank at once (after every cache grew to the trie), else it is looked up here.
    `bound`: add the hit path's bound to `pinned_bound` (read by `can_admit` only; `serve`
    finishes at once and skips it).
    """
    pa = self._path_and_flops(path)
    if found is None:
      found = self._lookup_one(path, pa, cap)
    d, last = self._take_hit(r, path, pa, found)
    s = self.sizes
    hit_tokens = d * s.unit
    work = self._work(n_comp, hit_tokens)
    if not self.fit(s.capacity - self.reserved - work):
      self._pins.pop(r, None)  # the hit path does not fit beside the working set: recompute
      d, hit_tokens, last = 0, 0, 0
      work = self._work(n_comp, 0)
      self.fit(s.capacity - self.reserved - work)
    b = 0
    if bound and d:  # whole pages of the hit + the checkpoints on its path
      b = -(-hit_tokens // s.block_size) * s.kv_page_bytes
      if last and s.ckpt_bytes:
        b += int(np.count_nonzero(self._flag[pa[:last]] & _CKPT)) * s.ckpt_bytes
    self.reserved += work
    self.pinned_bound += b
    self.running[r] = (path, pa, d, work, b)
    return hit_tokens

  def finish(
    self, r: int, place, fresh: tuple[int, int] | None = None, retire: bool = False
  ) -> int:
    """Inserts admitted request r's placements and releases it; returns the checkpoints added.

    `place(hit_depth)` returns the depths (1-based units, <= len(path)) that get a checkpoint,
    with their kind: a list of (depth, kind). `fresh` = (old, deepest): the units of r's path
    at depths old + 1..deepest were created by r and are already written as this call adds
    them (`CacheBank.insert_fresh`); deepest must be this call's deepest placement. `retire`:
    drop the checkpoints r's new ones supersede (module docstring, `_retire`).
    """
    path, pa, d, work, b = self.running.pop(r)
    self.reserved -= work
    self.pinned_bound -= b
    if self._cur != r:  # the cache changed since r's lookup: find its first absent unit again
      pres = self._present[pa]
      self._absent = len(pa) if pres.all() else int(pres.argmin())
      self._cur_pa = pa
    self._cur = -1
    added = self._insert(r, path, pa, d, place, fresh, retire)
    self._pins.pop(r, None)
    self.fit(self.sizes.capacity - self.reserved)
    return added

  def _insert(
    self, r: int, path: list[int], pa: np.ndarray, d: int, place, fresh, retire: bool = False
  ) -> int:
    """`finish`'s insertion of a request with hit depth d (see `finish`): its KV chain up to
    the deepest placement and its new checkpoints, pushed, then (`retire`) the superseded
    ones dropped; returns how many were added."""
    if self._recurrent:
      places = place(d)
    else:  # attention only: every unit is a zero-byte hit point
      places = [(k + 1, 0) for k in range(d, len(path))]
    deepest = max([q for q, _ in places]) if places else 0
    refresh: list[int] = []
    flag, nchild = self._flag, self._nchild
    if deepest:
      sub = pa[:deepest]
      j = min(self._absent, deepest)  # present units along a path are a prefix
      if j < deepest:  # add path[j:deepest] as one chain hanging from path[j - 1]
        if j == 0:
          self.root_children += 1
        else:
          p = path[j - 1]
          c = nchild.item(p)
          if c == 0:
            self.pages -= self._leaf_bonus(j)
            if flag.item(p) & _CKPT:
              refresh.append(j)  # no longer a leaf: its unit is now its state alone
          elif c == 1:
            flag[p] = flag.item(p) | _BRANCH
          nchild[p] = c + 1
        if fresh is None:
          self._present[sub[j:]] = True
          nchild[sub[j : deepest - 1]] = 1
        else:  # units old + 1..deepest are written (fresh[1] == deepest > old >= j)
          o = fresh[0]
          if fresh[1] != deepest or j > o:
            raise ValueError(f"fresh={fresh} does not match the chain {j}..{deepest}")
          if j < o:
            self._present[sub[j:o]] = True
            nchild[sub[j:o]] = 1
        self.pages += self._chain_pages(j, deepest)
    new = []
    kinds, hits, placed = self.kind, self.hits, self.kind_placed
    for q, kind in places:
      n = path[q - 1]
      fn = flag.item(n)
      if fn & _CKPT:
        continue
      flag[n] = fn | _CKPT
      kinds[n] = kind
      hits[n] = 0
      if self._history:
        before = self.lastref.get(n)  # a ghost: n held a checkpoint before
        self.penult[n] = self._inherit if before is None else before
        self.lastref[n] = self._now
      placed[kind] = placed.get(kind, 0.0) + 1.0
      new.append(q)
    self.nckpt += len(new)
    self.admitted_ckpts += len(new)
    if self._flat_weight:
      for q in [q for q in refresh if q not in new] + new:
        self._push(path[q - 1], q in new)
    elif new or refresh:
      # one gather along the path gives every pushed node's previous checkpoint and (leaf)
      # chain top: nothing changes between these pushes
      f = flag[pa[:deepest]]
      cks = (f & _CKPT).nonzero()[0].tolist()
      marks = f.nonzero()[0].tolist()
      for q, touch in [(q, False) for q in refresh if q not in new] + [(q, True) for q in new]:
        i = bisect.bisect_left(cks, q - 1)
        prev = cks[i - 1] + 1 if i else 0
        i = bisect.bisect_left(marks, q - 1)
        self._push(path[q - 1], touch, prev, marks[i - 1] + 1 if i else 0)
    if retire and new:
      self._retire(r, pa, new[-1])
    return len(new)

  def _retire(self, r: int, pa: np.ndarray, e: int) -> None:
    """Drops the states of the checkpoints request r's new one at depth e of path `pa`
    supersedes: those above it with a single present child, not seen reused by request r
    (module docstring, "Retirement"); with an access history, the one at e takes the latest
    penultimate access among them."""
    seg = pa[: e - 1]
    gone = seg[
      ((self._flag[seg] & _CKPT) != 0) & (self._nchild[seg] == 1) & (self.trie.reused_from[seg] > r)
    ].tolist()
    if not gone:
      return
    if self._history:
      ne = pa.item(e - 1)
      latest = max(self.penult[n] for n in gone)
      if latest > self.penult[ne]:
        self.penult[ne] = latest
        if self.penultimate:
          self._push(ne, touch=False)
    for n in gone:
      self._drop_state(n)
    self.retired_ckpts += len(gone)


__all__ = [
  "CacheBank",
  "CacheSizes",
  "FlopsTable",
  "SeenTrie",
  "UnitCache",
  "flops_table",
  "lookup",
  "unit_hashes",
]
