"""Marconi-admission experiment: a long shared prefix, then prompts that diverge right after it.

Requests arrive one after another. The prefill fits one chunk, so in align mode without the
junction (`align_dense_no_junction`) the only recurrent state cached per prompt is at its last
block boundary, which lies in the divergent suffix: the recurrent group never hits and nothing is
reused. With vLLM 0.33's junction cut (`vllm_default`) the second prompt stops a chunk at the
block-aligned end of the shared prefix (where full attention's hit ends), its state is cached,
and every later prompt hits it.

results.json: `arms` = {off, vllm_default, align_dense_no_junction}, each with cached_tokens,
prefill_tokens_computed, wall_s, outputs_equal_to_off, latency_ratio_vs_off, ...
"""

from __future__ import annotations

from typing import Any

from experiments import prefix_arms

# Overrides of the `prefix_arms.ArmsSetup` defaults (a longer prefix, more prompts, room for it).
DEFAULTS: dict[str, Any] = dict(
  num_prompts=20,
  prefix_len=500,
  suffix_len=24,
  num_blocks=512,
  max_num_batched_tokens=1024,
  max_model_len=1024,
  token_buckets=(32, 512, 1024),
)


def run(workdir: str, seed: int = 0, **params: Any) -> dict[str, Any]:
  """Runs the three arms; ``params`` are `prefix_arms.ArmsSetup` fields (defaults: DEFAULTS)."""
  s = prefix_arms.make_setup(DEFAULTS, params)
  title = f"{s.model}: {s.num_prompts} prompts, shared prefix {s.prefix_len}"
  arms = prefix_arms.run_arms(workdir, seed, s, "shared_prefix_divergence.png", title)
  for name, a in arms.items():
    print(
      f"{name:24s} cached={a['cached_tokens']:6d} computed={a['prefill_tokens_computed']:6d} "
      f"wall={a['wall_s']:.3f}s ratio={a['latency_ratio_vs_off']:.3f} "
      f"equal={a['outputs_equal_to_off']}"
    )
  workload = ("num_prompts", "prefix_len", "suffix_len", "max_new_tokens", "concurrency")
  return {
    "model": s.model,
    "seed": seed,
    "workload": {k: getattr(s, k) for k in workload},
    "setup": prefix_arms.setup_record(s),
    "arms": arms,
  }
