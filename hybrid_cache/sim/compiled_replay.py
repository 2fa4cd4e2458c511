"""The sequential replay of `checkpoint_cache.UnitCache`, compiled with numba.

Issue 15 asks a 16-point capacity sweep of the full Mooncake conversation trace in <= 3x the
wall time of one point. In Python every `UnitCache.serve` call is ~30 us of CPython bytecode
spread thin (evictions, insertion, the GreedyDual heap; BENCHMARKS.md, "Capacity sweep under
`adaptive`"), and a sweep makes 96 caches x 12,031 requests of them, so the sweep cost 6.6-7.2x
one point in one process. Here the same per-cache step runs as compiled loops over arrays
(`compiled_kernels.py`; BENCHMARKS.md, "Compiled sequential replay", for what it bought), the
same decisions as `UnitCache.serve` bit for bit.
`tests/hybrid_cache/sim/compiled_replay_test.py` compares triples and summaries with the
plain-Python path (`sweep_checkpoint(..., backend="python")`) over every rule and weighting.
`UnitCache` stays the readable reference and serves the concurrent replay.

Layout: `CompiledBank` holds K caches over one trie. Per node, rows of [K, nodes] arrays
(`present`, `flag`, `nchild`, as `CacheBank`); per cache, int64 and float64 scalars (rows of
`ints`, `flts`), the eviction weighting (`cfg`, `alpha`), the per-kind placed / hit counts, the
GreedyDual heap as three arrays (priority, seq, node) in typed lists (they grow), and the
per-checkpoint `entry` / `hits` / `kind` / `stamp` as typed dicts (held checkpoints only, as in
`UnitCache`). The requests are arrays too: the capacity-independent walk (`SeenTrie`, the
candidate points) is done for the whole trace first (`checkpoint_sweep._walk_all`), then
`serve_chunk` replays requests r0..r1 for each cache in turn (caches are independent between
"""

from __future__ import annotations

import concurrent.futures
from typing import TYPE_CHECKING

import numpy as np
from numba import types
from numba.typed import Dict
from numba.typed import List

from hybrid_cache.sim.chain_eviction import _COMPACT_MIN
from hybrid_cache.sim.compiled_kernels import _ADMITTED
from hybrid_cache.sim.compiled_kernels import _CAP
from hybrid_cache.sim.compiled_kernels import _COMPACT_AT
from hybrid_cache.sim.compiled_kernels import _EVICTED
from hybrid_cache.sim.compiled_kernels import _FLAT
from hybrid_cache.sim.compiled_kernels import _FREQ
from hybrid_cache.sim.compiled_kernels import _HIST
from hybrid_cache.sim.compiled_kernels import _LRU
from hybrid_cache.sim.compiled_kernels import _NCFG
from hybrid_cache.sim.compiled_kernels import _NCKPT
from hybrid_cache.sim.compiled_kernels import _NFLTS
from hybrid_cache.sim.compiled_kernels import _NINTS
from hybrid_cache.sim.compiled_kernels import _PAGES
from hybrid_cache.sim.compiled_kernels import _PEN
from hybrid_cache.sim.compiled_kernels import _PRIOR
from hybrid_cache.sim.compiled_kernels import _RETIRED
from hybrid_cache.sim.compiled_kernels import REQ_RETIRE
from hybrid_cache.sim.compiled_kernels import _reweigh
from hybrid_cache.sim.compiled_kernels import _score
from hybrid_cache.sim.compiled_kernels import _serve_chunk

if TYPE_CHECKING:
  from hybrid_cache.sim.eviction_weightings import Weighting

PRIOR_CODES = {"hits": 0, "reach": 1, "none": 2}
RULE_CODES = {"ckpt_dense": 0, "ckpt_sparse": 1, "ckpt_branch": 2, "adaptive": 3}
NUM_KINDS = 32  # kind * 8 + length class, kind < 4 (`checkpoint_placement.candidates`)
MAX_CANDS = 2  # branch point + leaf / continuation


