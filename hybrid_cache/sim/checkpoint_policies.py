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

This module is the entry (`run_checkpoint`, `sweep_checkpoint`, `sweep_settings`); each part
has its own file:

  checkpoint_placement.py   the rules: `parse_placement`, `candidates` (branch point, leaf or
                            continuation point), place(hit depth).
  adaptive_stats.py         what `adaptive` learns online: the divergences' alignment and output
                            reuse (`DivergenceStats`), and whether superseded checkpoints are
                            used again (`SupersessionStats`, which turns retirement on).
  eviction_weightings.py    the eviction weightings (`Weighting`: `SHADOW_WEIGHTINGS`, `LRU2`) and
                            `adaptive`'s online re-tuning among them (shadow caches).
  checkpoint_replay.py      what every capacity of a replay shares (`_Replay`: trie, statistics,
                            rule), each capacity's caches (`_Point`) and summary, TTFT with copies.
  checkpoint_sweep.py       the sequential replay of many capacities and settings in one walk,
                            on `compiled_replay` (numba, default) or `UnitCache` ("python").
  checkpoint_concurrent.py  the concurrent replay (`concurrent.py`) of one capacity.

All of it reads requests 0..r only, so a cut trace replays as the prefix of the full one.

Replays: "sequential" (default: one request at a time, lookup and insertion together, as the
other simulators) or "concurrent" (arrivals at the trace's timestamps, a token budget per step,
several running requests; the lookup at admission, the insertion when the request finishes).
The concurrent schedule depends on the capacity (refused admissions), so it replays one capacity
(`run_checkpoint`); `sweep_checkpoint` is sequential.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence

from hybrid_cache.sim import concurrent
from hybrid_cache.sim.checkpoint_concurrent import _run_concurrent
from hybrid_cache.sim.checkpoint_replay import _Replay
from hybrid_cache.sim.checkpoint_sweep import _sweep_compiled
from hybrid_cache.sim.checkpoint_sweep import _sweep_python
from hybrid_cache.sim.cost_model import CostModel
from hybrid_cache.sim.eviction_weightings import Weighting
from hybrid_cache.sim.eviction_weightings import _setting_of
from hybrid_cache.sim.trace import Trace

REPLAYS = ("sequential", "concurrent")
BACKENDS = ("compiled", "python")


def run_checkpoint(
  trace: Trace,
  model: CostModel,
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
  model: CostModel,
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


def sweep_settings(
  trace: Trace,
  model: CostModel,
  capacities: Sequence[float],
  policy: str,
  settings: Sequence[Weighting | None],
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
    settings: each None (`adaptive`'s online re-tuning) or a fixed eviction `Weighting`
      (`eviction_weightings.py`: alpha None = plain LRU, the only choice of the rules other
      than `adaptive`, e.g. `PLAIN_LRU`; penultimate True = LRU-2 on chains, `adaptive` only,
      `LRU2`).
    retirement: False turns off `adaptive`'s retirement of superseded checkpoints (for
      ablations: `SupersessionStats` still runs, every request's decision is False).
    others: as `sweep_checkpoint`.

  Returns:
    [[(triples, extra summary fields)] per capacity, in order] per setting, in order; each
    point equals its own `run_checkpoint` with that setting.
  """
  if backend not in BACKENDS:
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
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


__all__ = ["BACKENDS", "REPLAYS", "run_checkpoint", "sweep_checkpoint", "sweep_settings"]
