"""Checkpoint placement rules over `checkpoint_cache.UnitCache`, and the `adaptive` policy.

Issue 15, item 3. Every rule picks, at prefill time of request r, the depths d (in units of U
tokens, hit < d <= r's computed units) that get a checkpoint; the kernels emit a state at any
chunk boundary at no extra compute, so a rule costs only the bytes it keeps.

  ckpt_dense       every unit (a state every U tokens), LRU eviction.
  ckpt_sparse:K    every K units (every K U tokens), LRU eviction.
  ckpt_branch      Marconi's placement at U granularity: the branch point (the deepest unit r
                   shares with any earlier request, if deeper than r's hit) and the last
                   computed unit of r (its leaf), LRU eviction.
  adaptive         learned placement + chain-aware FLOP-aware eviction, online (below).

`adaptive`. Placement: the branch point (as above: a prefix some earlier request computed too is
shared by >= 2 sequences) and one *continuation* point where r's successor is expected to
diverge, from two statistics of what the cache has seen (`DivergenceStats`, decayed counts over
the divergences observed so far, never the future):
  - alignment A: the largest 2^j units (j <= 4) such that >= 90% of the observed divergence
    depths are multiples of A (traces hashed in blocks diverge only on block boundaries:
    Mooncake's 512-token blocks give A = 8 units at U = 64); 1 until 16 divergences are seen;
  - output reuse: the share of divergences that lie in an earlier request's output region
    (chat histories re-send the answer; Mooncake's fresh output ids never match). The
    continuation point is the last multiple of A within r's input (share < 1/2) or within its
    computed tokens (share >= 1/2).
And retirement: while the points r's placements supersede (those above its deepest new one on
its path) are rarely used again (`SupersessionStats`: a chat session's next turn continues at
the last turn's end), the caches drop the superseded checkpoints as r's are inserted
(`UnitCache`, "Retirement"): with LRU-2 then eligible as a shadow, real ShareGPT +14% to +30%
at 2e9-4e9, synthetic chat -1% to +11%, the other traces unchanged (BENCHMARKS.md, "Retiring
superseded checkpoints").
Eviction: GreedyDual over chain units weighted by FLOPs saved per byte (`UnitCache`), with a
prior per placement kind and length class of the request: the share of such candidate points
that a later request has passed so far (`SeenTrie.reach_prior`, counted on the trie of
everything seen, whether a cache kept the point or not: a prior counted on the cache's own hits
feeds on itself, as an evicted point is never hit), hit counts and an exponent
alpha re-tuned online: shadow caches replay the same requests with fixed weightings
(`SHADOW_WEIGHTINGS`: plain LRU, alpha 0 and 1 with frequency and either prior, alpha 2
alone, and LRU-2 on chains, eligible only while superseded checkpoints are retired; same
placement rule), and every `RETUNE_EVERY` requests the live cache takes the
weighting whose shadow saved the most FLOPs over the recent requests (decayed, half-life
`RETUNE_HALF_LIFE`) and re-weights the checkpoints it holds under it (`_retune`).
All of it reads requests 0..r only, so a cut trace replays as the prefix of the full one.

Sweeps: `sweep_checkpoint` replays one trace for many capacities at once (the trie walk,
hashes and candidate points are capacity-independent and done once per request, and so is the
write of the units the request creates, which every cache inserts: `CacheBank.insert_fresh`;
each capacity keeps its own caches, rows of one `CacheBank`); every point equals its own
`run_checkpoint`. The sequential replay runs on `compiled_replay` (numba) by default: the
capacity-independent walk of the whole trace first (`_walk_all`), then the caches' steps
compiled, the same decisions bit for bit as `UnitCache` (`backend="python"`, the reference, and
what the concurrent replay runs). A new rule or weighting goes into `UnitCache` (and this
module) first and runs with `backend="python"`; `tests/hybrid_cache/sim/compiled_replay_test.py`
fails until `compiled_replay` makes the same decisions.

TTFT with copies: each request's TTFT (`ModelConfig.ttft_ms` of its uncached tokens) plus the
time to write its new checkpoints and to restore the hit's state, at `STATE_COPY_GB_PER_S`
(`ttft_*_ms_with_copies`, `checkpoint_copy_bytes`).

Replays: "sequential" (default: one request at a time, lookup and insertion together, as the
other simulators) or "concurrent" (`concurrent.py`: arrivals at the trace's timestamps, a token
budget per step, several running requests; the lookup at admission, the insertion when the
request finishes; the live cache refuses an admission it cannot hold, `UnitCache.can_admit`,
and the shadows follow the live cache's schedule). Concurrent TTFTs include queueing and the
copies (restores in the admission step, checkpoint writes after the finishing step). The
concurrent schedule depends on the capacity (refused admissions), so it replays one capacity
(`run_checkpoint`); `sweep_checkpoint` is sequential.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from collections.abc import Sequence

import numpy as np

from hybrid_cache.sim import compiled_replay
from hybrid_cache.sim import concurrent
from hybrid_cache.sim.checkpoint_cache import PRIORS
from hybrid_cache.sim.checkpoint_cache import CacheBank
from hybrid_cache.sim.checkpoint_cache import CacheSizes
from hybrid_cache.sim.checkpoint_cache import SeenTrie
from hybrid_cache.sim.checkpoint_cache import UnitCache
from hybrid_cache.sim.checkpoint_cache import flops_table
from hybrid_cache.sim.checkpoint_cache import grown
from hybrid_cache.sim.cost_model import ModelConfig
from hybrid_cache.sim.trace import Trace

PLACEMENTS = ("ckpt_dense", "ckpt_sparse:<K>", "ckpt_branch", "adaptive")
REPLAYS = ("sequential", "concurrent")
BACKENDS = ("compiled", "python")
SPARSE_PREFIX = "ckpt_sparse:"
# (label, alpha, prior, frequency, penultimate) of the shadow caches; "lru" = every weight 1
# (plain LRU)
SHADOW_WEIGHTINGS = (
  ("lru", 0.0, "none", False, False),
  ("hits/0", 0.0, "hits", True, False),
  ("hits/1", 1.0, "hits", True, False),
  ("reach/0", 0.0, "reach", True, False),
  ("reach/1", 1.0, "reach", True, False),
  # FLOPs saved per byte only, strongly (GreedyDual-Size): the best fixed weighting on the
  # synthetic chat trace (+3% to +12% over the tuned live cache at 8e9); as a shadow +0% to +7%
  # there, +0.0% to +0.4% elsewhere (BENCHMARKS.md, "Ablation of `adaptive`")
  ("none/2", 2.0, "none", False, False),
  # LRU-2 on chains (`UnitCache(penultimate=True)`): eligible only while superseded
  # checkpoints are retired (`SupersessionStats`: chains are then sessions, whose last
  # interval predicts the next). With retirement, against the other shadows alone: real
  # ShareGPT +4% to +59%, synthetic chat -5.5% to +1.3%; eligible everywhere (session 23,
  # without retirement) it cost Mooncake synthetic -2.5% to -7% (the tuner's trajectory;
  # BENCHMARKS.md, "Retiring superseded checkpoints")
  ("lru2", None, "none", False, True),
)
LRU2 = SHADOW_WEIGHTINGS[-1]  # also a fixed setting of `run_checkpoint` / `sweep_settings`
DEFAULT_WEIGHTING = 2  # the live cache's weighting before the first re-tune (hits/1)
RETUNE_EVERY = 256
RETUNE_HALF_LIFE = 2048.0
KIND_GRID, KIND_BRANCH, KIND_INPUT_END, KIND_SEQ_END = 0, 1, 2, 3
# Payload bandwidth of one state-slot copy on an H100: 18 MiB in 104 us (BENCHMARKS.md,
# bench_state_copy, pallas[1024,4], 1 copy); charged to TTFT per checkpoint written and per
# state restored for a hit.
STATE_COPY_GB_PER_S = 18 * 2**20 / 104e-6 / 1e9
_MAX_ALIGN_LOG2 = 4
_MIN_OBS = 16.0
_DECAY = 0.995
# `SupersessionStats`: retire superseded checkpoints while fewer than this share of them are
# used again (chat-like traces measure <= 0.02, agentic and Mooncake >= 0.23)
RETIRE_SHARE = 0.1


_LEN_CLASSES = 8


def length_class(units: int) -> int:
  """log2 class of a request's computed units (0: < 16 units, ..., 7: >= 2048 units)."""
  return min(max(units, 1).bit_length() - 4, _LEN_CLASSES - 1) if units >= 16 else 0


