"""Cached vs uncached at a realistic depth under both numerics contracts.

The first GPU run (a 24-layer Qwen3.5-like model, d_model 2048, bf16, random weights; 8 prompts
of 4,000 shared + 64 own tokens, block 256, chunk 4,096) saw the cached arm's greedy tokens
differ from the uncached arm's. This experiment reproduces the setting on CPU at a width that
fits (24 layers "GGGA", d_model 512 by default) and serves the same prompts with caching off and
with `vllm_align_dense` (align + junction + dense retention: the arm of that run), once in bf16
("serving") and once in fp32 ("exact"), from the same random weights.

Per numerics it reports: prompts with equal greedy tokens, the max relative logit difference
(cached vs uncached) on each prompt's first generated token and over all tokens up to the first
divergence, and the uncached run's top-1 - top-2 logit margin there (random weights give
near-tied logits: a token flips where the numerical difference exceeds the margin).

  python -m experiments.run --gin_file=configs/experiments/numerics_divergence.gin
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from experiments import bench_serving
from hybrid_cache import profiles
from hybrid_cache.engine.config import cache_config_for
from hybrid_cache.engine.engine import Engine
from hybrid_cache.engine.workload import shared_prefix_prompts
from models.config import ModelConfig
from models.hybrid_lm import build_model


def _model_config(num_layers: int, d_model: int, vocab_size: int, dtype: str) -> ModelConfig:
  fields = bench_serving.qwen35_like(num_layers, d_model, d_model // 128, vocab_size)
  return ModelConfig(**fields, dtype=dtype)


def _serve(model, prompts, max_new_tokens, cache: dict[str, Any]):
  cfg = cache_config_for(model, **cache)
  eng = Engine(model, cfg, token_buckets=(256, 4096), seq_buckets=(2,), max_num_seqs=1)
  t0 = time.perf_counter()
  outs = [eng.generate([p], max_new_tokens, return_logits=True)[0] for p in prompts]
  return outs, time.perf_counter() - t0


def _compare(cached, uncached) -> dict[str, Any]:
  rows = []
  for c, u in zip(cached, uncached, strict=True):
    n = len(u.output_tokens)
    first_diff = next((i for i in range(n) if c.output_tokens[i] != u.output_tokens[i]), n)
    upto = min(first_diff + 1, n)  # logits up to and including the first divergent token
    scale = np.max(np.abs(u.logits[:upto]))
    top2 = np.sort(u.logits[first_diff if first_diff < n else 0])[-2:]
    rows.append(
      {
        "cached_tokens": c.num_cached_tokens,
        "tokens_equal": c.output_tokens == u.output_tokens,
        "first_divergent_token": first_diff if first_diff < n else None,
        "first_token_rel_diff": float(np.max(np.abs(c.logits[0] - u.logits[0])) / scale),
        "rel_diff_to_divergence": float(np.max(np.abs(c.logits[:upto] - u.logits[:upto])) / scale),
        "abs_diff_to_divergence": float(np.max(np.abs(c.logits[:upto] - u.logits[:upto]))),
        "uncached_margin_there": float(top2[1] - top2[0]),
      }
    )
  return {
    "prompts_equal": sum(r["tokens_equal"] for r in rows),
    "max_first_token_rel_diff": max(r["first_token_rel_diff"] for r in rows),
    "per_prompt": rows,
  }


def run(
  workdir: str,
  seed: int = 0,
  num_layers: int = 24,
  d_model: int = 512,
  vocab_size: int = 32768,
  num_prompts: int = 4,
  prefix_len: int = 4000,
  suffix_len: int = 64,
  max_new_tokens: int = 8,
  block_size: int = 256,
  chunk: int = 4096,
  arm: str = "vllm_align_dense",
) -> dict[str, Any]:
  """Serves the prompts off and under `arm` in bf16 and fp32 (same weights); see module doc."""
  prompts = shared_prefix_prompts(seed, num_prompts, prefix_len, suffix_len, vocab_size)
  length = prefix_len + suffix_len + max_new_tokens
  cache = dict(
    block_size=block_size,
    num_blocks=2 * (length // block_size + 2) + 2,
    max_model_len=length + block_size,
    max_num_batched_tokens=chunk,
    max_requests=2,
  )
  arm_cache = {**cache, **profiles.get(arm).cache_overrides()}
  fp32 = build_model(_model_config(num_layers, d_model, vocab_size, "float32"), seed=seed)
  out: dict[str, Any] = {"arm": arm, "prompts": num_prompts, "prefix_len": prefix_len}
  for numerics, dtype in (("serving", "bfloat16"), ("exact", "float32")):
    model = fp32 if dtype == "float32" else _cast(fp32, dtype)
    uncached, t_off = _serve(
      model, prompts, max_new_tokens, dict(cache, enable_prefix_caching=False)
    )
    cached, t_on = _serve(model, prompts, max_new_tokens, arm_cache)
    out[numerics] = {"dtype": dtype, "wall_s_off": t_off, "wall_s_cached": t_on}
    out[numerics].update(_compare(cached, uncached))
    print(numerics, {k: v for k, v in out[numerics].items() if k != "per_prompt"}, flush=True)
  _plot(out, os.path.join(workdir, "numerics_divergence.png"))
  return out


def _cast(model, dtype: str):
  """The same weights in `dtype` (the recurrent decays A_log, dt_bias stay fp32)."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  cfg = model.cfg.replace(dtype=dtype)
  graphdef, state = nnx.split(nnx.eval_shape(lambda: build_model(cfg)))
  src = nnx.to_pure_dict(nnx.state(model))
  want = nnx.to_pure_dict(state)
  cast = jax.tree.map(lambda w, s: jnp.asarray(w, s.dtype), src, want)
  nnx.replace_by_pure_dict(state, cast)
  return nnx.merge(graphdef, state)


def _plot(out: dict[str, Any], path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 3.5))
  for numerics, color in (("serving", "tab:red"), ("exact", "tab:blue")):
    rows = out[numerics]["per_prompt"]
    ax.scatter(
      range(len(rows)),
      [max(r["rel_diff_to_divergence"], 1e-9) for r in rows],
      label=f"{numerics} ({out[numerics]['dtype']}): {out[numerics]['prompts_equal']}"
      f"/{len(rows)} equal",
      color=color,
    )
  ax.set_yscale("log")
  ax.axhline(1e-5, color="gray", ls="--", lw=1)
  ax.set_xlabel("prompt")
  ax.set_ylabel("max rel. logit diff, cached vs uncached")
  ax.set_title(f"{out['arm']} vs off, {out['prefix_len']}-token shared prefix")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
