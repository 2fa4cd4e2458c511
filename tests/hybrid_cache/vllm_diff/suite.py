"""Shared pieces of the differential tests against vLLM (recorded and live)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hybrid_cache.replay import replay as replay_lib
from tests.hybrid_cache.vllm_diff import compare


def disagreements(
  rows: Iterable[dict[str, Any]], backend: str, layout: bool = False, limit: int = 10
) -> tuple[int, list[str]]:
  """Replays each {"scenario", "expected"} row on `backend`; (count checked, first diffs)."""
  n, diffs = 0, []
  for row in rows:
    sc = row["scenario"]
    n += 1
    try:
      out = replay_lib.replay(sc, backend)
    except ValueError as e:
      diffs.append(f"{sc['name']}: replay refused it: {e}")
      continue
    d = compare.first_differences(row["expected"], out, layout=layout)
    if d:
      diffs.append(f"{sc['name']}: {d[0]}")
  return n, diffs[:limit] + ([f"... {len(diffs) - limit} more"] if len(diffs) > limit else [])