def parse_placement(name: str) -> tuple[str, int]:
  """(rule, K) of a checkpoint policy name; ValueError naming the allowed ones."""
  if name in ("ckpt_dense", "ckpt_branch", "adaptive"):
    return name, 1
  if name.startswith(SPARSE_PREFIX):
    raw = name[len(SPARSE_PREFIX) :]
    try:
      k = int(raw)
    except ValueError:
      k = 0
    if k < 1:
      raise ValueError(f"ckpt_sparse's K must be an integer >= 1, got {raw!r} in {name!r}")
    return "ckpt_sparse", k
  raise ValueError(f"checkpoint policy must be one of {PLACEMENTS}, got {name!r}")


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


def candidates(
  rule: str,
  stats: DivergenceStats,
  n_path: int,
  n_in_units: int,
  seen: int,
  length_classes: bool = False,
) -> list[tuple[int, int]]:
  """The branch-point and leaf/continuation depths of a request with their kinds (any hit).

  `adaptive` kinds carry the request's length class (kind * _LEN_CLASSES + class): the
  eviction prior is learned per (kind, length class), as short contexts are continued more
  often than long ones (Mooncake conversation trace: 64% of inputs < 4k tokens, 31% of > 20k).
  """
  out: dict[int, int] = {}
  if seen > 0:
    out[seen] = KIND_BRANCH
  if rule == "ckpt_branch":
    if n_path > 0:
      out.setdefault(n_path, KIND_SEQ_END)
    return sorted(out.items())
  a = stats.alignment()
  if stats.output_reused():
    c, kind = (n_path // a) * a, KIND_SEQ_END
  else:
    c, kind = (min(n_in_units, n_path) // a) * a, KIND_INPUT_END
  if c > 0:
    out.setdefault(c, kind)
  cls = length_class(n_path) if length_classes else 0
  return sorted((q, kk * _LEN_CLASSES + cls) for q, kk in out.items())


def _deepest_placement(rule: str, k: int, n_path: int, cands: list[tuple[int, int]]) -> int:
  """The deepest depth `_placer(rule, k, n_path, cands)(d)` returns for every hit d below it
  (0: none): each rule's points deeper than the hit are a hit-independent set cut at the hit."""
  if rule == "ckpt_dense":
    return n_path
  if rule == "ckpt_sparse":
    return (n_path // k) * k
  return max((q for q, _ in cands), default=0)


def _placer(rule: str, k: int, n_path: int, cands: list[tuple[int, int]]):
  """place(hit_depth) -> [(depth, kind)] deeper than the hit, ascending (see the module doc).

  The lists are memoised by hit depth and shared by every cache that asks with the same
  depth (the K caches of a sweep mostly hit at the same few depths): callers must not
  modify them."""
  memo: dict[int, list[tuple[int, int]]] = {}

  def place(d: int) -> list[tuple[int, int]]:
    got = memo.get(d)
    if got is None:
      if rule == "ckpt_dense":
        got = [(q, KIND_GRID) for q in range(d + 1, n_path + 1)]
      elif rule == "ckpt_sparse":
        got = [(q, KIND_GRID) for q in range((d // k + 1) * k, n_path + 1, k)]
      else:
        got = [(q, kind) for q, kind in cands if q > d]
      memo[d] = got
    return got

  return place


@dataclasses.dataclass
class _Point:
  """One capacity of a sweep: its live cache, shadows (adaptive) and per-request records."""

  sizes: CacheSizes
  live: UnitCache
  shadows: list[UnitCache]
  score: list[float]
  current: int = DEFAULT_WEIGHTING
  alphas_used: dict[str, int] = dataclasses.field(default_factory=dict)
  triples: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
  copy_bytes: list[int] = dataclasses.field(default_factory=list)
  tuned: bool = False  # the live cache is re-tuned online among its shadows' weightings


def _best_shadow(score: list[float], weightings, retire: bool) -> int:
  """The shadow with the best decayed score (ties: the first) among the eligible ones: an
  LRU-2 weighting only while superseded checkpoints are retired (`SHADOW_WEIGHTINGS`)."""
  ok = [i for i in range(len(score)) if retire or not weightings[i][4]]
  return max(ok, key=lambda i: (score[i], -i))


def _retune(pt: _Point, weightings, retire: bool) -> None:
  """`adaptive`'s online re-tuning of one capacity: the live cache takes the weighting whose
  shadow has the best decayed score among the eligible ones (`_best_shadow`; `retire`: the
  current request's retirement decision). On a change its held checkpoints are
  re-weighted at their stamps (`UnitCache.reweigh`), so that its heap orders every unit by
  the one weighting it now has: without it, units pushed under the old weighting kept their
  old priorities, whose scale differs (LRU's weight is 1, hits/1's a product of hit counts, a
  prior and a FLOPs ratio), and the live cache evicted in a mixed order for a long while
  (BENCHMARKS.md, "Re-weighting on a re-tune switch": FLOPs saved +1.0% to +5.3% on the five
  Mooncake points, -1.7% to +1.6% on the synthetic ones, +0.8% mean over 17).
  """
  best = _best_shadow(pt.score, weightings, retire)
  if best != pt.current:
    pt.current = best
    live = pt.live
    _, live.alpha, live.prior, live.frequency, live.penultimate = weightings[best]
    live.reweigh()


def run_checkpoint(
  trace: Trace,
  model: ModelConfig,
  capacity_bytes: float,
  policy: str,
  unit: int = 64,
  block_size: int = 64,
  alpha: float | None = None,
  prior: str = "hits",
  frequency: bool = True,
  length_classes: bool = False,
  penultimate: bool = False,
  replay: str = "sequential",
  step_tokens: int = concurrent.DEFAULT_STEP_TOKENS,
  max_running: int = concurrent.DEFAULT_MAX_RUNNING,
  arrival_scale: float = 1.0,
  backend: str = "compiled",
) -> tuple[list[tuple[int, int, int]], dict]:
  """Replays `trace` under a checkpoint policy; returns (triples, summary fields).

  Args:
    trace: requests in replay order.
    model: cost model (bytes, FLOPs).
    capacity_bytes: one capacity for KV pages and checkpoints (> 0).
    policy: a `PLACEMENTS` name.
    unit: checkpoint unit U in tokens (hits and states at multiples of U).
    block_size: KV page B in tokens.
    alpha: `adaptive` only: a fixed eviction exponent >= 0 instead of the online re-tuning.
    prior, frequency: `adaptive`'s eviction weight terms with a fixed alpha (`UnitCache`; for
      ablations; the online re-tuning chooses among `SHADOW_WEIGHTINGS`).
    length_classes: `adaptive`'s priors per (kind, length class) instead of per kind.
    penultimate: `adaptive` with LRU-2 on chains as its fixed eviction (`UnitCache`; alpha
      must be None) instead of the online re-tuning.
    replay: "sequential" or "concurrent" (module docstring).
    step_tokens, max_running, arrival_scale: the concurrent replay's token budget per step, most
      running requests and arrival-time multiplier (`concurrent.replay_concurrent`).
    backend: the sequential replay's `sweep_checkpoint` backend ("compiled" or "python": same
      results); the concurrent replay always runs `UnitCache`.

  Returns:
    ([hit, input tokens, reused tokens] per request, extra summary fields).
  """
  if replay not in REPLAYS:
    raise ValueError(f"replay must be one of {REPLAYS}, got {replay!r}")
  if replay == "concurrent":
    return _run_concurrent(
      trace,
      model,
      capacity_bytes,
      policy,
      unit,
      block_size,
      alpha,
      prior,
      frequency,
      length_classes,
      step_tokens,
      max_running,
      arrival_scale,
      penultimate,
    )
  return sweep_checkpoint(
    trace,
    model,
    [capacity_bytes],
    policy,
    unit,
    block_size,
    alpha=alpha,
    prior=prior,
    frequency=frequency,
    length_classes=length_classes,
    backend=backend,
    penultimate=penultimate,
  )[0]


def sweep_checkpoint(
  trace: Trace,
  model: ModelConfig,
  capacities: Sequence[float],
  policy: str,
  unit: int = 64,
  block_size: int = 64,
  alpha: float | None = None,
  prior: str = "hits",
  frequency: bool = True,
  length_classes: bool = False,
  progress: Callable[[int], None] | None = None,
  backend: str = "compiled",
  penultimate: bool = False,
) -> list[tuple[list[tuple[int, int, int]], dict]]:
  """`run_checkpoint` at every capacity of `capacities` in one replay of the trace.

  Everything that does not depend on the capacity is done once per request and shared: the
  trace's unit hashes and the trie walk (`SeenTrie`, incl. the placement kinds' reach counts),
  the learned alignment and output reuse (`DivergenceStats`) and so the candidate points; none
  of them reads a cache. Each capacity keeps its own caches (the live one and, for `adaptive`,
  its shadows; K caches in all, the rows of one `CacheBank`, whose hits along r's path are
  looked up in one gather) and serves request r after the shared work of r, as
  `run_checkpoint` does (the caches read the shared trie's reach counts as of r), so
  every capacity's result is identical to its own `run_checkpoint` call (same triples, same
  summary; `wall_s` is the whole sweep's replay time).

  Args:
    capacities: one or more capacities in bytes (each finite and > 0), any order.
    progress: called with the number of requests done (e.g. a tqdm update): after each request
      ("python"), after each chunk of up to `RETUNE_EVERY` requests ("compiled").
    backend: "compiled" (`compiled_replay`, numba: the same decisions bit for bit, ~10x less
      time per cache; it falls back to "python" when a FLOPs value overflows int64) or "python"
      (`UnitCache`, the reference).
    others: as `run_checkpoint`.

  Returns:
    [(triples, extra summary fields)] in the order of `capacities`.
  """
  setting = _setting_of(policy, alpha, prior, frequency, penultimate)
  return sweep_settings(
    trace,
    model,
    capacities,
    policy,
    [setting],
    unit,
    block_size,
    length_classes=length_classes,
    progress=progress,
    backend=backend,
  )[0]


def _setting_of(policy: str, alpha, prior: str, frequency: bool, penultimate: bool = False):
  """The one setting of `run_checkpoint`'s arguments: `adaptive`'s online re-tuning (alpha
  None), a fixed weighting (alpha given), LRU-2 (penultimate), or plain LRU (the other
  rules); `_check_setting` validates it."""
  rule, _ = parse_placement(policy)
  if penultimate:
    if alpha is not None:
      raise ValueError(f"penultimate (LRU-2) takes no alpha, got alpha {alpha!r}")
    return LRU2[1:]
  if rule == "adaptive" and alpha is None:
    return None
  try:
    alpha = None if alpha is None else float(alpha)
  except (TypeError, ValueError):
    raise ValueError(f"alpha must be None or a number in [0, 100], got {alpha!r}") from None
  return (alpha, prior, frequency, False)


def _check_setting(rule: str, setting) -> None:
  """ValueError unless `setting` is None (the online re-tuning, `adaptive` only) or
  (alpha, prior, frequency) with alpha None (plain LRU) or in [0, 100] (`adaptive` only)."""
  if setting is None:
    if rule != "adaptive":
      raise ValueError(f"the online re-tuning (setting None) is adaptive's, not {rule}'s")
    return
  if not (isinstance(setting, tuple | list) and len(setting) == 4):
    raise ValueError(
      f"a setting must be None or (alpha, prior, frequency[, penultimate]), got {setting!r}"
    )
  alpha, prior, _, penultimate = setting
  if penultimate and rule != "adaptive":
    raise ValueError(f"penultimate (LRU-2) is a weighting of adaptive, not of {rule}")
  if alpha is not None and (rule != "adaptive" or not 0.0 <= float(alpha) <= 100.0):
    raise ValueError(f"alpha must be None or in [0, 100] for adaptive only, got {alpha!r}")
  if prior not in PRIORS:
    raise ValueError(f"prior must be one of {PRIORS}, got {prior!r}")


def sweep_settings(
  trace: Trace,
  model: ModelConfig,
  capacities: Sequence[float],
  policy: str,
  settings: Sequence[tuple | None],
  unit: int = 64,
  block_size: int = 64,
  length_classes: bool = False,
  progress: Callable[[int], None] | None = None,
  backend: str = "compiled",
  retirement: bool = True,
) -> list[list[tuple[list[tuple[int, int, int]], dict]]]:
  """`sweep_checkpoint` over a grid of eviction settings x capacities in one replay: one walk
  of the trace, and with the compiled backend one `compiled_replay.CompiledBank` holding every
  point's caches (the capacity and alpha sweeps of issue 15, item 5, as one program with a
  batch axis of caches).

  Args:
    settings: each None (`adaptive`'s online re-tuning) or (alpha, prior, frequency[,
      penultimate]): a fixed eviction weighting (`UnitCache`'s arguments; alpha None = plain
      LRU, the only choice of the rules other than `adaptive`; penultimate True = LRU-2 on
      chains, `adaptive` only).
    retirement: False turns off `adaptive`'s retirement of superseded checkpoints (for
      ablations: `SupersessionStats` still runs, every request's decision is False).
    others: as `sweep_checkpoint`.

  Returns:
    [[(triples, extra summary fields)] per capacity, in order] per setting, in order; each
    point equals its own `run_checkpoint` with that setting.
  """
  if backend not in BACKENDS:
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
  # (alpha, prior, frequency) reads as not LRU-2
  settings = [
    (*st, False) if isinstance(st, tuple | list) and len(st) == 3 else st for st in settings
  ]
  caches = backend == "python"
  args = (trace, model, capacities, policy, unit, block_size, settings, length_classes)
  rep = _Replay(*args, caches=caches, retirement=retirement)
  if not caches:
    out = _sweep_compiled(rep, trace, model, progress)
    if out is None:  # FLOPs beyond int64: the Python backend
      rep = _Replay(*args, retirement=retirement)
  if caches or out is None:
    out = _sweep_python(rep, trace, model, progress)
  n = len(capacities)
  return [out[i * n : (i + 1) * n] for i in range(len(settings))]


def _sweep_python(rep: _Replay, trace: Trace, model: ModelConfig, progress):
  """The sequential replay on `UnitCache`s (the reference backend): every point's result."""
  trie, stats, bank, points = rep.trie, rep.stats, rep.bank, rep.points
  weightings = rep.weightings
  decay = 0.5 ** (1.0 / RETUNE_HALF_LIFE)
  u = rep.unit
  fl = flops_table(model, u).values  # extended by each serve to the request's depth
  t0 = time.perf_counter()
  for r, req in enumerate(trace.requests):
    path, seen, cap, place, deepest, retire = rep.prepare(req, r)
    n_in = req.num_input_tokens
    n_comp = n_in + max(req.num_output_tokens - 1, 0)
    pa, old = trie.path_array(path), trie.last_old
    found = bank.lookup(pa, cap, old)
    fresh = None
    if deepest > old:  # every cache adds r's new units up to `deepest`: one write for all
      bank.insert_fresh(pa, old, deepest)
      fresh = (old, deepest)
    for pt in points:
      live = pt.live
      before = live.admitted_ckpts
      h = live.serve(r, path, cap, n_comp, place, found[live.row], fresh, retire)
      pt.triples.append((int(h > 0), n_in, h))
      pt.copy_bytes.append((live.admitted_ckpts - before + (1 if h else 0)) * pt.sizes.ckpt_bytes)
      score = pt.score
      for i, sh in enumerate(pt.shadows):
        hs = sh.serve(r, path, cap, n_comp, place, found[sh.row], fresh, retire)
        score[i] = score[i] * decay + (fl[hs // u] if hs else 0)  # = sh.flops(hs // u)
      if pt.tuned:
        lab = weightings[pt.current][0]
        pt.alphas_used[lab] = pt.alphas_used.get(lab, 0) + 1
        if (r + 1) % RETUNE_EVERY == 0:
          _retune(pt, weightings, retire)
    if 0 < seen < cap:
      stats.observe(seen, trie.out[path[seen - 1]])
    if progress is not None:
      progress(r + 1)
  wall = time.perf_counter() - t0
  return [_summary(pt, model, rep, wall) for pt in points]


@dataclasses.dataclass
class _LiveCounts:
  """What `_summary` reads of a live cache, from the compiled backend."""

  admitted_ckpts: int
  evicted_ckpts: int
  retired_ckpts: int
  used: int
  alpha: float | None


def _cpus() -> int:
  """The CPUs this process may run on (the compiled backend's threads)."""
  if hasattr(os, "sched_getaffinity"):
    return max(1, len(os.sched_getaffinity(0)))
  return max(1, os.cpu_count() or 1)


def _walk_all(rep: _Replay, trace: Trace):
  """The capacity-independent half of a sequential replay, for the whole trace at once (it
  reads no cache): each request's trie walk, candidate points and deepest placement, the
  reach prior of each kind as of it, the divergence statistics after it (as the sweep's
  loop). Returns `compiled_replay.CompiledBank`'s (trie, reach, req, cands) arrays, or None
  when a FLOPs value does not fit int64."""
  trie, stats, u = rep.trie, rep.stats, rep.unit
  n_req = len(trace.requests)
  req = np.zeros((n_req, 8), np.int64)
  cands = np.zeros((n_req, 2, compiled_replay.MAX_CANDS), np.int64)
  reach = np.full((n_req, compiled_replay.NUM_KINDS), 0.5)  # (0 + 1) / (0 + 2)
  longest = 0
  for r, q in enumerate(trace.requests):
    start = trie.flat_len
    path, seen, cap, cs, deepest, retire = rep.walk(q, r)
    n_in = q.num_input_tokens
    n_comp = n_in + max(q.num_output_tokens - 1, 0)
    req[r] = (start, len(path), trie.last_old, cap, n_comp, deepest, len(cs), retire)
    for i, (depth, kind) in enumerate(cs):
      cands[r, 0, i], cands[r, 1, i] = depth, kind
    for kind, placed in trie.placed.items():
      reach[r, kind] = (trie.reached.get(kind, 0.0) + 1.0) / (placed + 2.0)
    longest = max(longest, len(path))
    if 0 < seen < cap:
      stats.observe(seen, trie.out[path[seen - 1]])
  fl = flops_table(rep.model, u).extend(max(longest, 1))  # depth 1: the flat-weight test
  if fl[-1] >= 2**63:
    return None
  tables = (
    np.asarray(trie.depth, np.int64),
    np.asarray(trie.home, np.int64),
    trie.flat[: trie.flat_len].copy(),
    np.asarray(fl, np.int64),
    trie.reused_from[: len(trie)].copy(),
  )
  return tables, reach, req, cands


def _sweep_compiled(rep: _Replay, trace: Trace, model: ModelConfig, progress):
  """`sweep_checkpoint` on `compiled_replay.CompiledBank` (None: FLOPs overflow int64, use
  the Python backend). The same caches as `_Replay` builds, the same re-tuning."""
  t0 = time.perf_counter()
  walked = _walk_all(rep, trace)
  if walked is None:
    return None
  tables, reach, req, cands = walked
  u, weightings = rep.unit, rep.weightings
  sizes0 = rep.specs[0][1]
  bank = compiled_replay.CompiledBank(
    len(rep.trie),
    (u, sizes0.block_size, sizes0.kv_page_bytes, sizes0.ckpt_bytes),
    tables,
    reach,
    req,
    cands,
    compiled_replay.RULE_CODES[rep.rule],
    rep.k,
  )
  rows = []  # per point: (setting, sizes, live row, shadow rows)
  for st, sizes in rep.specs:
    if st is None:
      _, a0, p0, f0, q0 = weightings[DEFAULT_WEIGHTING]
      live = bank.add(sizes.capacity, a0, p0, f0, q0, retuned=True)
      shadows = [bank.add(sizes.capacity, a, pr, fr, q) for _, a, pr, fr, q in weightings]
    else:
      a, pr, fr, q = st
      live = bank.add(sizes.capacity, a, pr, fr, q)
      shadows = []
    rows.append((st, sizes, live, shadows))
  bank.start()
  decay = 0.5 ** (1.0 / RETUNE_HALF_LIFE)
  n_req = len(trace.requests)
  current = [DEFAULT_WEIGHTING] * len(rows)
  scores = [[0.0] * len(sh) for *_, sh in rows]
  used: list[dict[str, int]] = [{} for _ in rows]
  every = np.arange(bank.ints.shape[0])
  threads = _cpus()
  for r0 in range(0, n_req, RETUNE_EVERY):
    r1 = min(r0 + RETUNE_EVERY, n_req)
    bank.serve(every, r0, r1, threads)
    for i, (st, _, live, shadows) in enumerate(rows):
      if st is not None:
        continue
      scores[i] = bank.score(shadows, r0, r1, u, decay, scores[i])
      lab = weightings[current[i]][0]
      used[i][lab] = used[i].get(lab, 0) + (r1 - r0)
      if r1 % RETUNE_EVERY == 0:  # `_retune`
        best = _best_shadow(scores[i], weightings, bool(req[r1 - 1, 7]))
        if best != current[i]:
          current[i] = best
          _, a, pr, fr, q = weightings[best]
          bank.set_weighting(live, a, pr, fr, q)
          bank.reweigh(live, r1)
    if progress is not None:
      progress(r1)
  bank.close()
  wall = time.perf_counter() - t0
  out = []
  n_in = [q.num_input_tokens for q in trace.requests]
  for i, (st, sizes, live, _) in enumerate(rows):
    hits = (bank.hits_out[live] * u).tolist()
    restores = bank.added_out[live] + (bank.hits_out[live] > 0)
    live_alpha = weightings[current[i]][1] if st is None else st[0]
    pt = _Point(
      sizes,
      _LiveCounts(
        bank.admitted(live), bank.evicted(live), bank.retired(live), bank.used(live), live_alpha
      ),
      [],
      [],
      current[i],
      dict(used[i]),
      [(int(h > 0), n, h) for h, n in zip(hits, n_in)],
      (restores * sizes.ckpt_bytes).tolist(),
      tuned=st is None,
    )
    out.append(_summary(pt, model, rep, wall))
  return out


class _Replay:
  """What every capacity of a replay shares (the trie, the divergence statistics, the
  placement rule) and each capacity's caches (`_Point`s, rows of one `CacheBank`)."""

  def __init__(
    self, trace, model, capacities, policy, unit, block_size, settings, lc, caches=True,
    retirement=True,
  ):  # fmt: skip
    """One point per (setting, capacity), setting-major (`sweep_settings`). caches False: no
    `UnitCache`s (`points` is empty; the compiled backend builds its own from `specs`).
    retirement False: no request retires (`sweep_settings`)."""
    rule, k = parse_placement(policy)
    if len(capacities) == 0:
      raise ValueError("capacities must hold at least one capacity, got none")
    if len(settings) == 0:
      raise ValueError("settings must hold at least one setting, got none")
    for st in settings:
      _check_setting(rule, st)
    sizes0 = CacheSizes.of(model, capacities[0], unit, block_size)
    self.rule, self.k, self.length_classes, self.unit = rule, k, lc, sizes0.unit
    self.recurrent = sizes0.recurrent
    trie = self.trie = SeenTrie(sizes0.unit)
    self.stats = DivergenceStats()
    self.supersession = SupersessionStats()
    self.retirement = retirement
    self.weightings = weightings = list(SHADOW_WEIGHTINGS)
    self.points = []
    self.model, self.block_size = model, block_size
    # (setting, sizes) per point; every capacity is checked, with caches or not
    self.specs = [
      (st, CacheSizes.of(model, capacity, unit, block_size))
      for st in settings
      for capacity in capacities
    ]
    bank = self.bank = CacheBank()  # every cache's per-node state, one row each
    if not caches:
      return
    for st, sizes in self.specs:
      if st is None:  # `adaptive`'s online re-tuning: a live cache and its shadows
        _, a0, p0, f0, q0 = weightings[DEFAULT_WEIGHTING]
        live = UnitCache(trie, sizes, model, a0, p0, f0, bank, retuned=True, penultimate=q0)
        shadows = [
          UnitCache(trie, sizes, model, a, pr, fr, bank, penultimate=q)
          for _, a, pr, fr, q in weightings
        ]
      else:
        alpha, prior, frequency, q = st
        live = UnitCache(trie, sizes, model, alpha, prior, frequency, bank, penultimate=q)
        shadows = []
      self.points.append(_Point(sizes, live, shadows, [0.0] * len(shadows), tuned=st is None))
    # the trie never outgrows the requests' computed units: reserve once (np.zeros pages are
    # only paid when touched) instead of copying [K, nodes] arrays as they double
    u = self.unit
    bank.grow(
      sum((q.num_input_tokens + max(q.num_output_tokens - 1, 0)) // u for q in trace.requests)
    )

  def walk(self, req, r: int):
    """The trie walk and candidate points of request r (before its lookup): (path, seen, hit
    cap in units, candidates [(depth, kind)], the deepest depth every cache's `finish` inserts
    up to: attention-only models place every unit, others `_deepest_placement`; retire: every
    cache's `finish` drops the checkpoints this request supersedes, `adaptive` only, by
    `SupersessionStats` as of the requests before it)."""
    trie, u, rule = self.trie, self.unit, self.rule
    path, seen = trie.walk(req)
    n_in = req.num_input_tokens
    cap = (n_in - 1) // u
    cands = []
    retire = False
    if rule in ("ckpt_branch", "adaptive"):
      cands = candidates(rule, self.stats, len(path), n_in // u, seen, self.length_classes)
      for q, kind in cands:
        trie.register(path[q - 1], kind)
    if rule == "adaptive":
      retire = self.retirement and self.recurrent and self.supersession.retire()
      self.supersession.observe(trie, r, trie.path_array(path), seen, cands)
    n = len(path)
    deepest = _deepest_placement(rule, self.k, n, cands) if self.recurrent else n
    return path, seen, cap, cands, deepest, retire

  def prepare(self, req, r: int):
    """`walk`, with the placement rule `place(hit depth)` instead of the candidates."""
    path, seen, cap, cands, deepest, retire = self.walk(req, r)
    self.bank.grow(len(self.trie))
    return path, seen, cap, _placer(self.rule, self.k, len(path), cands), deepest, retire


def _run_concurrent(
  trace,
  model,
  capacity_bytes,
  policy,
  unit,
  block_size,
  alpha,
  prior,
  frequency,
  length_classes,
  step_tokens,
  max_running,
  arrival_scale,
  penultimate=False,
):
  """`run_checkpoint` with replay "concurrent" (module docstring): one capacity's caches driven
  by `concurrent.replay_concurrent`, the lookup at admission (every cache of the bank in one
  gather, as the sweep), the insertion at finish."""
  setting = _setting_of(policy, alpha, prior, frequency, penultimate)
  rep = _Replay(trace, model, [capacity_bytes], policy, unit, block_size, [setting], length_classes)
  trie, stats, weightings, bank = rep.trie, rep.stats, rep.weightings, rep.bank
  pt = rep.points[0]
  tuned = pt.tuned
  live, shadows, score, sizes, u = pt.live, pt.shadows, pt.score, pt.sizes, rep.unit
  decay = 0.5 ** (1.0 / RETUNE_HALF_LIFE)
  n_req = len(trace.requests)
  hits = [0] * n_req
  copy_bytes = [0] * n_req
  placers = {}
  admitted = 0

  def admit(r: int):
    nonlocal admitted
    req = trace.requests[r]
    n_comp = req.num_input_tokens + max(req.num_output_tokens - 1, 0)
    if not live.can_admit(n_comp):
      return None
    path, seen, cap, place, _, retire = rep.prepare(req, r)
    placers[r] = place, retire
    found = bank.lookup(trie.path_array(path), cap, trie.last_old)
    hits[r] = live.admit(r, path, cap, n_comp, found[live.row])
    for i, sh in enumerate(shadows):
      hs = sh.admit(r, path, cap, n_comp, found[sh.row])
      score[i] = score[i] * decay + (sh.flops(hs // u) if hs else 0)
    admitted += 1
    if tuned:
      lab = weightings[pt.current][0]
      pt.alphas_used[lab] = pt.alphas_used.get(lab, 0) + 1
      if admitted % RETUNE_EVERY == 0:
        _retune(pt, weightings, retire)
    if 0 < seen < cap:
      stats.observe(seen, trie.out[path[seen - 1]])
    restore = sizes.ckpt_bytes if hits[r] else 0
    copy_bytes[r] = restore
    return hits[r], restore

  def finish(r: int) -> int:
    place, retire = placers.pop(r)
    written = live.finish(r, place, retire=retire) * sizes.ckpt_bytes
    for sh in shadows:
      sh.finish(r, place, retire=retire)
    copy_bytes[r] += written
    return written

  t0 = time.perf_counter()
  conc = concurrent.replay_concurrent(
    trace,
    model,
    admit,
    finish,
    lambda b: b / (STATE_COPY_GB_PER_S * 1e6),
    step_tokens=step_tokens,
    max_running=max_running,
    arrival_scale=arrival_scale,
  )
  pt.triples = [(int(h > 0), q.num_input_tokens, h) for q, h in zip(trace.requests, hits)]
  pt.copy_bytes = copy_bytes
  fields = conc.summary() | {
    "step_tokens": step_tokens,
    "max_running": max_running,
    "arrival_scale": arrival_scale,
  }
  return _summary(pt, model, rep, time.perf_counter() - t0, fields)


def _summary(pt: _Point, model, rep: _Replay, wall: float, conc=None):
  """(triples, extra summary fields) of one capacity (see `run_checkpoint`); `conc`: the
  concurrent replay's fields (they replace the sequential TTFTs with copies). `pt.live`: the
  live cache, or its `_LiveCounts` (compiled backend)."""
  trie, stats, weightings = rep.trie, rep.stats, rep.weightings
  sup = rep.supersession if rep.rule == "adaptive" else None
  triples, copy_bytes, live, sizes = pt.triples, pt.copy_bytes, pt.live, pt.sizes
  tuned = pt.tuned
  extra = {"checkpoint_copy_bytes": int(sum(copy_bytes))}
  if conc is None:
    ttft = model.ttft_ms(np.array([n - h for _, n, h in triples], np.int64))
    ttft = ttft + np.array(copy_bytes, np.float64) / (STATE_COPY_GB_PER_S * 1e6)
    extra["ttft_mean_ms_with_copies"] = float(ttft.mean()) if len(ttft) else 0.0
    extra["ttft_p95_ms_with_copies"] = float(np.percentile(ttft, 95)) if len(ttft) else 0.0
  else:
    extra |= conc
  extra |= {
    "checkpoint_unit": sizes.unit,
    "checkpoint_bytes": sizes.ckpt_bytes,
    "kv_page_bytes": sizes.kv_page_bytes,
    "states_admitted": live.admitted_ckpts,
    "states_evicted": live.evicted_ckpts,
    "states_retired": live.retired_ckpts,
    "final_cache_bytes": live.used,
    "trie_units": len(trie),
    "learned_alignment_units": stats.alignment(),
    "learned_output_reuse": stats.output_reused(),
    "superseded_used_share": None if sup is None else sup.share(),
    "learned_retirement": bool(sup and rep.retirement and sizes.recurrent and sup.retire()),
    "alpha": live.alpha,
    "weighting": weightings[pt.current][0] if tuned else None,
    "alpha_requests": dict(sorted(pt.alphas_used.items())) if tuned else None,
    "wall_s": wall,
  }
  return triples, extra


__all__ = [
  "PLACEMENTS",
  "REPLAYS",
  "DivergenceStats",
  "parse_placement",
  "run_checkpoint",
  "sweep_checkpoint",
]
