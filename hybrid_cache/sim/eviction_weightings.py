"""The eviction weightings of the checkpoint policies, and `adaptive`'s online re-tuning among them.

Issue 15, item 3 (`checkpoint_policies.py`). A weighting is `UnitCache`'s (alpha, prior,
frequency, penultimate) (`chain_eviction.py`): GreedyDual over chain units weighted by FLOPs
saved per byte to the power alpha, a prior per placement kind (and length class) of the request,
hit counts; alpha None is plain LRU (every weight 1, the rules other than `adaptive`), and
penultimate True LRU-2 on chains. A run's *setting* is one fixed weighting, or None: `adaptive`'s
online re-tuning (`_setting_of`, `_check_setting`).

Re-tuning: the prior is the share of such candidate points that a later request has passed so
far (`SeenTrie.reach_prior`, counted on the trie of everything seen, whether a cache kept the
point or not: a prior counted on the cache's own hits feeds on itself, as an evicted point is
never hit). Shadow caches replay the same requests with fixed weightings (`SHADOW_WEIGHTINGS`:
plain LRU, alpha 0 and 1 with frequency and either prior, alpha 2 alone, and LRU-2 on chains,
eligible only while superseded checkpoints are retired; same placement rule), and every
`RETUNE_EVERY` requests the live cache takes the weighting whose shadow saved the most FLOPs
over the recent requests (decayed, half-life `RETUNE_HALF_LIFE`) and re-weights the checkpoints
it holds under it (`_retune`). All of it reads requests 0..r only, so a cut trace replays as the
prefix of the full one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybrid_cache.sim.checkpoint_cache import PRIORS
from hybrid_cache.sim.checkpoint_placement import parse_placement

if TYPE_CHECKING:
  from hybrid_cache.sim.checkpoint_replay import _Point

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
# requests between re-tunes; the replays read it as `eviction_weightings.RETUNE_EVERY`, so that
# a test can shorten it here for all of them
RETUNE_EVERY = 256
RETUNE_HALF_LIFE = 2048.0


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


__all__ = ["DEFAULT_WEIGHTING", "LRU2", "RETUNE_EVERY", "RETUNE_HALF_LIFE", "SHADOW_WEIGHTINGS"]
