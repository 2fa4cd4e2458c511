"""Speculative decoding with prefix caching on a hybrid model (issue 16): five arms, one workload.

Workload (shared-prefix chat): one system prompt of `prefix_len` tokens; `num_questions`
distinct questions; `num_conversations` conversations, conversation i asking question
i % num_questions (so conversations past the first `num_questions` replay earlier ones, as
popular questions do). Turn 1 = system + question; turn 2 = turn 1 + its answer + a follow-up
fixed per question. All turn-1 requests are served (at most `concurrency` in flight), then all
turn-2 requests, on the same engine (the prefix cache and the drafter's history carry over).

Arms (CacheConfig overrides; "spec" = `NgramDrafter`, k = `num_speculative_tokens`):
  nocache_nospec           caching off, no drafter: the reference outputs.
  cache_nospec             profile `vllm_align_dense` (align + junction, dense retention).
  nocache_spec             caching off + drafter.
  cache_spec               `vllm_align_dense` + drafter.
  cache_spec_vllm_default  profile `vllm_default`, vLLM 0.33's serving default (align + junction
                           + retention interval 0: only replay boundaries and junction states
                           are kept)
                           + drafter (non-EAGLE, like vLLM's ngram/suffix: no EAGLE rules).

Each arm's engine first serves a warm-up workload (other seed; compiles every shape), then
`rounds` timed rounds from an empty prefix cache and an empty drafter history, arms
interleaved; `wall_s` is the best round. Outputs are compared with `nocache_nospec` (greedy
tokens equal; logits max relative difference).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from experiments import plotting
from hybrid_cache import profiles
from hybrid_cache.engine import workload as engine_workload
from hybrid_cache.engine.config import cache_config_for
from hybrid_cache.engine.drafter import NgramDrafter
from hybrid_cache.engine.engine import Engine

DENSE_MARCONI = profiles.PROFILES["vllm_align_dense"].cache_overrides()
VLLM_DEFAULT = profiles.PROFILES["vllm_default"].cache_overrides()
ARMS: dict[str, tuple[dict[str, Any], bool]] = {
  "nocache_nospec": (dict(enable_prefix_caching=False), False),
  "cache_nospec": (DENSE_MARCONI, False),
  "nocache_spec": (dict(enable_prefix_caching=False), True),
  "cache_spec": (DENSE_MARCONI, True),
  "cache_spec_vllm_default": (VLLM_DEFAULT, True),
}
REFERENCE = "nocache_nospec"


def workload(
  seed: int,
  *,
  prefix_len: int,
  question_len: int,
  follow_len: int,
  num_questions: int,
  num_conversations: int,
) -> tuple[list[list[int]], list[list[int]]]:
  """(turn-1 prompts, follow-ups): conversation i uses question i % num_questions."""
  rng = np.random.RandomState(seed)
  system = rng.randint(0, 256, prefix_len).tolist()
  questions = [rng.randint(0, 256, question_len).tolist() for _ in range(num_questions)]
  follows = [rng.randint(0, 256, follow_len).tolist() for _ in range(num_questions)]
  turn1 = [system + questions[i % num_questions] for i in range(num_conversations)]
  return turn1, [follows[i % num_questions] for i in range(num_conversations)]


def _serve_chat(eng: Engine, turn1, follows, max_new_tokens, concurrency):
  """Turn 1 for every conversation, then turn 2 (turn 1 + its answer + follow-up)."""
  kw = dict(concurrency=concurrency, return_logits=True)
  outs1 = engine_workload.serve(eng, turn1, max_new_tokens, **kw)
  turn2 = [p + o.output_tokens + f for p, o, f in zip(turn1, outs1, follows, strict=True)]
  outs2 = engine_workload.serve(eng, turn2, max_new_tokens, **kw)
  return outs1, outs2


def _round(eng: Engine, spec: bool, turn1, follows, max_new_tokens, concurrency):
  if not eng.manager.reset_prefix_cache():
    raise RuntimeError("reset_prefix_cache failed: blocks still held")
  if spec:
    eng.drafter = NgramDrafter(eng.model_config.vocab_size)  # empty history
  eng.reset_stats()
  outs1, outs2 = _serve_chat(eng, turn1, follows, max_new_tokens, concurrency)
  st = eng.stats
  outs = outs1 + outs2
  ttft = [o.ttft_s for o in outs if o.ttft_s is not None]
  return outs, {
    "cached_tokens": st.cached_tokens,
    "cached_tokens_turn1": sum(o.num_cached_tokens for o in outs1),
    "cached_tokens_turn2": sum(o.num_cached_tokens for o in outs2),
    "prompt_tokens": st.prompt_tokens,
    "prefill_tokens_computed": st.prefill_tokens_computed,
    "output_tokens": st.output_tokens,
    "draft_tokens": st.draft_tokens,
    "accepted_tokens": st.accepted_tokens,
    "verify_windows": st.verify_windows,
    "steps": st.steps,
    "wall_s": st.wall_s,
    "mean_ttft_s": float(np.mean(ttft)) if ttft else None,
  }


def run(
  workdir: str,
  seed: int = 0,
  model: str = "qwen35_tiny",
  prefix_len: int = 96,
  question_len: int = 16,
  follow_len: int = 8,
  num_questions: int = 6,
  num_conversations: int = 12,
  max_new_tokens: int = 48,
  num_speculative_tokens: int = 4,
  concurrency: int = 4,
  block_size: int = 16,
  num_blocks: int = 512,
  max_num_batched_tokens: int = 128,
  max_model_len: int = 256,
  cache_manager: str = "jax",
  rounds: int = 3,
  progress: bool = True,
) -> dict[str, Any]:
  """Runs the five arms; returns `arms` (per arm the metrics below) and the workload sizes.

  Per arm: outputs_equal_to_reference, max_logit_rel_diff_vs_reference, cached_tokens
  (+ per turn), draft_tokens, accepted_tokens, acceptance (accepted / drafted),
  verify_windows, steps, wall_s (best round), wall_s_rounds, mean_ttft_s,
  output_tokens_per_s, hit_rate (cached / prompt tokens).
  """
  if rounds < 1:
    raise ValueError(f"rounds must be >= 1, got {rounds}")
  sizes = dict(
    prefix_len=prefix_len,
    question_len=question_len,
    follow_len=follow_len,
    num_questions=num_questions,
    num_conversations=num_conversations,
  )
  turn1, follows = workload(seed, **sizes)
  warm1, warm_follows = workload(seed + 999, **{**sizes, "num_conversations": 2 * num_questions})
  seq_bucket = 1 << concurrency.bit_length()  # >= concurrency + 1 (one padding sequence)
  engines: dict[str, Engine] = {}
  for name, (kw, spec) in ARMS.items():
    cc = cache_config_for(
      model,
      block_size=block_size,
      num_blocks=num_blocks,
      max_num_batched_tokens=max_num_batched_tokens,
      max_model_len=max_model_len,
      max_requests=concurrency,
      num_speculative_tokens=num_speculative_tokens if spec else 0,
      **kw,
    )
    eng = Engine(
      model,
      cc,
      seed=seed,
      cache_manager=cache_manager,
      token_buckets=(max_num_batched_tokens,),
      seq_buckets=(seq_bucket,),
      drafter=NgramDrafter(256) if spec else None,
    )
    _serve_chat(eng, warm1, warm_follows, max_new_tokens, concurrency)  # compile every shape
    engines[name] = eng
  results: dict[str, dict[str, Any]] = {}
  outputs: dict[str, list] = {}
  for rnd in range(rounds):
    for name, eng in engines.items():
      outs, summ = _round(eng, ARMS[name][1], turn1, follows, max_new_tokens, concurrency)
      if progress:
        print(f"round {rnd} {name:24s} wall={summ['wall_s']:.2f}s cached={summ['cached_tokens']}")
      engine_workload.record_round(results, outputs, name, summ, outs)
  ref = outputs[REFERENCE]
  for name, res in results.items():
    eq, rel = engine_workload.compare_outputs(outputs[name], ref)
    res["outputs_equal_to_reference"] = eq
    res["max_logit_rel_diff_vs_reference"] = rel
    drafted = res["draft_tokens"]
    res["acceptance"] = res["accepted_tokens"] / drafted if drafted else None
    res["hit_rate"] = res["cached_tokens"] / res["prompt_tokens"]
    res["output_tokens_per_s"] = res["output_tokens"] / res["wall_s"]
  plotting.bar_chart(
    os.path.join(workdir, "spec_decode.png"),
    f"{model}: {num_conversations} chats x 2 turns, k={num_speculative_tokens}",
    {n: {**r, "acceptance": r["acceptance"] or 0.0} for n, r in results.items()},
    ["wall_s", "cached_tokens", "acceptance"],
  )
  return {
    "model": model,
    "seed": seed,
    "num_speculative_tokens": num_speculative_tokens,
    "workload": {**sizes, "max_new_tokens": max_new_tokens, "concurrency": concurrency},
    "arms": results,
  }
