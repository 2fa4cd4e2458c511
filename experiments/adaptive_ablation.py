"""Ablation of `adaptive` (issue 15, item 5): its gain over the best vLLM setting split into byte
accounting, placement, granularity, retirement and eviction, per (seed, capacity).

Arms, each adding one thing to the one before (FLOPs saved; model `model`, KV pages of
`block_size` tokens):

  vllm_best         max(core `vllm_default`, the same with hash block
                    `partial_hash_block`): states where a chunk ends on the block grid, Marconi
                    admission, a state padded to a KV page (vLLM 0.33's layout)
  exact_bytes       core `vllm_default` with KV pages and state slots on one byte budget
                    (`--page-layout pools`): vLLM's rules, a state costing its own bytes
  placement         `adaptive`'s placement (branch point + learned continuation point), plain
                    LRU eviction, checkpoint unit = `block_size` (hits on the block grid), no
                    retirement
  granularity       the same at checkpoint unit `checkpoint_unit` (hits at its multiples)
  retirement        + superseded checkpoints dropped while they are rarely used again
                    (`adaptive_stats.SupersessionStats`; chat-like traces only)
  eviction          + chain-aware GreedyDual (hits prior, frequency, alpha 1 fixed)
  adaptive          + the weighting re-tuned online (`adaptive` as `python -m hybrid_cache.sim`
                    runs it)

The last three share one replay (`checkpoint_policies.sweep_settings`: one walk, one compiled
bank of caches over settings x capacities); placement and granularity are one replay each,
with `retirement=False`. Each record has every arm's FLOPs saved, its step
ratio (arm / previous arm; they multiply to adaptive / vllm_best) and the total. Plot: FLOPs
saved per arm against capacity (first seed).

  python -m experiments.run --gin_file=configs/experiments/adaptive_ablation.gin
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments import plotting
from experiments.beyond_vllm import load
from hybrid_cache.sim import checkpoint_policies
from hybrid_cache.sim.cost_model import get_model
from hybrid_cache.sim.eviction_weightings import PLAIN_LRU
from hybrid_cache.sim.eviction_weightings import Weighting
from hybrid_cache.sim.metrics import flops_saved
from hybrid_cache.sim.simulate import check_capacity
from hybrid_cache.sim.simulate import simulate

ARMS = (
  "vllm_best", "exact_bytes", "placement", "granularity", "retirement", "eviction", "adaptive"
)  # fmt: skip
# `sweep_settings` settings of the arms replayed at the checkpoint unit with retirement
_UNIT_ARMS = {
  "retirement": PLAIN_LRU,
  "eviction": Weighting("hits/1", 1.0, "hits", True),
  "adaptive": None,  # the online re-tuning
}


def _flops(model, triples) -> float:
  return flops_saved(model, np.array([t[2] for t in triples], np.int64))


def _core(trace, model, cap, block, core) -> float:
  triples, _ = simulate(trace, model, cap, "vllm_default", block, core=core)
  return _flops(model, triples)


def ablate(
  trace: str,
  fmt: str,
  capacities: Sequence[float],
  seeds: Sequence[int] = (0,),
  model: str = "marconi_7b",
  block_size: int = 512,
  checkpoint_unit: int = 64,
  partial_hash_block: int = 64,
  limit: int | None = None,
  params: Mapping | None = None,
  backend: str = "jax",
  progress=None,
) -> list[dict[str, Any]]:
  """One record per (seed, capacity): `flops` per arm, `step` (arm / previous arm), `total`
  (adaptive / vllm_best), `wall_s` per arm (the shared replay's time on each of its arms)."""
  if not capacities:
    raise ValueError("capacities must hold at least one capacity, got none")
  m = get_model(model)
  caps = [float(c) for c in capacities]
  out = []
  for seed in seeds:
    tr = load(trace, fmt, seed, limit, params)
    check_capacity(tr, m, min(caps))
    flops: list[dict[str, float]] = [{} for _ in caps]
    wall: list[dict[str, float]] = [{} for _ in caps]
    for i, cap in enumerate(caps):
      t0 = time.perf_counter()
      plain = _core(tr, m, cap, block_size, {"backend": backend})
      partial = _core(
        tr, m, cap, block_size, {"backend": backend, "hash_block_size": partial_hash_block}
      )
      flops[i]["vllm_best"] = max(plain, partial)
      wall[i]["vllm_best"] = time.perf_counter() - t0
      t0 = time.perf_counter()
      pools = {"backend": backend, "page_layout": "pools"}
      flops[i]["exact_bytes"] = _core(tr, m, cap, block_size, pools)
      wall[i]["exact_bytes"] = time.perf_counter() - t0
    for arm, unit in (("placement", block_size), ("granularity", checkpoint_unit)):
      t0 = time.perf_counter()
      (placed,) = checkpoint_policies.sweep_settings(
        tr, m, caps, "adaptive", [PLAIN_LRU], unit, block_size, retirement=False
      )
      for i, (triples, _) in enumerate(placed):
        flops[i][arm] = _flops(m, triples)
        wall[i][arm] = time.perf_counter() - t0
    t0 = time.perf_counter()
    grid = checkpoint_policies.sweep_settings(
      tr, m, caps, "adaptive", list(_UNIT_ARMS.values()), checkpoint_unit, block_size
    )
    for arm, row in zip(_UNIT_ARMS, grid):
      for i, (triples, _) in enumerate(row):
        flops[i][arm] = _flops(m, triples)
        wall[i][arm] = time.perf_counter() - t0
    for i, cap in enumerate(caps):
      f = flops[i]
      step = {ARMS[0]: 1.0}
      for prev, arm in zip(ARMS, ARMS[1:]):
        step[arm] = f[arm] / f[prev] if f[prev] else None
      rec = {
        "seed": seed,
        "capacity_bytes": cap,
        "requests": len(tr),
        "flops": {a: f[a] for a in ARMS},
        "step": step,
        "total": f["adaptive"] / f["vllm_best"] if f["vllm_best"] else None,
        "wall_s": wall[i],
      }
      out.append(rec)
      if progress is not None:
        progress(f"seed {seed} capacity {cap:g}: total {rec['total']}")
  return out


def run(
  workdir: str,
  seed: int = 0,
  trace: str = "experiments/traces/mooncake_conversation_trace.jsonl",
  fmt: str = "mooncake",
  capacities: Sequence[float] = (2e11, 4e11),
  seeds: Sequence[int] | None = None,
  model: str = "marconi_7b",
  block_size: int = 512,
  checkpoint_unit: int = 64,
  partial_hash_block: int = 64,
  limit: int | None = None,
  params: Mapping | None = None,
  backend: str = "jax",
) -> dict[str, Any]:
  """`experiments.run` entry: `ablate`, then FLOPs saved per arm vs capacity (first seed)."""
  seeds = (seed,) if seeds is None else tuple(seeds)
  if fmt not in ("synthetic", "sharegpt") and not os.path.isfile(trace):
    raise ValueError(f"trace file {trace!r} does not exist")
  recs = ablate(
    trace,
    fmt,
    capacities,
    seeds,
    model,
    block_size,
    checkpoint_unit,
    partial_hash_block,
    limit,
    params,
    backend,
    progress=lambda s: print(s, file=sys.stderr, flush=True),
  )
  first = [r for r in recs if r["seed"] == seeds[0]]
  plot = None
  if workdir and first:
    name = os.path.basename(trace) if fmt != "synthetic" else f"{trace} (seed {seeds[0]})"
    plot = plotting.line_chart(
      os.path.join(workdir, "ablation.png"),
      f"{name}, {model}, B={block_size}, U={checkpoint_unit}",
      [r["capacity_bytes"] for r in first],
      {a: {"flops_saved": [r["flops"][a] for r in first]} for a in ARMS},
      ["flops_saved"],
      "capacity (bytes)",
      xscale="log",
    )
  return {"arms": list(ARMS), "records": recs, "plot": plot}
