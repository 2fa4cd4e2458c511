"""Quickstart: the GDN preset serves a shared-prefix workload with caching off, vLLM `align`
and `align` + Marconi admission; prints a table and saves `quickstart.png`.

  python -m experiments.run --gin_file=configs/experiments/quickstart.gin --workdir=runs/qs
"""

from __future__ import annotations

import os
from typing import Any

from experiments import plotting
from hybrid_cache import engine_workload


def format_table(arms: dict[str, dict[str, Any]]) -> str:
  """The arms as a fixed-width text table (speedup = wall time of off / of the arm)."""
  head = f"{'arm':15s}{'cached':>8s}{'computed':>10s}{'wall_s':>9s}{'speedup':>9s}{'exact':>7s}"
  lines = [head, "-" * len(head)]
  off = arms["off"]["wall_s"]
  for name, a in arms.items():
    lines.append(
      f"{name:15s}{a['cached_tokens']:8d}{a['prefill_tokens_computed']:10d}"
      f"{a['wall_s']:9.3f}{off / a['wall_s']:9.2f}{str(a['outputs_equal_to_off']):>7s}"
    )
  return "\n".join(lines)


def run(
  workdir: str,
  seed: int = 0,
  model: str = "qwen35_tiny",
  num_prompts: int = 8,
  prefix_len: int = 250,
  suffix_len: int = 20,
  max_new_tokens: int = 4,
  block_size: int = 16,
  num_blocks: int = 256,
  max_num_batched_tokens: int = 512,
  max_model_len: int = 512,
  cache_manager: str = "jax",
  repeats: int = 1,
  token_buckets: tuple[int, ...] | None = (32, 512),
  progress: bool = True,
) -> dict[str, Any]:
  prompts = engine_workload.shared_prefix_prompts(seed, num_prompts, prefix_len, suffix_len)
  common = dict(
    block_size=block_size,
    num_blocks=num_blocks,
    max_num_batched_tokens=max_num_batched_tokens,
    max_model_len=max_model_len,
    max_requests=1,
  )
  arms = engine_workload.compare_arms(
    model,
    engine_workload.STANDARD_ARMS,
    prompts,
    max_new_tokens,
    common=common,
    seed=seed,
    repeats=repeats,
    concurrency=1,
    engine_kwargs=dict(cache_manager=cache_manager, token_buckets=token_buckets, max_num_seqs=1),
    progress=progress,
  )
  for a in arms.values():
    a["speedup_vs_off"] = arms["off"]["wall_s"] / a["wall_s"]
  print(format_table(arms))
  plotting.bar_chart(
    os.path.join(workdir, "quickstart.png"),
    f"{model}: {num_prompts} prompts sharing a {prefix_len}-token prefix",
    arms,
    ["cached_tokens", "prefill_tokens_computed", "wall_s"],
  )
  return {"model": model, "seed": seed, "arms": arms}
