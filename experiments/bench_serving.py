"""Serving benchmark: does a saved prefill FLOP become saved time?

One model (a named size, `SIZES`: mid-size ones fit this CPU, 0.5-2B ones are for a GPU),
one workload, the cache arms side by side in one process (each arm warmed up once, then
`repeats` rounds interleaved across arms; the best round per arm is reported):

* workloads: "shared_prefix" (every prompt = one shared prefix + its own suffix) and "chat"
  (multi-turn conversations replayed from recorded turns: turn t's prompt = the system prompt,
  the earlier user and assistant turns, and a new user turn), served closed-loop with
  `concurrency` requests in flight (a new request arrives as one finishes);
* arms: caching off, vLLM 0.33's serving default (`vllm_default`), `vllm_align_dense` and
  `flop_aware` (the core's FLOP-aware eviction), by profile name (`hybrid_cache.profiles`;
  `adaptive` runs on pages of `checkpoint_unit` tokens instead of `block_size`);
* per arm: TTFT p50 / p99 and mean, output tokens/s, prefill tokens computed, cached tokens,
  the engine's per-step breakdown (schedule / prepare / forward / commit seconds, and the
  non-model share = 1 - forward / wall), outputs equal to the uncached arm's, and the
  caching efficiency = (mean TTFT off / mean TTFT cached) / (prefill tokens off / prefill
  tokens cached): 1.0 means every saved prefill FLOP became saved time to first token.
  TTFT also holds the time a request waits for the others' work (the first prompt's prefix,
  the decodes of the running ones), which caching does not remove, so even an engine whose
  step costs exactly its tokens stays below 1 on a busy workload. That engine, on the arm's own
  schedule, is the *ideal efficiency* (`ideal_ttft`: a request's TTFT = the tokens computed
  in the steps from its arrival to its first token, `RequestOutput.arrival_step`,
  `EngineStats.step_tokens`); *conversion* = efficiency / ideal efficiency is the share of
  the achievable gain the engine turns into time (1.0 = no fixed cost, no padding).

  python -m experiments.run --gin_file=configs/experiments/bench_serving.gin
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from hybrid_cache.engine import workload as engine_workload
from hybrid_cache.engine.config import cache_config_for
from hybrid_cache.engine.engine import Engine
from models.config import ModelConfig
from models.hybrid_lm import build_model


def _hybrid_like(pattern: str, layers: int, d: int, heads: int, vocab: int) -> dict[str, Any]:
  """The fields both families share: 128-wide attention heads, 4 query heads per KV head,
  MLP 3 x d."""
  return dict(
    layer_pattern=pattern,
    num_layers=layers,
    vocab_size=vocab,
    d_model=d,
    mlp_hidden=3 * d,
    num_heads=heads,
    num_kv_heads=max(1, heads // 4),
    head_dim=128,
  )


def qwen35_like(layers: int, d: int, heads: int, vocab: int) -> dict[str, Any]:
  """Qwen3.5-like `ModelConfig` fields: GGGA, GDN heads = attention heads, all 128 wide."""
  return dict(
    _hybrid_like("GGGA", layers, d, heads, vocab),
    gdn_num_k_heads=heads,
    gdn_num_v_heads=heads,
    gdn_head_k_dim=128,
    gdn_head_v_dim=128,
  )


def _nemotron_h_like(layers: int, d: int, heads: int, vocab: int) -> dict[str, Any]:
  """Nemotron-H-like fields: MMMA, Mamba2 with 2 d / 64 heads of 64, state 128."""
  return dict(
    _hybrid_like("MMMA", layers, d, heads, vocab),
    mamba_num_heads=2 * d // 64,
    mamba_head_dim=64,
    mamba_state_dim=128,
    mamba_n_groups=max(1, heads // 4),
  )


# Named model sizes (random weights): "mid" ones fit a 2-core CPU, the others are realistic
# (parameters counted by `num_params`: qwen35_like_1p5b 1.48e9, nemotron_h_like_1b 1.60e9;
# the mid ones 6.2e7 and 6.4e7).
SIZES = {
  "qwen35_like_mid": qwen35_like(8, 512, 4, 32768),
  "nemotron_h_like_mid": _nemotron_h_like(8, 512, 4, 32768),
  "qwen35_like_1p5b": qwen35_like(24, 2048, 16, 32768),
  "nemotron_h_like_1b": _nemotron_h_like(24, 2048, 16, 32768),
}
ARMS = ("off", "vllm_default", "vllm_align_dense", "flop_aware")
WORKLOADS = ("shared_prefix", "chat")


def model_config(size: str, dtype: str, **overrides: Any) -> ModelConfig:
  if size not in SIZES:
    raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
  return ModelConfig(**{**SIZES[size], "dtype": dtype, **overrides})


def num_params(cfg: ModelConfig) -> int:
  """Parameters of the model (counted from shapes, nothing allocated)."""
  state = nnx.state(nnx.eval_shape(lambda: build_model(cfg)))
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(state)))


def shared_prefix_workload(seed, num_prompts, prefix_len, suffix_len, vocab):
  return engine_workload.shared_prefix_prompts(seed, num_prompts, prefix_len, suffix_len, vocab)


def chat_workload(
  seed: int,
  num_conversations: int,
  turns: int,
  system_len: int,
  user_len: int,
  assistant_len: int,
  vocab: int,
) -> list[list[int]]:
  """Recorded multi-turn conversations, turn-major (all first turns, then all second turns):
  turn t's prompt = system + (user_i + assistant_i for i < t) + user_t, random tokens."""
  rng = np.random.RandomState(seed)
  system = rng.randint(0, vocab, system_len).tolist()
  convs = [
    [(rng.randint(0, vocab, user_len).tolist(), rng.randint(0, vocab, assistant_len).tolist())]
    for _ in range(num_conversations)
  ]
  for c in convs:
    c += [
      (rng.randint(0, vocab, user_len).tolist(), rng.randint(0, vocab, assistant_len).tolist())
      for _ in range(turns - 1)
    ]
  prompts = []
  for t in range(turns):
    for c in convs:
      history = [tok for user, assistant in c[:t] for tok in user + assistant]
      prompts.append(system + history + c[t][0])
  return prompts