class CompiledBank:
  """K caches over one walked trace (see the module docstring).

  Args:
    trie_nodes: nodes of the trie after the whole walk.
    sizes: (unit, block_size, kv_page_bytes, ckpt_bytes), shared by every cache.
    trie: (depth, home, flat, flops, reused_from) int64 arrays: per node its depth and the
      offset of its creating path in flat (every walked path end to end); flops[d] = F(d U),
      d >= 0 up to the longest path and at least 1; per node `SeenTrie.reused_from`.
    reach: float64[R, NUM_KINDS], the reach prior of each kind as of each request.
    req: int64[R, REQ_COLS] per request, columns `compiled_kernels.REQ_*`: the offset of its
      path in flat (START), path length (LEN), units that existed before it (OLD), hit cap in
      units (CAP), computed tokens (NCOMP), deepest placement (DEEPEST), candidate count
      (NCANDS), retire (RETIRE: 1 = drop the checkpoints it supersedes, `UnitCache._retire`).
    cands: int64[R, 2, MAX_CANDS]: candidate depths (row CAND_DEPTH) and kinds (CAND_KIND),
      ascending depth.
    rule, kspars: the placement rule (`RULE_CODES`) and ckpt_sparse's K.
  """

  def __init__(self, trie_nodes, sizes, trie, reach, req, cands, rule, kspars):
    self.nodes = int(trie_nodes)
    self.S = tuple(int(x) for x in sizes)
    self.T = trie
    self.reach, self.req, self.cands = reach, req, cands
    self.rule, self.kspars = int(rule), int(kspars)
    self.configs: list[tuple[int, Weighting, bool, bool]] = []  # capacity, weighting, flat, hist
    self._pool: concurrent.futures.ThreadPoolExecutor | None = None

  def add(self, capacity: int, weighting: Weighting, retuned: bool = False) -> int:
    """Adds a cache (its weighting and `retuned` as `UnitCache`'s arguments); returns its row."""
    hist = bool(weighting.penultimate or retuned)  # `UnitCache._history`
    _, _, _, fl, _ = self.T  # `UnitCache._flat_weight` (the table holds depth 1)
    flat = weighting.alpha == 0 and not retuned and bool(fl[1] > fl[0])
    self.configs.append((int(capacity), weighting, bool(flat), hist))
    return len(self.configs) - 1

  def start(self) -> None:
    """Allocates the state of the caches added so far (call once, before `serve`)."""
    k, nodes = len(self.configs), self.nodes
    self.present = np.zeros((k, nodes), np.bool_)
    self.flag = np.zeros((k, nodes), np.uint8)
    self.nchild = np.zeros((k, nodes), np.int32)
    self.ints = np.zeros((k, _NINTS), np.int64)
    self.ints[:, _COMPACT_AT] = _COMPACT_MIN
    self.flts = np.zeros((k, _NFLTS), np.float64)
    self.cfg = np.zeros((k, _NCFG), np.int64)
    self.alpha = np.zeros(k, np.float64)
    for i, (cap, weighting, flat, hist) in enumerate(self.configs):
      self.set_weighting(i, weighting)
      self.cfg[i, _CAP], self.cfg[i, _FLAT], self.cfg[i, _HIST] = cap, int(flat), int(hist)
    self.kplaced = np.zeros((k, NUM_KINDS), np.float64)
    self.khit = np.zeros((k, NUM_KINDS), np.float64)
    i64, f64 = types.int64, types.float64
    self.ENTRY, self.HITS, self.KIND, self.STAMP = List(), List(), List(), List()
    self.LAST, self.PEN = List(), List()
    self.HP, self.HS, self.HN = List(), List(), List()
    for _ in range(k):
      self.ENTRY.append(Dict.empty(i64, i64))
      self.HITS.append(Dict.empty(i64, i64))
      self.KIND.append(Dict.empty(i64, i64))
      self.STAMP.append(Dict.empty(i64, f64))
      self.LAST.append(Dict.empty(i64, i64))
      self.PEN.append(Dict.empty(i64, f64))
      self.HP.append(np.empty(1024, np.float64))
      self.HS.append(np.empty(1024, np.int64))
      self.HN.append(np.empty(1024, np.int64))
    r = self.req.shape[0]
    self.hits_out = np.zeros((k, r), np.int64)
    self.added_out = np.zeros((k, r), np.int64)

  def set_weighting(self, row: int, w: Weighting) -> None:
    """Gives one cache weighting `w` (`UnitCache`'s alpha / prior / frequency / penultimate):
    the one place a `Weighting` becomes the kernels' numbers (`cfg`, `alpha`; None alpha:
    plain LRU)."""
    self.cfg[row, _LRU] = int(w.alpha is None)
    self.alpha[row] = 0.0 if w.alpha is None else float(w.alpha)
    self.cfg[row, _PRIOR] = PRIOR_CODES[w.prior]
    self.cfg[row, _FREQ] = int(w.frequency)
    self.cfg[row, _PEN] = int(w.penultimate)

  def retune(self, row: int, r: int, w: Weighting) -> None:
    """The re-tuning's switch (`eviction_weightings._retune`) after request r - 1: cache `row`
    takes weighting `w` and re-weights its held checkpoints under it (`UnitCache.retune`)."""
    self.set_weighting(row, w)
    self.reweigh(row, r)

  def retires(self, r: int) -> bool:
    """Request r's retirement decision (`_Replay.walk`)."""
    return bool(self.req[r, REQ_RETIRE])

  def _state(self):
    return (
      self.present, self.flag, self.nchild, self.ints, self.flts, self.cfg, self.alpha,
      self.kplaced, self.khit, self.ENTRY, self.HITS, self.KIND, self.STAMP, self.LAST,
      self.PEN, self.HP, self.HS, self.HN,
    )  # fmt: skip

  def serve(self, rows: np.ndarray, r0: int, r1: int, threads: int = 1) -> None:
    """Replays requests r0..r1 - 1 on each cache of `rows` (hits in `hits_out[row, r]`, in
    units; checkpoints added in `added_out[row, r]`).

    `threads` > 1 deals the rows round-robin to that many threads: the caches share nothing
    they write (each its own rows, dicts and heap arrays) and the compiled loop releases the
    GIL, so they run in parallel with the same results."""
    rows = np.asarray(rows, np.int64)
    parts = [rows[i::threads] for i in range(min(threads, len(rows)))]
    if len(parts) <= 1:
      self._serve_rows(rows, r0, r1)
      return
    if self._pool is None or self._pool._max_workers < len(parts):
      self._pool = concurrent.futures.ThreadPoolExecutor(len(parts))
    for f in [self._pool.submit(self._serve_rows, p, r0, r1) for p in parts]:
      f.result()

  def _serve_rows(self, rows: np.ndarray, r0: int, r1: int) -> None:
    _serve_chunk(
      rows, r0, r1, *self._state(), self.T, self.S, self.reach, self.req, self.cands,
      self.rule, self.kspars, self.hits_out, self.added_out,
    )  # fmt: skip

  def close(self) -> None:
    """Stops the worker threads of `serve` (if any)."""
    if self._pool is not None:
      self._pool.shutdown()
      self._pool = None

  def reweigh(self, row: int, r: int) -> None:
    """`UnitCache.reweigh` of one cache after request r - 1 (the reach prior as of it)."""
    _reweigh(row, *self._state(), self.T, self.S, self.reach[max(r - 1, 0)])

  def score(self, rows, r0: int, r1: int, unit: int, decay: float, score: list[float]):
    """`adaptive`'s decayed score of `rows` over requests r0..r1 - 1; returns the new list."""
    out = np.asarray(score, np.float64)
    _, _, _, fl, _ = self.T
    _score(self.hits_out, np.asarray(rows, np.int64), r0, r1, fl, unit, decay, out)
    return out.tolist()

  def used(self, row: int) -> int:
    _, _, page, state = self.S
    return int(self.ints[row, _PAGES] * page + self.ints[row, _NCKPT] * state)

  def admitted(self, row: int) -> int:
    return int(self.ints[row, _ADMITTED])

  def evicted(self, row: int) -> int:
    return int(self.ints[row, _EVICTED])

  def retired(self, row: int) -> int:
    return int(self.ints[row, _RETIRED])


__all__ = ["MAX_CANDS", "NUM_KINDS", "PRIOR_CODES", "RULE_CODES", "CompiledBank"]
