"""Offline upper bound on what any cache policy can save on a trace at a given capacity.

Setting (the simulator's sequential replay): requests r = 0..n-1 arrive one after another; each
request's full sequence (input + output) passes through the model, then the next one arrives.
A policy *hits* h_r tokens of request r (h_r a multiple of the unit u, 0 <= h_r <= the
infinite-cache reusable prefix of r, see `oracle.py`); it saves gain(h_r) = `prefill_flops(h_r)`
(exactly `metrics.flops_saved`'s per-request term) or h_r tokens. The cache holds at most C
bytes at every arrival instant.

What a hit needs. Write P_r(l) for the first l input tokens of r and
last(r, l) = max{q < r : the full sequence of q starts with P_r(l)} (the last earlier request
that *passed* P_r(l); it exists for l <= the oracle prefix). A hit of h tokens needs, at r's
lookup, the recurrent state after P_r(h) (`state_bytes`) and the full-attention KV of each
token l - 1 < h, whose content is fixed by P_r(l) (`kv_bytes_per_token`). Only a request that
passes P_r(l) can produce these items, and none does in (last(r, l), r), so a policy hitting
h_r must hold the state over the arrivals t in (last(r, h_r), r] and the KV of token l - 1 over
(last(r, l), r]. With M_r(t) = max lcp(seq_q, input_r) over q in [t, r) (0 for t = r), the
KV tokens l <= h with last(r, l) < t number max(0, h - M_r(t)), so r needs at arrival t

  b_r(t; h) = [M_r(t) < h] * (state_bytes + kv_bytes_per_token * (h - M_r(t))),  t <= r.

Disjointness (why the sum is exact, not an over-count): fix an item (the state or a token's KV
at the prefix x) and an arrival t. If r1 < r2 both charged x at t, then r1 is in [t, r2) and its
input starts with x (it hit through x), so r1 passed x and last(r2, .) >= r1 >= t: r2 does not
charge x at t. Hence every item is charged to at most one request per arrival, and any policy
with hits h holds at least B_t(h) = sum_r b_r(t; h_r) bytes at arrival t. So

  OPT = max { sum_r gain_r(h_r) : B_t(h) <= C for every arrival t }

is at least what any policy (online or clairvoyant) achieves with hits that are multiples of u:
extra bytes (page padding, sliding-window KV, the running request's working set, states at
other positions) only make a policy's constraint tighter. (Relaxed: only arrival instants are
constrained, and the running request's own KV is not counted.)

The bound (Lagrangian relaxation). For any multipliers lam_t >= 0,

  OPT <= L(lam) = C * sum_t lam_t + sum_r max_h [gain_r(h) - sum_t lam_t b_r(t; h)]

(weak duality: for feasible h every added term lam_t (C - B_t(h)) is >= 0). The inner max
decomposes per request, over h in {0} U {u, 2u, ..} up to r's oracle prefix; a hit whose own
bytes at t = r, state_bytes + kv_bytes(h), exceed C is dropped (infeasible for any policy).
Between consecutive levels of M_r the charged arrivals do not change, so the priced bytes are
affine in h while the gain is convex (prefill FLOPs; split at a sliding window, where
4 L min(L, W) stops being convex): the max over the u-multiples of such a piece is at its
first or last one, and only those are evaluated (exact, at most two per piece).
lam = 0 gives the infinite-cache oracle, so the bound is at most the oracle. Projected
subgradient steps (Polyak step toward the clairvoyant value, halving the step on stalls) lower
L; the lowest L seen is reported (+ a 1e-9 relative margin for float rounding, then floored:
every policy's value is an integer).

Clairvoyant schedule (a lower bound on OPT): a greedy over (request, hit) pairs by gain per
charged byte-arrival (priced by the multipliers), upgrading a request's hit when every arrival
still fits C with exact integer bytes; it is feasible for the relaxed problem above (holds every
charged item exactly over its interval), so bound >= OPT >= clairvoyant. It is an idealised
policy (states at any u-multiple, no working set), not one the simulator's cores can run.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from hybrid_cache.sim.cost_model import CostModel
from hybrid_cache.sim.trace import Trace

OBJECTIVES = ("flops", "tokens", "both")
_SAFETY = 1e-9  # relative margin on a float-computed bound


@dataclasses.dataclass(frozen=True)
class BoundResult:
  """What `offline_bound` returns (objectives not computed are None).

  bound_flops / bound_tokens: upper bounds (integers) on FLOPs saved / tokens reused by any
    policy.
  upper_h_flops / upper_h_tokens: int64[n] the inner maximiser's hits at the best multipliers.
  best_iteration_flops / _tokens: the subgradient iteration of the lowest bound (0 = lam 0).
  clairvoyant_h: int64[n] the feasible clairvoyant schedule's hits (of the flops objective,
    or of tokens when only tokens is asked); clairvoyant_flops / clairvoyant_tokens: its value.
  oracle_flops / oracle_tokens: the capacity-free bound (hits up to the oracle prefix, u-floored).
  wall_s: seconds spent.
  """

  bound_flops: int | None
  bound_tokens: int | None
  upper_h_flops: np.ndarray | None
  upper_h_tokens: np.ndarray | None
  best_iteration_flops: int | None
  best_iteration_tokens: int | None
  clairvoyant_h: np.ndarray
  clairvoyant_flops: int
  clairvoyant_tokens: int
  oracle_flops: int
  oracle_tokens: int
  wall_s: float


@dataclasses.dataclass
class _Problem:
  """The charged structure of a trace (flat numpy arrays, see `_build`).

  Segments: for request r, arrivals t in [lo, hi] with M_r(t) = m (m ascending per request,
  only m < r's largest candidate). Candidates: (r, h) with gain; cidx: first segment of r with
  m >= h (so segments [seg_start[r], cidx) are charged by the hit h).
  """

  n: int
  capacity: int
  state_bytes: int
  kv_per_token: int
  seg_r: np.ndarray
  seg_lo: np.ndarray
  seg_hi: np.ndarray
  seg_m: np.ndarray
  seg_start: np.ndarray  # int64[n + 1] first segment index of each request
  cand_r: np.ndarray
  cand_h: np.ndarray
  cidx: np.ndarray
  oracle_h: np.ndarray  # int64[n] largest candidate per request (0 if none)


def _records(trace: Trace) -> list[list[tuple[int, int]]]:
  """Per request: [(q_j, m_j)] with q_j = last(r, l) for l in (m_{j-1}, m_j], q descending.

  An uncompressed symbol trie whose nodes remember the last request that passed them.
  """
  children: list[dict] = [{}]
  last: list[int] = [-1]
  out = []
  for r, req in enumerate(trace.requests):
    seq, cum = req.seq.tolist(), req.cum.tolist()
    recs: list[tuple[int, int]] = []
    node = 0
    for i in range(req.num_input_symbols):
      child = children[node].get(seq[i])
      if child is None:
        break
      node = child
      q, m = last[node], cum[i + 1]
      if recs and recs[-1][0] == q:
        recs[-1] = (q, m)
      else:
        recs.append((q, m))
    out.append(recs)
    node = 0
    for s in seq:
      child = children[node].get(s)
      if child is None:
        child = len(children)
        children[node][s] = child
        children.append({})
        last.append(r)
      else:
        last[child] = r
      node = child
  return out


def _build(trace: Trace, model: CostModel, capacity: int, unit: int, full_hit: bool):
  n = len(trace.requests)
  sb, kpt = int(model.state_bytes), int(model.kv_bytes_per_token)
  max_h_bytes = (capacity - sb) // kpt if kpt else None
  # where prefill_flops stops being convex in L (4 L min(L, W) of sliding windows)
  kinks = [model.swa_window] if model.n_swa and model.flops_style != "marconi" else []
  seg_r, seg_lo, seg_hi, seg_m = [], [], [], []
  cand_r, cand_h = [], []
  oracle_h = np.zeros(n, np.int64)
  for r, recs in enumerate(_records(trace)):
    if not recs:
      continue
    cap = recs[-1][1]
    if not full_hit:
      cap = min(cap, trace.requests[r].num_input_tokens - 1)
    top = (cap // unit) * unit
    if max_h_bytes is not None:
      top = min(top, (max(max_h_bytes, 0) // unit) * unit)
    if sb > capacity:
      top = 0
    if top <= 0:
      continue
    oracle_h[r] = top
    # segment 0: (q_1, r] with M = 0; segment j: (q_{j+1}, q_j] with M = m_j
    hi, m = r, 0
    for q, mj in recs:
      if m >= top:
        break
      seg_r.append(r)
      seg_lo.append(q + 1)
      seg_hi.append(hi)
      seg_m.append(m)
      # hits in (m, mj] charge the same segments: cost is affine in h there, the gain convex
      # on each piece split at `kinks`, so the inner max sits at a piece's end multiples of u
      ends = [x for x in kinks if m < x < mj] + [mj]
      a_ = m
      for b_ in ends:
        for h in sorted({(a_ // unit + 1) * unit, min((b_ // unit) * unit, top)}):
          if a_ < h <= min(b_, top) and (not cand_h or cand_r[-1] != r or h > cand_h[-1]):
            cand_r.append(r)
            cand_h.append(h)
        a_ = b_
      hi, m = q, mj
  a = lambda x: np.asarray(x, np.int64)  # noqa: E731
  seg_r, seg_lo, seg_hi, seg_m = a(seg_r), a(seg_lo), a(seg_hi), a(seg_m)
  cand_r, cand_h = a(cand_r), a(cand_h)
  seg_start = np.searchsorted(seg_r, np.arange(n + 1))
  key = seg_r * (1 << 40) + seg_m
  cidx = np.searchsorted(key, cand_r * (1 << 40) + cand_h, side="left")
  return _Problem(
    n, capacity, sb, kpt, seg_r, seg_lo, seg_hi, seg_m, a(seg_start), cand_r, cand_h, cidx, oracle_h
  )


def _gains(p: _Problem, model: CostModel, objective: str) -> np.ndarray:
  if objective == "tokens":
    return p.cand_h.astype(np.float64)
  return np.asarray(model.prefill_flops(p.cand_h.astype(np.float64)), np.float64)


def _exact_gain(model: CostModel, h: np.ndarray, objective: str) -> int:
  if objective == "tokens":
    return int(h.sum())
  return int(sum(model.prefill_flops(int(x)) for x in h if x))


class _Dual:
  """Evaluates L(lam), the inner maximiser and the load B_t of its hits (normalised units)."""

  def __init__(self, p: _Problem, gain: np.ndarray):
    self.p = p
    self.scale = float(gain.max()) if len(gain) else 1.0
    self.g = gain / self.scale
    k = len(gain)
    new_r = np.r_[True, p.cand_r[1:] != p.cand_r[:-1]] if k else np.zeros(0, bool)
    self.starts = np.flatnonzero(new_r)  # first candidate of each request with candidates
    self.groups = p.cand_r[self.starts]  # that request
    self.cpos = np.cumsum(new_r) - 1  # candidate -> its group
    c = float(p.capacity)
    self.sb, self.kpt = p.state_bytes / c, p.kv_per_token / c

  def evaluate(self, lam: np.ndarray):
    """(L(lam) normalised, chosen h int64[n], load int64[n] in bytes)."""
    p = self.p
    n = p.n
    h_star = np.zeros(n, np.int64)
    if not len(self.g):
      return float(lam.sum()), h_star, np.zeros(n, np.int64)
    lc = np.r_[0.0, np.cumsum(lam)]
    w = lc[p.seg_hi + 1] - lc[p.seg_lo]
    cw = np.r_[0.0, np.cumsum(w)]
    cmw = np.r_[0.0, np.cumsum(p.seg_m * w)]
    s0 = p.seg_start[p.cand_r]
    a = cw[p.cidx] - cw[s0]
    bm = cmw[p.cidx] - cmw[s0]
    val = self.g - ((self.sb + self.kpt * p.cand_h) * a - self.kpt * bm)
    gmax = np.maximum.reduceat(val, self.starts)
    total = float(lam.sum()) + float(np.maximum(gmax, 0.0).sum())
    best = np.flatnonzero(val == gmax[self.cpos])
    first = np.unique(self.cpos[best], return_index=True)[1]
    best = best[first]
    pos = gmax > 0
    h_star[self.groups[pos]] = p.cand_h[best[pos]]
    return total, h_star, load_of(p, h_star)


def load_of(p: _Problem, h: np.ndarray) -> np.ndarray:
  """int64[n]: B_t(h), the bytes charged at each arrival t by hits h (exact integers)."""
  hr = h[p.seg_r]
  on = p.seg_m < hr
  v = np.where(on, p.state_bytes + p.kv_per_token * (hr - p.seg_m), 0)
  d = np.zeros(p.n + 1, np.int64)
  np.add.at(d, p.seg_lo[on], v[on])
  np.subtract.at(d, p.seg_hi[on] + 1, v[on])
  return np.cumsum(d)[: p.n]


def _subgradient(dual: _Dual, lower: float, iterations: int):
  p = dual.p
  lam = np.zeros(p.n)
  best_val, h_best, load = dual.evaluate(lam)
  best_it, best_lam = 0, lam.copy()
  theta, stall, cur = 1.0, 0, best_val
  for it in range(1, iterations + 1):
    s = 1.0 - load / p.capacity
    s = np.where((lam <= 0) & (s > 0), 0.0, s)  # projected direction
    nrm = float(s @ s)
    if nrm <= 0:
      break
    step = theta * max(cur - lower, 1e-12 * max(best_val, 1e-300)) / nrm
    lam = np.maximum(lam - step * s, 0.0)
    val, h, load = dual.evaluate(lam)
    cur = val
    if val < best_val - 1e-12 * abs(best_val):
      best_val, h_best, best_it, best_lam, stall = val, h, it, lam.copy(), 0
    else:
      stall += 1
      if stall >= 5:
        theta, stall = theta / 2, 0
        if theta < 1e-4:
          break
  return best_val, h_best, best_it, best_lam


def _greedy(p: _Problem, gain: np.ndarray, lam: np.ndarray) -> np.ndarray:
  """A feasible schedule: pairs by gain per priced byte-arrival, upgrades that fit C."""
  n = p.n
  h_cur = np.zeros(n, np.int64)
  if not len(gain):
    return h_cur
  price = lam + 1e-6 * (lam.max() if lam.max() > 0 else 1.0) + 1e-300
  lc = np.r_[0.0, np.cumsum(price)]
  w = lc[p.seg_hi + 1] - lc[p.seg_lo]
  cw = np.r_[0.0, np.cumsum(w)]
  cmw = np.r_[0.0, np.cumsum(p.seg_m * w)]
  s0 = p.seg_start[p.cand_r]
  cost = (p.state_bytes + p.kv_per_token * p.cand_h) * (cw[p.cidx] - cw[s0]) - p.kv_per_token * (
    cmw[p.cidx] - cmw[s0]
  )
  order = np.argsort(-(gain / np.maximum(cost, 1e-300)), kind="stable")
  load = np.zeros(n, np.int64)
  sb, kpt, cap = p.state_bytes, p.kv_per_token, p.capacity
  seg_lo, seg_hi, seg_m = p.seg_lo, p.seg_hi, p.seg_m
  for k in order.tolist():
    r, h = int(p.cand_r[k]), int(p.cand_h[k])
    cur = int(h_cur[r])
    if h <= cur:
      continue
    a, b = int(p.seg_start[r]), int(p.cidx[k])
    lo = int(seg_lo[b - 1])
    m = seg_m[a:b]
    new = sb + kpt * (h - m)
    old = np.where(m < cur, sb + kpt * (cur - m), 0)
    lens = seg_hi[a:b] - seg_lo[a:b] + 1
    delta = np.repeat((new - old)[::-1], lens[::-1])  # arrivals lo..r ascending
    if int((load[lo : r + 1] + delta).max()) <= cap:
      load[lo : r + 1] += delta
      h_cur[r] = h
  return h_cur


def offline_bound(
  trace: Trace,
  model: CostModel,
  capacity_bytes: float,
  unit: int,
  *,
  iterations: int = 500,
  objective: str = "both",
  full_hit: bool = True,
) -> BoundResult:
  """Upper bound on FLOPs saved / tokens reused by any policy (see the module docstring).

  Args:
    trace: requests in replay order.
    model: cost model (state_bytes, kv_bytes_per_token, prefill_flops).
    capacity_bytes: cache capacity C (> 0; floored to whole bytes).
    unit: hits are multiples of `unit` tokens (>= 1); the bound covers every policy whose hits
      are multiples of `unit` (unit 1 covers all).
    iterations: subgradient iterations per objective (>= 0; 0 = the capacity-filtered oracle).
    objective: "flops", "tokens" or "both" (which bounds to compute).
    full_hit: allow a hit of the whole input (as Marconi's tree does); False caps hits at
      input - 1 tokens (engines that recompute the last prompt token).

  Returns:
    A `BoundResult`; bound >= any policy's value, bound <= the oracle, clairvoyant is feasible.

  Raises:
    ValueError: on a bad unit, capacity, iterations or objective.
  """
  if isinstance(unit, bool) or not isinstance(unit, int | np.integer) or unit < 1:
    raise ValueError(f"unit must be an integer >= 1, got {unit!r}")
  if not (isinstance(capacity_bytes, int | float | np.number) and capacity_bytes > 0):
    raise ValueError(f"capacity_bytes must be > 0, got {capacity_bytes!r}")
  if not np.isfinite(capacity_bytes):
    raise ValueError(f"capacity_bytes must be finite, got {capacity_bytes!r}")
  if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 0:
    raise ValueError(f"iterations must be an integer >= 0, got {iterations!r}")
  if objective not in OBJECTIVES:
    raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
  t0 = time.perf_counter()
  p = _build(trace, model, int(capacity_bytes), int(unit), full_hit)
  objs = ("flops", "tokens") if objective == "both" else (objective,)
  res: dict = {"flops": (None, None, None), "tokens": (None, None, None)}
  sched = None
  for obj in objs:
    gain = _gains(p, model, obj)
    dual = _Dual(p, gain)
    lam0 = np.zeros(p.n)
    h_cv = _greedy(p, gain, lam0)
    lower = _exact_gain(model, h_cv, obj) / dual.scale
    val, h_up, it, lam = _subgradient(dual, lower, iterations)
    h_cv2 = _greedy(p, gain, lam)
    if _exact_gain(model, h_cv2, obj) > _exact_gain(model, h_cv, obj):
      h_cv = h_cv2
    oracle = _exact_gain(model, p.oracle_h, obj)
    # any policy's value is an integer, so the floor of a real upper bound is one too
    bound = oracle if it == 0 else min(oracle, math.floor(val * dual.scale * (1 + _SAFETY)))
    res[obj] = (bound, h_up, it)
    if sched is None:
      sched = h_cv
  assert sched is not None
  return BoundResult(
    bound_flops=res["flops"][0],
    bound_tokens=res["tokens"][0],
    upper_h_flops=res["flops"][1],
    upper_h_tokens=res["tokens"][1],
    best_iteration_flops=res["flops"][2],
    best_iteration_tokens=res["tokens"][2],
    clairvoyant_h=sched,
    clairvoyant_flops=_exact_gain(model, sched, "flops"),
    clairvoyant_tokens=int(sched.sum()),
    oracle_flops=_exact_gain(model, p.oracle_h, "flops"),
    oracle_tokens=int(p.oracle_h.sum()),
    wall_s=time.perf_counter() - t0,
  )


def feasible(trace: Trace, model: CostModel, capacity_bytes: float, unit: int, h) -> bool:
  """Whether hits `h` (int[n]) fit the bound's model: B_t(h) <= C at every arrival."""
  p = _build(trace, model, int(capacity_bytes), int(unit), True)
  h = np.asarray(h, np.int64)
  if np.any(h > np.maximum(p.oracle_h, 0)) or np.any(h % unit):
    return False
  return bool(np.all(load_of(p, h) <= p.capacity))


__all__ = ["OBJECTIVES", "BoundResult", "feasible", "offline_bound"]
