"""Workloads for the engine and side-by-side runs of cache policies ("arms") on one workload.

`serve` feeds requests with at most `concurrency` in flight (1 = each request arrives when
the previous one finished), so arrival order, and hence what can hit, is deterministic.
`compare_arms` runs the same workload under several cache configs: each arm first serves the
workload once to compile every shape, then drops its prefix cache (`reset_prefix_cache`) and
serves it again, timed (best of `repeats` interleaved rounds). Outputs are compared with the
arm named "off" (greedy tokens equal, logits max relative difference).

Example::

  prompts = shared_prefix_prompts(seed=0, num_prompts=20, prefix_len=500, suffix_len=24)
  res = compare_arms("qwen35_tiny", {k: STANDARD_ARMS[k] for k in ("off", "vllm_default")},
                     prompts, max_new_tokens=4)
  res["vllm_default"]["cached_tokens"], res["vllm_default"]["wall_s"]
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from hybrid_cache import profiles
from hybrid_cache.engine.config import cache_config_for
from hybrid_cache.engine.engine import Engine
from hybrid_cache.engine.engine import RequestOutput

# The arms of the shared-prefix experiments (CacheConfig overrides; names of
# `hybrid_cache.profiles`): caching off, vLLM 0.33's serving default, and align mode without
# vLLM's shared-prefix junction (what vLLM did before it: a one-chunk prefill keeps a state only
# at its last block boundary, inside the prompt's own suffix, so siblings never hit).
ARM_NAMES = ("off", "vllm_default", "align_dense_no_junction")
STANDARD_ARMS: dict[str, dict[str, Any]] = {
  "off": dict(enable_prefix_caching=False),
  **{n: profiles.PROFILES[n].cache_overrides() for n in ARM_NAMES[1:]},
}


# the checkpoint unit U of the unit-page profiles (`adaptive`: every block U) and of fine-key
# arms (recurrent blocks of U) unless a workload says otherwise: the kernels' checkpoint chunk
# (`engine.config.KERNEL_CHUNK`), the smallest block mode all allows
CHECKPOINT_UNIT = 64


def arm(name: str, checkpoint_unit: int = CHECKPOINT_UNIT) -> dict[str, Any]:
  """`cache_config_for` overrides of arm `name`: "off" or a profile name or alias
  (`profiles`). A profile on pages of the checkpoint unit (`Profile.unit_pages`: `adaptive`)
  gets `block_size` = `checkpoint_unit` (it overrides the workload's: merge these last); one
  that keys full attention finely (`fine_keys`) gets recurrent blocks of `checkpoint_unit`;
  the others keep the workload's block size for every group."""
  if name == "off":
    return dict(STANDARD_ARMS["off"])
  profile = profiles.get(name)
  kw = profile.cache_overrides()
  if profile.unit_pages:
    kw["block_size"] = checkpoint_unit
  if kw.get("fine_keys"):
    kw["recurrent_block_size"] = checkpoint_unit
  return kw


def shared_prefix_prompts(
  seed: int, num_prompts: int, prefix_len: int, suffix_len: int, vocab: int = 256
) -> list[list[int]]:
  """`num_prompts` prompts: one random shared prefix, then a distinct random suffix each."""
  rng = np.random.RandomState(seed)
  prefix = rng.randint(0, vocab, prefix_len).tolist()
  return [prefix + rng.randint(0, vocab, suffix_len).tolist() for _ in range(num_prompts)]


def off_grid_sessions(
  seed: int,
  num_sessions: int = 6,
  turns: int = 4,
  system_len: int = 90,
  turn_len: tuple[int, int] = (20, 50),
  vocab: int = 256,
) -> list[list[int]]:
  """Multi-turn sessions whose prompts diverge off any block grid, turns interleaved.

  Every session starts with one shared random system prompt of `system_len` tokens; turn k of a
  session is its turn k - 1 plus a fresh user message of `turn_len` = [lo, hi) random tokens
  (an agent appending tool results: each prompt extends the previous one). The prompts are
  ordered turn by turn (turn 1 of every session, then turn 2, ...). The depths where prompts
  leave each other (the system prompt's end, each turn's end) are random, not multiples of a
  block: with attention blocks larger than the prompts (vLLM's inflated hybrid blocks, 500-2,000
  tokens for real models) vLLM 0.33 keeps no state a later prompt can hit, while placement
  `adaptive` keeps the branch point and each prompt's end floored to its unit U.
  """
  lo, hi = turn_len
  if not 1 <= lo < hi:
    raise ValueError(f"turn_len must be (lo, hi) with 1 <= lo < hi, got {turn_len!r}")
  rng = np.random.RandomState(seed)
  system = rng.randint(0, vocab, system_len).tolist()
  sessions = [list(system) for _ in range(num_sessions)]
  prompts = []
  for _ in range(turns):
    for s in sessions:
      s.extend(rng.randint(0, vocab, rng.randint(lo, hi)).tolist())
      prompts.append(list(s))
  return prompts


def serve(
  engine: Engine,
  prompts: Sequence[Sequence[int]],
  max_new_tokens: int,
  *,
  concurrency: int = 1,
  return_logits: bool = False,
  progress: bool = False,
) -> list[RequestOutput]:
  """Serves `prompts` in order with at most `concurrency` requests in flight."""
  if concurrency < 1:
    raise ValueError(f"concurrency must be >= 1, got {concurrency}")
  bar = None
  if progress:
    from tqdm import tqdm

    bar = tqdm(total=len(prompts), desc="requests", unit="req", leave=False)
  ids: list[str] = []
  nxt = 0
  while nxt < len(prompts) or engine.has_unfinished():
    while nxt < len(prompts) and engine.num_unfinished < concurrency:
      ids.append(engine.add_request(prompts[nxt], max_new_tokens, return_logits=return_logits))
      nxt += 1
    done = engine.step()
    if bar is not None:
      bar.update(len(done))
  if bar is not None:
    bar.close()
  outs = engine.outputs
  return [outs[i] for i in ids]


def _summary(engine: Engine, outs: Sequence[RequestOutput]) -> dict[str, Any]:
  st = engine.stats
  ttft = [o.ttft_s for o in outs if o.ttft_s is not None]
  return {
    "cached_tokens": st.cached_tokens,
    "prefill_tokens_computed": st.prefill_tokens_computed,
    "prompt_tokens": st.prompt_tokens,
    "decode_tokens": st.decode_tokens,
    "preemptions": st.preemptions,
    "steps": st.steps,
    "wall_s": st.wall_s,
    "mean_ttft_s": float(np.mean(ttft)) if ttft else None,
    "per_request_cached_tokens": [o.num_cached_tokens for o in outs],
  }


def _engine(model, cache_kwargs, seed, engine_kwargs) -> Engine:
  cc = cache_config_for(model, **cache_kwargs)
  return Engine(model, cc, seed=seed, **dict(engine_kwargs or {}))


def _timed(engine, prompts, max_new_tokens, concurrency, progress):
  if not engine.manager.reset_prefix_cache():
    raise RuntimeError("reset_prefix_cache failed: blocks still held")
  engine.reset_stats()
  outs = serve(
    engine,
    prompts,
    max_new_tokens,
    concurrency=concurrency,
    return_logits=True,
    progress=progress,
  )
  return _summary(engine, outs), outs


def record_round(
  results: dict[str, dict[str, Any]],
  outputs: dict[str, list[RequestOutput]],
  name: str,
  summ: dict[str, Any],
  outs: list[RequestOutput],
) -> None:
  """Adds one timed round of arm `name`: its first round's summary and outputs are kept; later
  rounds only lower `wall_s` / `mean_ttft_s` to the best round's (robust to other load) and
  append to `wall_s_rounds`."""
  if name not in results:
    results[name], outputs[name] = summ, outs
    summ["wall_s_rounds"] = [summ["wall_s"]]
    return
  best = results[name]
  best["wall_s_rounds"].append(summ["wall_s"])
  if summ["wall_s"] < best["wall_s"]:
    best["wall_s"], best["mean_ttft_s"] = summ["wall_s"], summ["mean_ttft_s"]


def compare_outputs(
  outs: Sequence[RequestOutput], ref: Sequence[RequestOutput]
) -> tuple[bool, float]:
  """(greedy tokens all equal, max relative logit difference) of `outs` against `ref`, request
  by request (both served with `return_logits=True`)."""
  eq = all(a.output_tokens == b.output_tokens for a, b in zip(outs, ref, strict=True))
  rel = max(
    float(np.max(np.abs(a.logits - b.logits)) / np.max(np.abs(b.logits)))
    for a, b in zip(outs, ref, strict=True)
  )
  return bool(eq), rel


def compare_arms(
  model: Any,
  arms: Mapping[str, Mapping[str, Any]],
  prompts: Sequence[Sequence[int]],
  max_new_tokens: int,
  *,
  common: Mapping[str, Any] | None = None,
  seed: int = 0,
  concurrency: int = 1,
  repeats: int = 1,
  engine_kwargs: Mapping[str, Any] | None = None,
  progress: bool = False,
) -> dict[str, dict[str, Any]]:
  """Serves the workload under each arm's cache config (common | arm) side by side.

  Every arm's engine first serves the workload once (compiles every shape); then `repeats`
  rounds serve it again from an empty prefix cache, arms interleaved within a round, and
  `wall_s` / `mean_ttft_s` are the best round (robust to other load on the machine;
  `wall_s_rounds` keeps all). Adds `outputs_equal_to_off`, `max_logit_rel_diff_vs_off` and
  `latency_ratio_vs_off` when an arm is named "off".
  """
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}")
  engines = {}
  for name, kw in arms.items():
    engines[name] = _engine(model, {**dict(common or {}), **dict(kw)}, seed, engine_kwargs)
    # Warm up with the same options as the timed rounds (return_logits changes the jitted step).
    serve(engines[name], prompts, max_new_tokens, concurrency=concurrency, return_logits=True)
  results: dict[str, dict[str, Any]] = {}
  outputs: dict[str, list[RequestOutput]] = {}
  for _ in range(repeats):
    for name, eng in engines.items():
      summ, outs = _timed(eng, prompts, max_new_tokens, concurrency, progress)
      record_round(results, outputs, name, summ, outs)
  if "off" in outputs:
    ref = outputs["off"]
    for name, outs in outputs.items():
      eq, rel = compare_outputs(outs, ref)
      results[name]["outputs_equal_to_off"] = eq
      results[name]["max_logit_rel_diff_vs_off"] = rel
      results[name]["latency_ratio_vs_off"] = results[name]["wall_s"] / results["off"]["wall_s"]
  return results
