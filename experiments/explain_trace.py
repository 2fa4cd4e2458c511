"""`hybrid_cache.explain` as a gin experiment: one trace, one model config, one target.

Writes `explain.json`, `requests.jsonl` and `explain.png` into the workdir and returns the
summary (without the per-request rows) as results. A relative trace path is taken from the
repository root (`experiments/traces` holds the Mooncake traces).
"""

from __future__ import annotations

import os
from typing import Any

from hybrid_cache import explain as explain_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(
  workdir: str,
  seed: int = 0,
  trace: str = "experiments/traces/mooncake_conversation_trace.jsonl",
  trace_format: str = "mooncake",
  limit: int | None = 400,
  config: str = "qwen3_5_0p8b",
  target: str = "sm90",
  capacity_bytes: float = 2e10,
  vllm_flags: dict | None = None,
) -> dict[str, Any]:
  path = trace if os.path.isabs(trace) else os.path.join(REPO, trace)
  result = explain_lib.explain(
    explain_lib.TraceArgs(path, trace_format, limit=limit, seed=seed),
    os.path.join(REPO, "configs", "hf", config),
    target,
    vllm_flags,
    capacity_bytes,
  )
  explain_lib.write(result, workdir)
  print(explain_lib.table(result))
  return {k: v for k, v in result.items() if k != "per_request"}
