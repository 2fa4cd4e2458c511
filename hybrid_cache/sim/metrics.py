"""Scores per-request triples [hit, num_input_tokens, tokens_reused] (Marconi's record).

token hit rate = sum(reused) / sum(input); request hit rate = share of requests with reused > 0;
FLOPs saved = sum over requests of the model's prefill FLOPs of the reused tokens (for Marconi's
7B this is exactly Marconi's `n_ssm F_ssm(sum reused) + sum_r n_attn F_attn(r) + n_mlp F_mlp(r)`,
since F_ssm is linear); TTFT of a request = `model.ttft_ms(input - reused)`, P50/P95/mean, and
P95 relative to no caching ("vanilla"). Percentiles use NumPy's default (linear) method.
`fraction_of_oracle` divides by the oracle passed as `oracle_reused` (the CLI: at the policy's
block size); `fraction_of_oracle_own` by `oracle_own_reused` (the infinite cache at the policy's
own hit granularity and cap, `oracle.own_oracle_reused`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hybrid_cache.sim.cost_model import CostModel


def as_triples(triples: Sequence[Sequence[int]]) -> np.ndarray:
  """int64[n, 3] (hit, input, reused); ValueError if reused > input or negative."""
  arr = np.asarray(triples, np.int64).reshape(-1, 3)
  if arr.size and (arr.min() < 0 or np.any(arr[:, 2] > arr[:, 1])):
    raise ValueError("triples must satisfy 0 <= tokens_reused <= num_input_tokens")
  return arr


def flops_saved(model: CostModel, reused: np.ndarray) -> int:
  """Exact (Python int) FLOPs saved by the reused tokens of every request."""
  return int(sum(model.prefill_flops(int(r)) for r in reused if r))


def summarize(
  triples: Sequence[Sequence[int]],
  model: CostModel,
  *,
  oracle_reused: Sequence[int] | None = None,
  oracle_own_reused: Sequence[int] | None = None,
) -> dict:
  """The JSON summary of a replay (see module docstring); `oracle_reused` adds the bound,
  `oracle_own_reused` the bound at the policy's own granularity."""
  arr = as_triples(triples)
  n = len(arr)
  inp, reused = arr[:, 1], arr[:, 2]
  total_in, total_reused = int(inp.sum()), int(reused.sum())
  ttft = model.ttft_ms(inp - reused) if n else np.zeros(0)
  vanilla = model.ttft_ms(inp) if n else np.zeros(0)
  out = {
    "requests": n,
    "input_tokens": total_in,
    "tokens_reused": total_reused,
    "token_hit_rate": total_reused / total_in if total_in else 0.0,
    "request_hit_rate": float((reused > 0).mean()) if n else 0.0,
    "flops_saved": flops_saved(model, reused),
    "ttft_p50_ms": float(np.percentile(ttft, 50)) if n else 0.0,
    "ttft_p95_ms": float(np.percentile(ttft, 95)) if n else 0.0,
    "ttft_mean_ms": float(ttft.mean()) if n else 0.0,
    "ttft_p95_vs_vanilla": float(np.percentile(ttft, 95) / np.percentile(vanilla, 95))
    if n
    else 1.0,
  }
  if oracle_reused is not None:
    o = np.asarray(oracle_reused, np.int64)
    if len(o) != n:
      raise ValueError(f"oracle_reused has {len(o)} entries, expected {n}")
    out["oracle_tokens_reused"] = int(o.sum())
    out["oracle_token_hit_rate"] = int(o.sum()) / total_in if total_in else 0.0
    out["fraction_of_oracle"] = total_reused / int(o.sum()) if o.sum() else 1.0
  if oracle_own_reused is not None:
    o = np.asarray(oracle_own_reused, np.int64)
    if len(o) != n:
      raise ValueError(f"oracle_own_reused has {len(o)} entries, expected {n}")
    out["oracle_own_tokens_reused"] = int(o.sum())
    out["oracle_own_token_hit_rate"] = int(o.sum()) / total_in if total_in else 0.0
    out["fraction_of_oracle_own"] = total_reused / int(o.sum()) if o.sum() else 1.0
  return out
