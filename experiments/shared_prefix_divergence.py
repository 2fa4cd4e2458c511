"""Marconi-admission experiment: a long shared prefix, then prompts that diverge right after it.

Requests arrive one after another. The prefill fits one chunk, so in plain `align` mode the
only recurrent state cached per prompt is at its last block boundary, which lies in the
divergent suffix: the recurrent group never hits and nothing is reused. With the junction cut
(`align_marconi`) the second prompt stops a chunk at the block-aligned end of the shared
prefix (where full attention's hit ends), its state is cached, and every later prompt hits it.

results.json: `arms` = {off, align, align_marconi}, each with cached_tokens,
prefill_tokens_computed, wall_s, outputs_equal_to_off, latency_ratio_vs_off, ...
"""

from __future__ import annotations

import os
from typing import Any

from experiments import plotting
from hybrid_cache import engine_workload


def run(
  workdir: str,
  seed: int = 0,
  model: str = "qwen35_tiny",
  num_prompts: int = 20,
  prefix_len: int = 500,
  suffix_len: int = 24,
  max_new_tokens: int = 4,
  block_size: int = 16,
  num_blocks: int = 512,
  max_num_batched_tokens: int = 1024,
  max_model_len: int = 1024,
  concurrency: int = 1,
  cache_manager: str = "jax",
  repeats: int = 1,
  token_buckets: tuple[int, ...] | None = (32, 512, 1024),
  progress: bool = True,
) -> dict[str, Any]:
  prompts = engine_workload.shared_prefix_prompts(seed, num_prompts, prefix_len, suffix_len)
  common = dict(
    block_size=block_size,
    num_blocks=num_blocks,
    max_num_batched_tokens=max_num_batched_tokens,
    max_model_len=max_model_len,
    max_requests=max(concurrency, 1),
  )
  arms = engine_workload.compare_arms(
    model,
    engine_workload.STANDARD_ARMS,
    prompts,
    max_new_tokens,
    common=common,
    seed=seed,
    repeats=repeats,
    concurrency=concurrency,
    engine_kwargs=dict(
      cache_manager=cache_manager, token_buckets=token_buckets, max_num_seqs=concurrency
    ),
    progress=progress,
  )
  plotting.bar_chart(
    os.path.join(workdir, "shared_prefix_divergence.png"),
    f"{model}: {num_prompts} prompts, shared prefix {prefix_len}",
    arms,
    ["cached_tokens", "prefill_tokens_computed", "wall_s"],
  )
  for name, a in arms.items():
    print(
      f"{name:14s} cached={a['cached_tokens']:6d} computed={a['prefill_tokens_computed']:6d} "
      f"wall={a['wall_s']:.3f}s ratio={a['latency_ratio_vs_off']:.3f} "
      f"equal={a['outputs_equal_to_off']}"
    )
  return {
    "model": model,
    "seed": seed,
    "workload": dict(
      num_prompts=num_prompts,
      prefix_len=prefix_len,
      suffix_len=suffix_len,
      max_new_tokens=max_new_tokens,
      concurrency=concurrency,
    ),
    "arms": arms,
  }
