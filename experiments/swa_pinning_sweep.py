"""SWA pinning sweep (SPEC B1, issue 16): N distinct long prefixes, each requested twice, on the
SWA+full preset, served `concurrency` at a time; N swept past the cache's capacity; hit rate and
time to first token of the second requests with pinning off and on, under each free order.

Order: the N first requests, then the N repeats (each repeat has the prefix plus a new
suffix), at most `concurrency` in flight. Hit rate = cached tokens of the repeats / their prompt
tokens. Exactness: every arm's greedy outputs equal those of the uncached run (prefix caching
off) at every point.

The seed (vLLM PR #40676, reference §6.1): on Gemma-3 (SWA + full) the hit rate at 30 prefixes
was 0.22% without pinning and 83.7% with it (TTFT -78%). That PR was measured under the free
order vLLM had then, `free_order="all_tail"` (the pre-fix order: every freed block, hashed or
not, appended to the free-queue tail; §1.6), not under vLLM 0.33's `"scratch_first"` (#43447:
blocks without a hash at the head, reused first). `free_orders` names the orders to run side by
side (gin: `swa_pinning_sweep.run.free_orders`). `retention_interval` defaults to 0, vLLM 0.33's
serving default (#52216, §6.2): SWA tails are cached only at reachable boundaries, so most SWA
blocks a request frees have no hash, and the free order decides whether they are reused before
the cached prefixes (scratch first) or queue behind them (all to the tail).

Where pinning matters: the order is cyclic (first requests 1..N, then repeats 1..N), LRU's
worst case, so without pinning a prefix survives until its repeat only while all N (and the
requests in flight) fit, and the hit rate drops from ~1 to ~0 at a knee. Without pinning a
finished request leaves every block it used in the LRU queue (full prefix, the whole SWA row,
the tails). With pinning it keeps only what makes its prefix hittable (full-attention prefix,
the SWA window before it) in the pinned tier, which is demoted only when the normal queue is
empty; the out-of-window SWA blocks and the tails are reused first, so more prefixes fit and the
knee moves right. Measured with the defaults (gemma3_tiny, blocks of 16, 128 + 8 token prompts,
8 in flight, 480 blocks, retention 0): a finished request pins 10 blocks (8 full-attention
prefix blocks, 2 SWA window blocks); see BENCHMARKS.md for the table.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments import plotting
from hybrid_cache.config import FREE_ORDERS
from hybrid_cache.engine import workload as engine_workload
from hybrid_cache.engine.config import cache_config_for
from hybrid_cache.engine.engine import Engine


def _workload(seed: int, n: int, prefix_len: int, suffix_len: int) -> list[list[int]]:
  rng = np.random.RandomState(seed)
  prefixes = [rng.randint(0, 256, prefix_len).tolist() for _ in range(n)]
  firsts = [p + rng.randint(0, 256, suffix_len).tolist() for p in prefixes]
  repeats = [p + rng.randint(0, 256, suffix_len).tolist() for p in prefixes]
  return firsts + repeats


def _check(num_prefixes, free_orders, concurrency, rounds) -> None:
  if not num_prefixes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                             for n in num_prefixes):  # fmt: skip
    raise ValueError(f"num_prefixes must be a non-empty list of integers >= 1, got {num_prefixes}")
  if not free_orders or any(o not in FREE_ORDERS for o in free_orders):
    raise ValueError(f"free_orders must be a non-empty list from {FREE_ORDERS}, got {free_orders}")
  if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
    raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
  if rounds < 1:
    raise ValueError(f"rounds must be >= 1, got {rounds}")


def run(
  workdir: str,
  seed: int = 0,
  model: str = "gemma3_tiny",
  num_prefixes: Sequence[int] = (4, 8, 16, 24, 30, 32, 40),
  free_orders: Sequence[str] = ("all_tail", "scratch_first"),
  concurrency: int = 8,
  prefix_len: int = 128,
  suffix_len: int = 8,
  max_new_tokens: int = 2,
  block_size: int = 16,
  num_blocks: int = 480,
  max_num_batched_tokens: int = 256,
  max_model_len: int = 256,
  retention_interval: int | None = 0,
  cache_manager: str = "jax",
  implementation: str | None = None,
  progress: bool = True,
  warm_each_point: bool = True,
  rounds: int = 3,
) -> dict[str, Any]:
  """Runs the sweep; returns the points (hit rate and TTFT of the repeats per N and arm).

  Arms: `<free_order>/pin_off` and `<free_order>/pin_on` for each of `free_orders`. Each point
  is served from an empty cache `rounds` times per arm (after one untimed warm round with
  `warm_each_point`), arms interleaved; a repeat's TTFT is its best over the rounds, reported
  as mean and median over the N repeats. Hits are the same every round.
  """
  _check(num_prefixes, free_orders, concurrency, rounds)
  arms = {
    f"{order}/pin_{'on' if pin else 'off'}": dict(free_order=order, pinning=pin)
    for order in free_orders
    for pin in (False, True)
  }
  series: dict[str, dict[str, list[float]]] = {a: {"hit_rate": [], "mean_ttft_s": []} for a in arms}
  common = dict(
    block_size=block_size,
    num_blocks=num_blocks,
    max_num_batched_tokens=max_num_batched_tokens,
    max_model_len=max_model_len,
    max_requests=concurrency,
    retention_interval=retention_interval,
  )
  ekw = dict(
    seed=seed,
    cache_manager=cache_manager,
    max_num_seqs=concurrency,
    implementation=implementation,
  )
  engines = {
    a: Engine(model, cache_config_for(model, **common, **kw), **ekw) for a, kw in arms.items()
  }
  # the oracle: prefix caching off, on the plain-Python twin (no hits: no policy acts)
  uncached = Engine(
    model,
    cache_config_for(model, enable_prefix_caching=False, **common),
    **{**ekw, "cache_manager": "reference"},
  )
  warm_prompts = _workload(seed + 999, 2, prefix_len, suffix_len)
  for eng in [*engines.values(), uncached]:
    # Warm-up: compile the common shapes, then start each point from an empty cache.
    engine_workload.serve(eng, warm_prompts, 2, concurrency=concurrency)
  warm = 1 if warm_each_point else 0
  points = []
  for n in num_prefixes:
    prompts = _workload(seed + n, n, prefix_len, suffix_len)
    ref = engine_workload.serve(uncached, prompts, max_new_tokens, concurrency=concurrency)
    ref_tokens = [o.output_tokens for o in ref]
    ttfts: dict[str, list[list[float]]] = {a: [] for a in arms}
    last: dict[str, Any] = {}
    # rounds interleave the arms (machine load hits all alike); the warm round compiles any
    # step shape this point needs (a hit leaves an odd-sized chunk) and is not timed
    for rnd in range(warm + rounds):
      for arm in arms:
        eng = engines[arm]
        if not eng.manager.reset_prefix_cache():
          raise RuntimeError("reset_prefix_cache failed between sweep points")
        eng.reset_stats()
        outs = engine_workload.serve(
          eng, prompts, max_new_tokens, concurrency=concurrency, progress=progress
        )
        if rnd >= warm:
          ttfts[arm].append([o.ttft_s for o in outs[n:]])
        last[arm] = (outs, dataclasses.replace(eng.stats), eng.manager.pool_stats())
    for arm, kw in arms.items():
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
          free_order=kw["free_order"],
          pinning=kw["pinning"],
          hit_rate=hit,
          mean_ttft_s_repeats=ttft,
          median_ttft_s_repeats=float(np.median(best)),
          outputs_equal_to_uncached=[o.output_tokens for o in outs] == ref_tokens,
          cached_tokens=stats.cached_tokens,
          prefill_tokens_computed=stats.prefill_tokens_computed,
          preemptions=stats.preemptions,
          wall_s=stats.wall_s,
          pinned_blocks_after=pool.num_pinned_blocks,
        )
      )
      print(f"N={n:3d} {arm:24s} hit_rate={hit:.3f} ttft={ttft * 1e3:.1f}ms", flush=True)
  plotting.line_chart(
    os.path.join(workdir, "swa_pinning_sweep.png"),
    f"{model}: N prefixes x2, {concurrency} in flight, pool {num_blocks} blocks of {block_size}",
    list(num_prefixes),
    series,
    ["hit_rate", "mean_ttft_s"],
    "distinct prefixes N",
  )
  return {
    "model": model,
    "seed": seed,
    "concurrency": concurrency,
    "free_orders": list(free_orders),
    "pool_tokens": (num_blocks - 1) * block_size,
    "tokens_per_prefix_all_groups": prefix_len * 2,
    "points": points,
  }