def _percentile(values: Sequence[float], q: float) -> float:
  return float(np.percentile(np.asarray(values, np.float64), q))


def ideal_ttft(outs, step_tokens: Sequence[int]) -> float:
  """Mean TTFT, in tokens computed, of an engine whose step costs its tokens (module
  docstring): request r waits through steps arrival_step .. first_token_step."""
  csum = np.concatenate([[0], np.cumsum(step_tokens)])
  waits = [csum[o.first_token_step + 1] - csum[o.arrival_step] for o in outs]
  return float(np.mean(waits))


def _round(engine: Engine, prompts, max_new_tokens, concurrency) -> tuple[dict[str, Any], list]:
  if not engine.manager.reset_prefix_cache():
    raise RuntimeError("reset_prefix_cache failed: blocks still held")
  engine.reset_stats()
  t0 = time.perf_counter()
  outs = engine_workload.serve(
    engine, prompts, max_new_tokens, concurrency=concurrency, return_logits=True
  )
  wall = time.perf_counter() - t0
  st = engine.stats
  ttft = [o.ttft_s for o in outs]
  return {
    "wall_s": wall,
    "ttft_mean_s": float(np.mean(ttft)),
    "ttft_p50_s": _percentile(ttft, 50),
    "ttft_p99_s": _percentile(ttft, 99),
    "output_tokens_per_s": st.output_tokens / wall,
    "prefill_tokens_computed": st.prefill_tokens_computed,
    "cached_tokens": st.cached_tokens,
    "steps": st.steps,
    "step_breakdown_s": {
      "schedule": st.schedule_s,
      "prepare": st.prepare_s,
      "forward": st.forward_s,
      "commit": st.commit_s,
      "other": st.wall_s - st.schedule_s - st.prepare_s - st.forward_s - st.commit_s,
    },
    "non_model_share": 1.0 - st.forward_s / st.wall_s,
    "ideal_ttft_tokens": ideal_ttft(outs, st.step_tokens),
  }, outs


