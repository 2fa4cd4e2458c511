"""SWA pinning sweep (SPEC B1): N distinct long prefixes, each requested twice, on the SWA+full
preset; N swept from well below to above the cache's capacity; hit rate and time to first
token of the second requests with pinning off and on.

Order: the N first requests, then the N repeats (each repeat has the prefix plus a new
suffix), one request at a time. Hit rate = cached tokens of the repeats / their prompt tokens.

Where pinning matters: the order is cyclic (first requests 1..N, then repeats 1..N), LRU's
worst case, so a prefix survives until its repeat only while all N fit, and the hit rate drops
from ~1 to 0 at a knee. Without pinning a finished request keeps every block it used in the
LRU tail (full prefix, the whole SWA row, the suffix block). With pinning it keeps only what
makes its prefix hittable (full-attention prefix, the SWA window before it) in the pinned tier;
the out-of-window SWA blocks and unhashed tails are reused first, so more prefixes fit and the
knee moves right. The default N grid is dense around both knees (with the default pool of 95
blocks of 16 and 128 + 8 token prompts: ~18 blocks per finished request without pinning, ~11
pinned with it).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments import plotting
from hybrid_cache.engine import workload as engine_workload
from hybrid_cache.engine.engine import Engine
from hybrid_cache.engine.config import cache_config_for


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
  num_prefixes: Sequence[int] = (1, 2, 4, 5, 6, 7, 8, 9, 10, 12, 16),
  prefix_len: int = 128,
  suffix_len: int = 8,
  max_new_tokens: int = 2,
  block_size: int = 16,
  num_blocks: int = 96,
  max_num_batched_tokens: int = 256,
  max_model_len: int = 256,
  cache_manager: str = "jax",
  progress: bool = True,
  warm_each_point: bool = True,
  rounds: int = 3,
) -> dict[str, Any]:
  """Runs the sweep; returns the points (hit rate and TTFT of the repeats per N and arm).

  Each point is served from an empty cache `rounds` times per arm (after one untimed warm
  round with `warm_each_point`), arms interleaved; a repeat's TTFT is its best over the
  rounds, reported as mean and median over the N repeats. Hits are the same every round.
  """
  if rounds < 1:
    raise ValueError(f"rounds must be >= 1, got {rounds}")
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
  warm = 1 if warm_each_point else 0
  for n in num_prefixes:
    prompts = _workload(seed + n, n, prefix_len, suffix_len)
    ttfts: dict[str, list[list[float]]] = {a: [] for a in arms}
    last: dict[str, Any] = {}
    # rounds interleave the arms (machine load hits both alike); the warm round compiles any
    # chunk shape this point needs (a partial hit leaves an odd-sized chunk) and is not timed
    for rnd in range(warm + rounds):
      for arm in arms:
        eng = engines[arm]
        if not eng.manager.reset_prefix_cache():
          raise RuntimeError("reset_prefix_cache failed between sweep points")
        eng.reset_stats()
        outs = engine_workload.serve(eng, prompts, max_new_tokens, progress=progress)
        if rnd >= warm:
          ttfts[arm].append([o.ttft_s for o in outs[n:]])
        last[arm] = (outs, dataclasses.replace(eng.stats), eng.manager.pool_stats())
    tokens_off = [o.output_tokens for o in last["pin_off"][0]]
    for arm in arms:
      outs, stats, pool = last[arm]
      rep = outs[n:]
      hit = sum(o.num_cached_tokens for o in rep) / sum(len(o.prompt_tokens) for o in rep)
      best = np.min(np.asarray(ttfts[arm]), axis=0)  # per repeat, best over the timed rounds
      ttft = float(np.mean(best))
      series[arm]["hit_rate"].append(hit)
      series[arm]["mean_ttft_s"].append(ttft)
      points.append(
        dict(
          num_prefixes=n,
          arm=arm,
          hit_rate=hit,
          mean_ttft_s_repeats=ttft,
          median_ttft_s_repeats=float(np.median(best)),
          outputs_equal_to_pin_off=[o.output_tokens for o in outs] == tokens_off,
          cached_tokens=stats.cached_tokens,
          prefill_tokens_computed=stats.prefill_tokens_computed,
          wall_s=stats.wall_s,
          pinned_blocks_after=pool.num_pinned_blocks,
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
