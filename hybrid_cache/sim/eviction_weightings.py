"""The eviction weightings of the checkpoint policies, and `adaptive`'s online re-tuning among them.

Issue 15, item 3 (`checkpoint_policies.py`). A weighting (`Weighting`: name, alpha, prior,
frequency, penultimate, `UnitCache`'s arguments; `chain_eviction.py`) is GreedyDual over chain
units weighted by FLOPs saved per byte to the power alpha, a prior per placement kind (and
length class) of the request, hit counts; alpha None is plain LRU (every weight 1, the rules
other than `adaptive`), and penultimate True LRU-2 on chains. A run's *setting* is one fixed
`Weighting`, or None: `adaptive`'s online re-tuning (`_setting_of`, `_check_setting`).

Re-tuning: the prior is the share of such candidate points that a later request has passed so
far (`SeenTrie.reach_prior`, counted on the trie of everything seen, whether a cache kept the
point or not: a prior counted on the cache's own hits feeds on itself, as an evicted point is
never hit). Shadow caches replay the same requests with fixed weightings (`SHADOW_WEIGHTINGS`:
plain LRU, alpha 0 and 1 with frequency and either prior, alpha 2 alone, and LRU-2 on chains,
eligible only while superseded checkpoints are retired; same placement rule), and every
`RETUNE_EVERY` requests the live cache takes the weighting whose shadow saved the most FLOPs
over the recent requests (decayed, half-life `RETUNE_HALF_LIFE`) and re-weights the checkpoints
it holds under it (`_retune`: the one re-tuning of the Python and compiled backends and of the
concurrent replay). All of it reads requests 0..r only, so a cut trace replays as the prefix of
the full one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence

from hybrid_cache.sim.checkpoint_cache import PRIORS
from hybrid_cache.sim.checkpoint_placement import parse_placement


@dataclasses.dataclass(frozen=True)
class Weighting:
  """One eviction weighting of `UnitCache` (its arguments of the same names; `chain_eviction.py`).

  A held checkpoint's GreedyDual priority is its stamp (the clock when it was inserted or last
  hit) plus a weight w, the product of the terms below; the cache evicts the least priority.

  Attributes:
    name: its label; the summaries' `weighting` and `alpha_requests` of a re-tuned cache name
      the shadow weightings by it (a fixed setting's name is for its reader only).
    alpha: exponent of the FLOPs-saved-per-byte term, (eff / running mean of eff) ** alpha
      (`_flops_term`; GreedyDual-Size's cost / size, Marconi's FLOP-aware alpha; 0: the term
      is 1); None = plain LRU: every weight 1, the other terms unused (the only weighting of
      the rules other than `adaptive`).
    prior: a factor per placement kind (and length class) of the checkpoint, `adaptive`'s own:
      "hits" (the share of this cache's checkpoints of the kind that served a hit), "reach"
      (the share of the kind's candidate points a later request passed, counted on everything
      seen: `SeenTrie.reach_prior`) or "none" (`checkpoint_cache.PRIORS`).
    frequency: multiply w by 1 + the checkpoint's hits (GreedyDual-Size-Frequency).
    penultimate: LRU-2 on chains instead (O'Neil et al., SIGMOD'93: the priority is the
      checkpoint's penultimate access time; alpha None, prior and frequency unused).
  """

  name: str
  alpha: float | None
  prior: str
  frequency: bool
  penultimate: bool = False


# the shadow caches' weightings
SHADOW_WEIGHTINGS = (
  Weighting("lru", 0.0, "none", False),  # every weight 1: LRU by GreedyDual's clock
  Weighting("hits/0", 0.0, "hits", True),
  Weighting("hits/1", 1.0, "hits", True),
  Weighting("reach/0", 0.0, "reach", True),
  Weighting("reach/1", 1.0, "reach", True),
  # FLOPs saved per byte only, strongly (GreedyDual-Size): the best fixed weighting on the
  # synthetic chat trace (+3% to +12% over the tuned live cache at 8e9); as a shadow +0% to +7%
  # there, +0.0% to +0.4% elsewhere (BENCHMARKS.md, "Ablation of `adaptive`")
  Weighting("none/2", 2.0, "none", False),
  # LRU-2 on chains (`UnitCache(penultimate=True)`): eligible only while superseded
  # checkpoints are retired (`SupersessionStats`: chains are then sessions, whose last
  # interval predicts the next). With retirement, against the other shadows alone: real
  # ShareGPT +4% to +59%, synthetic chat -5.5% to +1.3%; eligible everywhere (session 23,
  # without retirement) it cost Mooncake synthetic -2.5% to -7% (the tuner's trajectory;
  # BENCHMARKS.md, "Retiring superseded checkpoints")
  Weighting("lru2", None, "none", False, penultimate=True),
)
LRU2 = SHADOW_WEIGHTINGS[-1]  # also a fixed setting of `run_checkpoint` / `sweep_settings`
# plain LRU (alpha None): the rules other than `adaptive`'s, and a fixed setting of `adaptive`
PLAIN_LRU = Weighting("plain_lru", None, "none", False)
DEFAULT_WEIGHTING = 2  # the live cache's weighting before the first re-tune (hits/1)
# requests between re-tunes; the replays read it as `eviction_weightings.RETUNE_EVERY`, so that
# a test can shorten it here for all of them
RETUNE_EVERY = 256
RETUNE_HALF_LIFE = 2048.0


def _best_shadow(score: list[float], weightings: Sequence[Weighting], retire: bool) -> int:
  """The shadow with the best decayed score (ties: the first) among the eligible ones: an
  LRU-2 weighting only while superseded checkpoints are retired (`SHADOW_WEIGHTINGS`)."""
  ok = [i for i in range(len(score)) if retire or not weightings[i].penultimate]
  return max(ok, key=lambda i: (score[i], -i))


def _retune(
  current: int,
  score: list[float],
  weightings: Sequence[Weighting],
  retire: bool,
  switch: Callable[[Weighting], None],
) -> int:
  """`adaptive`'s online re-tuning of one capacity, for every replay and backend: the live
  cache takes the weighting whose shadow has the best decayed score among the eligible ones
  (`_best_shadow`; `retire`: the current request's retirement decision). Returns the index of
  the live cache's weighting after it (`current`: before it).

  On a change `switch(weighting)` gives it to the live cache and re-weights its held
  checkpoints at their stamps (`UnitCache.retune`, `CompiledBank.retune`), so that its heap
  orders every unit by the one weighting it now has: without it, units pushed under the old
  weighting kept their old priorities, whose scale differs (LRU's weight is 1, hits/1's a
  product of hit counts, a prior and a FLOPs ratio), and the live cache evicted in a mixed
  order for a long while (BENCHMARKS.md, "Re-weighting on a re-tune switch": FLOPs saved +1.0%
  to +5.3% on the five Mooncake points, -1.7% to +1.6% on the synthetic ones, +0.8% mean over
  17).
  """
  best = _best_shadow(score, weightings, retire)
  if best != current:
    switch(weightings[best])
  return best


def _setting_of(
  policy: str, alpha, prior: str, frequency: bool, penultimate: bool = False
) -> Weighting | None:
  """The one setting of `run_checkpoint`'s arguments: `adaptive`'s online re-tuning (None, when
  alpha is None), a fixed weighting "fixed" (alpha given), `LRU2` (penultimate), or plain LRU
  (the other rules: alpha None); `_check_setting` validates it."""
  rule, _ = parse_placement(policy)
  if penultimate:
    if alpha is not None:
      raise ValueError(f"penultimate (LRU-2) takes no alpha, got alpha {alpha!r}")
    return LRU2
  if rule == "adaptive" and alpha is None:
    return None
  try:
    alpha = None if alpha is None else float(alpha)
  except (TypeError, ValueError):
    raise ValueError(f"alpha must be None or a number in [0, 100], got {alpha!r}") from None
  return Weighting("fixed", alpha, prior, frequency)


def _check_setting(rule: str, setting: Weighting | None) -> None:
  """ValueError unless `setting` is None (the online re-tuning, `adaptive` only) or a
  `Weighting` with alpha None (plain LRU) or in [0, 100] (`adaptive` only)."""
  if setting is None:
    if rule != "adaptive":
      raise ValueError(f"the online re-tuning (setting None) is adaptive's, not {rule}'s")
    return
  if not isinstance(setting, Weighting):
    raise ValueError(f"a setting must be None or a Weighting, got {setting!r}")
  if setting.penultimate and rule != "adaptive":
    raise ValueError(f"penultimate (LRU-2) is a weighting of adaptive, not of {rule}")
  alpha = setting.alpha
  if alpha is not None and (rule != "adaptive" or not 0.0 <= float(alpha) <= 100.0):
    raise ValueError(f"alpha must be None or in [0, 100] for adaptive only, got {alpha!r}")
  if setting.prior not in PRIORS:
    raise ValueError(f"prior must be one of {PRIORS}, got {setting.prior!r}")


__all__ = [
  "DEFAULT_WEIGHTING",
  "LRU2",
  "PLAIN_LRU",
  "RETUNE_EVERY",
  "RETUNE_HALF_LIFE",
  "SHADOW_WEIGHTINGS",
  "Weighting",
]
