"""What every capacity of a checkpoint-policy replay shares, and each capacity's caches and summary.

Issue 15, item 3 (`checkpoint_policies.py`). `_Replay` holds what does not depend on the
capacity: the trie of everything seen (`SeenTrie`), the divergence and supersession statistics
(`adaptive_stats.py`) and the placement rule (`checkpoint_placement.py`); `_Replay.walk` is the
capacity-independent half of a request (trie walk, candidate points, the retirement decision),
done once per request for every capacity. Each capacity (and setting) is a `_Point`: its live
cache and, under `adaptive`'s re-tuning, its shadows (`eviction_weightings.py`), all rows of one
`CacheBank`. The sequential replays (`checkpoint_sweep.py`) and the concurrent one
(`checkpoint_concurrent.py`) drive them; `_summary` reports one point.

TTFT with copies: each request's TTFT (`CostModel.ttft_ms` of its uncached tokens) plus the
time to write its new checkpoints and to restore the hit's state, at `STATE_COPY_GB_PER_S`
(`ttft_*_ms_with_copies`, `checkpoint_copy_bytes`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hybrid_cache.sim.adaptive_stats import DivergenceStats
from hybrid_cache.sim.adaptive_stats import SupersessionStats
from hybrid_cache.sim.cache_bank import CacheBank
from hybrid_cache.sim.checkpoint_cache import UnitCache
from hybrid_cache.sim.checkpoint_costs import CacheSizes
from hybrid_cache.sim.checkpoint_placement import _deepest_placement
from hybrid_cache.sim.checkpoint_placement import _placer
from hybrid_cache.sim.checkpoint_placement import candidates
from hybrid_cache.sim.checkpoint_placement import parse_placement
from hybrid_cache.sim.eviction_weightings import DEFAULT_WEIGHTING
from hybrid_cache.sim.eviction_weightings import SHADOW_WEIGHTINGS
from hybrid_cache.sim.eviction_weightings import Weighting
from hybrid_cache.sim.eviction_weightings import _check_setting
from hybrid_cache.sim.seen_trie import SeenTrie

# Payload bandwidth of one state-slot copy on an H100: 18 MiB in 104 us (BENCHMARKS.md,
# bench_state_copy, pallas[1024,4], 1 copy); charged to TTFT per checkpoint written and per
# state restored for a hit.
STATE_COPY_GB_PER_S = 18 * 2**20 / 104e-6 / 1e9


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


@dataclasses.dataclass
class _LiveCounts:
  """What `_summary` reads of a live cache, from the compiled backend."""

  admitted_ckpts: int
  evicted_ckpts: int
  retired_ckpts: int
  used: int
  alpha: float | None


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

    def cache(w: Weighting, sizes: CacheSizes, retuned: bool = False) -> UnitCache:
      return UnitCache(
        trie, sizes, model, w.alpha, w.prior, w.frequency, bank, retuned=retuned,
        penultimate=w.penultimate,
      )  # fmt: skip

    for st, sizes in self.specs:
      if st is None:  # `adaptive`'s online re-tuning: a live cache and its shadows
        live = cache(weightings[DEFAULT_WEIGHTING], sizes, retuned=True)
        shadows = [cache(w, sizes) for w in weightings]
      else:
        live = cache(st, sizes)
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
    "weighting": weightings[pt.current].name if tuned else None,
    "alpha_requests": dict(sorted(pt.alphas_used.items())) if tuned else None,
    "wall_s": wall,
  }
  return triples, extra


__all__ = ["STATE_COPY_GB_PER_S"]
