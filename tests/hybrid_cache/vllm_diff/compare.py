"""Field-by-field comparison of a replay's output with vLLM's (the oracle's `compare.py` rules).

Semantic fields (always compared where vLLM's record has them) are those of
`shared/vllm_oracle/compare.py`; `layout=True` adds vLLM's block ids. `first_differences`
returns readable strings, `[]` when the documents agree.
"""

from __future__ import annotations

from typing import Any

SEMANTIC = (
  "hit_tokens",
  "per_group_hit_tokens",
  "hit_blocks_per_group",
  "shared_prefix_boundary",
  "chunks",
  "ok",
  "num_computed_tokens",
  "num_free_blocks",
  "num_used_blocks",
  "num_free_cached_blocks",
  "cached_blocks_per_group",
)
ENTRY_SEMANTIC = (
  "hit_tokens",
  "per_group_hit_tokens",
  "hit_blocks_per_group",
  "shared_prefix_boundary",
  "scheduled_tokens",
  "num_computed_tokens",
)
STATE_SEMANTIC = ("num_computed_tokens", "num_tokens")
LAYOUT = ("block_ids", "new_block_ids", "num_real_blocks")
# what a recorded expectation keeps of vLLM's record (the rest is not compared)
KEPT = ("i", "op", "req", "entries", "active", "failure", *SEMANTIC, *LAYOUT)


def trim(result: dict[str, Any]) -> dict[str, Any]:
  """vLLM's result document reduced to what `first_differences` reads."""
  out = []
  for r in result["results"]:
    t = {k: r[k] for k in KEPT if k in r}
    if "entries" in t:
      t["entries"] = [
        {k: e[k] for k in ("req", *ENTRY_SEMANTIC, "new_block_ids") if k in e} for e in t["entries"]
      ]
    if "active" in t:
      t["active"] = {
        n: {k: v[k] for k in (*STATE_SEMANTIC, "block_ids", "num_real_blocks") if k in v}
        for n, v in t["active"].items()
      }
    out.append(t)
  return {"scenario": result.get("scenario", ""), "results": out}


def _fields(exp, act, keys, where, out) -> None:
  for k in keys:
    if k not in exp:
      continue
    if k not in act:
      out.append(f"{where}{k}: expected {exp[k]!r}, output has no {k!r}")
    elif exp[k] != act[k]:
      out.append(f"{where}{k}: expected {exp[k]!r}, got {act[k]!r}")


def first_differences(
  expected: dict[str, Any], actual: dict[str, Any], layout: bool = False, limit: int = 1
) -> list[str]:
  """Up to `limit` differences between vLLM's result document and a replay's ([] = agree)."""
  diffs: list[str] = []
  er, ar = expected["results"], actual["results"]
  if len(er) != len(ar):
    diffs.append(f"results: {len(er)} actions expected, got {len(ar)}")
  for i, (e, a) in enumerate(zip(er, ar)):
    out: list[str] = []
    if e.get("op") != a.get("op"):
      out.append(f"op: expected {e.get('op')!r}, got {a.get('op')!r}")
    _fields(e, a, SEMANTIC + (LAYOUT if layout else ()), "", out)
    if "entries" in e:
      ae = a.get("entries") or []
      if len(ae) != len(e["entries"]):
        out.append(f"entries: {len(e['entries'])} expected, got {len(ae)}")
      keys = ENTRY_SEMANTIC + (("new_block_ids",) if layout else ())
      for j, (ee, aa) in enumerate(zip(e["entries"], ae)):
        _fields(ee, aa, ("req", *keys), f"entries[{j}].", out)
    if "active" in e:
      aa = a.get("active") or {}
      if sorted(e["active"]) != sorted(aa):
        out.append(f"active: expected {sorted(e['active'])}, got {sorted(aa)}")
      keys = STATE_SEMANTIC + (("block_ids", "num_real_blocks") if layout else ())
      for n in sorted(set(e["active"]) & set(aa)):
        _fields(e["active"][n], aa[n], keys, f"active[{n}].", out)
    label = f"action {i} ({e.get('op')}{' ' + e['req'] if 'req' in e else ''})"
    diffs.extend(f"{label}: {d}" for d in out)
    if len(diffs) >= limit:
      break
  return diffs[:limit]