def run(
  workdir: str,
  seed: int = 0,
  size: str = "qwen35_like_mid",
  dtype: str = "float32",
  workload: str = "shared_prefix",
  arms: Sequence[str] = ARMS,
  num_prompts: int = 16,
  prefix_len: int = 1024,
  suffix_len: int = 64,
  num_conversations: int = 16,
  turns: int = 3,
  system_len: int = 512,
  user_len: int = 64,
  assistant_len: int = 64,
  max_new_tokens: int = 8,
  concurrency: int = 8,
  block_size: int = 64,
  checkpoint_unit: int = engine_workload.CHECKPOINT_UNIT,
  max_num_batched_tokens: int = 2048,
  repeats: int = 2,
  implementation: str | None = None,
  model_overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
  """The benchmark (module docstring); returns the per-arm table with efficiencies."""
  if workload not in WORKLOADS:
    raise ValueError(f"workload must be one of {WORKLOADS}, got {workload!r}")
  if "off" not in arms:
    raise ValueError(f"arms must include 'off' (the baseline), got {list(arms)}")
  cfg = model_config(size, dtype, **dict(model_overrides or {}))
  if workload == "shared_prefix":
    prompts = shared_prefix_workload(seed, num_prompts, prefix_len, suffix_len, cfg.vocab_size)
  else:
    prompts = chat_workload(
      seed, num_conversations, turns, system_len, user_len, assistant_len, cfg.vocab_size
    )
  overrides = {name: engine_workload.arm(name, checkpoint_unit) for name in arms}
  # the pool's ids count blocks of the smallest block size in use
  sizes = [
    kw.get("recurrent_block_size", kw.get("block_size", block_size)) for kw in overrides.values()
  ]
  unit = min(block_size, *sizes)
  longest = max(len(p) for p in prompts) + max_new_tokens
  blocks_per_req = -(-longest // unit) + 1
  common = dict(
    block_size=block_size,
    num_blocks=blocks_per_req * (2 * concurrency + len(prompts)) + 1,
    max_model_len=-(-longest // block_size) * block_size + block_size,
    max_num_batched_tokens=max_num_batched_tokens,
    max_requests=concurrency,
  )
  engines = {}
  for name in arms:
    engines[name] = Engine(
      cfg,
      cache_config_for(cfg, **{**common, **overrides[name]}),
      seed=seed,
      implementation=implementation,
    )
    engine_workload.serve(engines[name], prompts, max_new_tokens, concurrency=concurrency)
  best: dict[str, dict[str, Any]] = {}
  outputs: dict[str, list] = {}
  for _ in range(repeats):
    for name, eng in engines.items():
      summ, outs = _round(eng, prompts, max_new_tokens, concurrency)
      if name not in best or summ["ttft_mean_s"] < best[name]["ttft_mean_s"]:
        best[name], outputs[name] = summ, outs
  off = best["off"]
  for name, arm in best.items():
    eq, rel = engine_workload.compare_outputs(outputs[name], outputs["off"])
    arm["outputs_equal_to_off"], arm["max_logit_rel_diff_vs_off"] = eq, rel
    speedup = off["ttft_mean_s"] / arm["ttft_mean_s"]
    saved = off["prefill_tokens_computed"] / max(arm["prefill_tokens_computed"], 1)
    arm["ttft_speedup"], arm["prefill_token_ratio"] = speedup, saved
    arm["caching_efficiency"] = speedup / saved if name != "off" else None
    ideal = off["ideal_ttft_tokens"] / arm["ideal_ttft_tokens"] / saved
    arm["ideal_efficiency"] = ideal if name != "off" else None
    arm["conversion"] = speedup / saved / ideal if name != "off" else None
  print(_table(best))
  _plot(best, os.path.join(workdir, "bench_serving.png"), f"{size} {dtype} {workload}")
  return {
    "size": size,
    "dtype": dtype,
    "num_params": num_params(cfg),
    "workload": workload,
    "num_requests": len(prompts),
    "mean_prompt_tokens": float(np.mean([len(p) for p in prompts])),
    "concurrency": concurrency,
    "arms": best,
  }


def _table(arms: dict[str, dict[str, Any]]) -> str:
  head = (
    f"{'arm':18s}{'ttft_p50':>10s}{'ttft_p99':>10s}{'prefill':>9s}{'cached':>8s}"
    f"{'speedup':>9s}{'efficiency':>11s}{'ideal':>7s}{'conversion':>11s}{'non_model':>10s}"
    f"{'exact':>7s}"
  )
  lines = [head, "-" * len(head)]
  for name, a in arms.items():
    eff = "-" if a["caching_efficiency"] is None else f"{a['caching_efficiency']:.2f}"
    ideal = "-" if a["ideal_efficiency"] is None else f"{a['ideal_efficiency']:.2f}"
    conv = "-" if a["conversion"] is None else f"{a['conversion']:.2f}"
    lines.append(
      f"{name:18s}{a['ttft_p50_s']:10.3f}{a['ttft_p99_s']:10.3f}{a['prefill_tokens_computed']:9d}"
      f"{a['cached_tokens']:8d}{a['ttft_speedup']:9.2f}{eff:>11s}{ideal:>7s}{conv:>11s}"
      f"{a['non_model_share']:10.1%}"
      f"{str(a['outputs_equal_to_off']):>7s}"
    )
  return "\n".join(lines)


def _plot(arms: dict[str, dict[str, Any]], path: str, title: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  names = list(arms)
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
  ax1.bar(names, [arms[n]["ttft_mean_s"] for n in names], color="tab:blue")
  ax1.set_ylabel("mean TTFT (s)")
  ax1.tick_params(axis="x", rotation=30)
  parts = ("schedule", "prepare", "forward", "commit", "other")
  bottom = np.zeros(len(names))
  for part in parts:
    vals = np.array([arms[n]["step_breakdown_s"][part] for n in names])
    ax2.bar(names, vals, bottom=bottom, label=part)
    bottom += vals
  ax2.set_ylabel("engine seconds per round")
  ax2.tick_params(axis="x", rotation=30)
  ax2.legend(fontsize=7)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
