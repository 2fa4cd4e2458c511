"""SWA pinning sweep (SPEC B1): N distinct long prefixes, each requested twice, on the SWA+full
preset; N swept from well below to above the cache's capacity; hit rate and time to first
token of the second requests with pinning off and on.

Order: the N first requests, then the N repeats (each repeat has the prefix plus a new
suffix), one request at a time. Hit rate = cached tokens of the repeats / their prompt tokens.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments import plotting
from hybrid_cache import engine_workload
from hybrid_cache.engine import Engine
from hybrid_cache.engine_config import cache_config_for


def _workload(seed: int, n: int, prefix_len: int, suffix_len: int) -> list[list[int]]:
  rng = np.random.RandomState(seed)
  prefixes = [rng.randint(0, 256, prefix_len).tolist() for _ in range(n)]
  firsts = [p + rng.randint(0, 256, suffix_len).tolist() for p in prefixes]
  repeats = [p + rng.randint(0, 256, suffix_len).tolist() for p in prefixes]
  return firsts + repeats


def run(
  workdir: str,
  seed: int = 0,
  model: str = "gemma3_tiny",
  num_prefixes: Sequence[int] = (1, 2, 4, 8, 16),
  prefix_len: int = 128,
  suffix_len: int = 8,
  max_new_tokens: int = 2,
  block_size: int = 16,
  num_blocks: int = 96,
  max_num_batched_tokens: int = 256,
  max_model_len: int = 256,
  cache_manager: str = "jax",
  progress: bool = True,
) -> dict[str, Any]:
  arms = {"pin_off": dict(pinning=False), "pin_on": dict(pinning=True)}
  series: dict[str, dict[str, list[float]]] = {a: {"hit_rate": [], "mean_ttft_s": []} for a in arms}
  points = []
  engines = {}
  for arm, kw in arms.items():
    cc = cache_config_for(
      model,
      block_size=block_size,
      num_blocks=num_blocks,
      max_num_batched_tokens=max_num_batched_tokens,
      max_model_len=max_model_len,
      max_requests=1,
      **kw,
    )
    engines[arm] = Engine(model, cc, seed=seed, cache_manager=cache_manager, max_num_seqs=1)
    # Warm-up: compile every shape once, then start each point from an empty cache.
    engine_workload.serve(engines[arm], _workload(seed + 999, 2, prefix_len, suffix_len), 2)
  for n in num_prefixes:
    prompts = _workload(seed + n, n, prefix_len, suffix_len)
    for arm in arms:
      eng = engines[arm]
      if not eng.manager.reset_prefix_cache():
        raise RuntimeError("reset_prefix_cache failed between sweep points")
      eng.reset_stats()
      outs = engine_workload.serve(eng, prompts, max_new_tokens, progress=progress)
      rep = outs[n:]
      hit = sum(o.num_cached_tokens for o in rep) / sum(len(o.prompt_tokens) for o in rep)
      ttft = float(np.mean([o.ttft_s for o in rep]))
      series[arm]["hit_rate"].append(hit)
      series[arm]["mean_ttft_s"].append(ttft)
      points.append(
        dict(
          num_prefixes=n,
          arm=arm,
          hit_rate=hit,
          mean_ttft_s_repeats=ttft,
          cached_tokens=eng.stats.cached_tokens,
          prefill_tokens_computed=eng.stats.prefill_tokens_computed,
          wall_s=eng.stats.wall_s,
        )
      )
      print(f"N={n:3d} {arm:8s} hit_rate={hit:.3f} ttft={ttft * 1e3:.1f}ms")
  plotting.line_chart(
    os.path.join(workdir, "swa_pinning_sweep.png"),
    f"{model}: N prefixes x2, pool {num_blocks} blocks of {block_size}",
    list(num_prefixes),
    series,
    ["hit_rate", "mean_ttft_s"],
    "distinct prefixes N",
  )
  capacity = (num_blocks - 1) * block_size
  return {
    "model": model,
    "seed": seed,
    "pool_tokens": capacity,
    "tokens_per_prefix_all_groups": prefix_len * 2,
    "points": points,
  }
