"""Host-side alpha tuning of FLOP-aware eviction (M§1.4 "Alpha tuning"), and cost fields.

Marconi's V2 keeps alpha = 0 until the first eviction; at that point the bootstrap window is
`multiplier * (requests seen so far)` (5 by default, 15 for LMSys-like traces); when that many
requests have been seen it replays them from an empty cache once per alpha of a grid
(0.0, 0.1, ..., 2.0) and adopts the alpha with the best score (the paper: hit rate; Marconi's
code: FLOPs saved over the last 500 replayed requests). The replay is a callback, so any
simulator can drive it:

  tuner = OnlineAlphaTuner(lambda alpha, n: sim_score(trace[:n], alpha))
  for i, req in enumerate(trace):
    ...serve req...
    new = tuner.observe(requests_seen=i + 1, evicted=any_eviction_so_far)
    if new is not None:
      state = flop_aware.set_alpha(state, new)

`cost_fields(model, groups, block_size)` turns a sim cost model
(`hybrid_cache.sim.cost_model.CostModel`, duck-typed) into `CacheConfig`'s eviction cost
fields.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

from hybrid_cache.core.groups import carries_mlp
from hybrid_cache.core.groups import rules as group_rules

ALPHA_GRID = tuple(i / 10 for i in range(21))
MAX_ALPHA = 100.0


def _check_grid(grid: Sequence[float]) -> tuple[float, ...]:
  if isinstance(grid, (str, bytes)) or not isinstance(grid, Sequence) or not grid:
    raise ValueError(f"grid must be a non-empty sequence of alphas in [0, {MAX_ALPHA:g}]")
  for i, a in enumerate(grid):
    bad = isinstance(a, bool) or not isinstance(a, (int, float))
    if bad or not 0 <= a <= MAX_ALPHA:
      raise ValueError(f"grid[{i}] must be a number in [0, {MAX_ALPHA:g}], got {a!r}")
  return tuple(float(a) for a in grid)


@dataclasses.dataclass(frozen=True)
class TuneResult:
  """The chosen alpha, every (alpha, score) tried in grid order, and the replayed requests."""

  alpha: float
  scores: tuple[tuple[float, float], ...]
  num_requests: int


def tune_alpha(
  replay: Callable[[float, int], float],
  num_requests: int,
  grid: Sequence[float] = ALPHA_GRID,
) -> TuneResult:
  """Replays the first `num_requests` requests once per alpha; best score wins.

  Args:
    replay: `replay(alpha, n) -> score` runs the first n requests from an empty cache with a
      static alpha and returns a score (higher is better, finite).
    num_requests: requests to replay (>= 1).
    grid: candidate alphas, each in [0, 100]; ties go to the earliest in grid order (the
      grid's first entry, usually 0 = LRU, wins when the FLOP term does not help).
  """
  g = _check_grid(grid)
  if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1:
    raise ValueError(f"num_requests must be an integer >= 1, got {num_requests!r}")
  scores = []
  for a in g:
    s = replay(a, num_requests)
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s):
      raise ValueError(f"replay({a}, {num_requests}) must return a finite number, got {s!r}")
    scores.append((a, float(s)))
  best = max(range(len(scores)), key=lambda i: (scores[i][1], -i))
  return TuneResult(alpha=scores[best][0], scores=tuple(scores), num_requests=num_requests)


class OnlineAlphaTuner:
  """Marconi's online tuner: alpha 0 until a bootstrap window after the first eviction.

  `observe` is called after every request; it returns the new alpha when a tuning round ran,
  else None. Marconi tunes once; `retune_every=k` (requests) tunes again every k requests
  after the first round, replaying everything seen so far (an extension, off by default).
  """

  def __init__(
    self,
    replay: Callable[[float, int], float],
    multiplier: int = 5,
    grid: Sequence[float] = ALPHA_GRID,
    retune_every: int | None = None,
  ):
    if isinstance(multiplier, bool) or not isinstance(multiplier, int) or multiplier < 1:
      raise ValueError(f"multiplier must be an integer >= 1, got {multiplier!r}")
    if retune_every is not None and (
      isinstance(retune_every, bool) or not isinstance(retune_every, int) or retune_every < 1
    ):
      raise ValueError(f"retune_every must be None or an integer >= 1, got {retune_every!r}")
    self._replay = replay
    self._grid = _check_grid(grid)
    self.multiplier = multiplier
    self.retune_every = retune_every
    self.alpha = 0.0
    self.window: int | None = None
    self.history: list[TuneResult] = []
    self._next: int | None = None

  def observe(self, requests_seen: int, evicted: bool) -> float | None:
    """Call after each request: requests served so far, and whether any eviction happened."""
    if isinstance(requests_seen, bool) or not isinstance(requests_seen, int) or requests_seen < 1:
      raise ValueError(f"requests_seen must be an integer >= 1, got {requests_seen!r}")
    if self.window is None:
      if not evicted:
        return None
      self.window = self.multiplier * requests_seen
      self._next = self.window
    if self._next is None or requests_seen < self._next:
      return None
    res = tune_alpha(self._replay, requests_seen, self._grid)
    self.history.append(res)
    self.alpha = res.alpha
    self._next = None if self.retune_every is None else requests_seen + self.retune_every
    return res.alpha


def _lin_quad(f: Callable[[int], Any], window: int | None = None) -> tuple[float, float]:
  """(linear, quadratic) of f(L) = lin*L + quad*L*min(L, W) from f(1) and f(2)."""
  f1, f2 = float(f(1)), float(f(2))
  if window is not None and window < 2:
    return f1, 0.0
  quad = (f2 - 2 * f1) / 2
  return f1 - quad, quad


def cost_fields(
  model: Any, groups: Sequence[Any], block_size: int, per_group_bytes: bool = False
) -> dict[str, tuple[float, ...]]:
  """`CacheConfig` eviction cost fields for a sim cost model (`sim.cost_model.CostModel`).

  Layers are shared evenly among the groups of their kind: full groups get the attention
  layers (`attn_flops`, linear + quadratic) plus the MLP layers; swa groups the sliding-window
  layers (`swa_flops`, context capped at the window), or the MLP when there is no full group;
  mamba groups the recurrent layers (`recurrent_flops`), or the MLP when there is no attention
  group. Bytes per block: by default the pool's page (max over groups of KV of `block_size`
  tokens over the group's layers, or one checkpoint of its recurrent layers), the same for every
  group, as in a pool of equal pages; `per_group_bytes=True` uses each group's own bytes.

  Returns {"eviction_flops_linear", "eviction_flops_quadratic", "eviction_block_bytes"}.
  """
  kinds = [g.kind for g in groups]
  if not kinds:
    raise ValueError("groups must be a non-empty sequence of GroupSpec")
  if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
    raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
  # each kind's rules (`core/groups/`): its layers' costs (`layer_costs`), whether it carries
  # the MLP layers (`carries_mlp`)
  kind_of = [group_rules(g) for g in groups]
  count = collections.Counter(kind_of)
  n_moe = getattr(model, "n_moe", 0)  # a duck-typed model without MoE layers need not say so

  def ffn_flops(L):
    return model.n_mlp * model.mlp_flops(L) + (n_moe * model.moe_flops(L) if n_moe else 0)

  m_lin, _ = _lin_quad(ffn_flops)
  lin, quad, own = [], [], []
  for g, k, mlp in zip(groups, kind_of, carries_mlp(kind_of)):
    share = 1.0 / count[k]
    lo, qu, b = k.layer_costs(model, g, block_size, share, _lin_quad)
    own.append(b)
    if mlp:
      lo += m_lin  # the dense MLP and sparse MoE feed-forward layers
    lin.append(lo * share)
    quad.append(qu * share)
  if any(b <= 0 for b in own):
    raise ValueError(f"every group must cost > 0 bytes per block, got {own} for {kinds}")
  byt = own if per_group_bytes else [max(own)] * len(own)
  return {
    "eviction_flops_linear": tuple(lin),
    "eviction_flops_quadratic": tuple(quad),
    "eviction_block_bytes": tuple(float(b) for b in byt),
  }
