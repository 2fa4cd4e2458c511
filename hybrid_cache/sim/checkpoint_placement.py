"""Where the checkpoint policies place recurrent checkpoints: one rule per policy name.

Issue 15, item 3 (`checkpoint_policies.py`). Every rule picks, at prefill time of request r, the
depths d (in units of U tokens, hit < d <= r's computed units) that get a checkpoint in a
`checkpoint_cache.UnitCache`; the kernels emit a state at any chunk boundary at no extra compute,
so a rule costs only the bytes it keeps.

  ckpt_dense       every unit (a state every U tokens).
  ckpt_sparse:K    every K units (every K U tokens).
  ckpt_branch      Marconi's placement at U granularity: the branch point (the deepest unit r
                   shares with any earlier request, if deeper than r's hit) and the last
                   computed unit of r (its leaf).
  adaptive         the branch point (as above: a prefix some earlier request computed too is
                   shared by >= 2 sequences) and one *continuation* point where r's successor is
                   expected to diverge: the last multiple of the learned alignment A within r's
                   input, or within its computed tokens when divergences lie in earlier outputs
                   (`adaptive_stats.DivergenceStats`).

`candidates` gives the branch-point and leaf/continuation depths with their placement kinds
(the eviction prior is learned per kind); `_placer` turns a request's rule into
place(hit depth) -> the depths deeper than the hit.
"""

from __future__ import annotations

from hybrid_cache.sim.adaptive_stats import DivergenceStats

PLACEMENTS = ("ckpt_dense", "ckpt_sparse:<K>", "ckpt_branch", "adaptive")
SPARSE_PREFIX = "ckpt_sparse:"
KIND_GRID, KIND_BRANCH, KIND_INPUT_END, KIND_SEQ_END = 0, 1, 2, 3

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


__all__ = ["PLACEMENTS", "candidates", "length_class", "parse_placement"]
