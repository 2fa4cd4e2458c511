"""Engine vs simulator: one trace slice served by the engine and replayed by the simulator.

The question (issue 28, item 4): does the simulator's replay through the cache core predict
what the serving engine caches? A slice of a multi-turn trace (real ShareGPT, or a synthetic
generator) is scaled to fit a tiny model, served by the engine one request at a time in trace
order (greedy decoding, the jitted core), and the realized requests (each prompt with the
tokens the engine generated) are replayed by the simulator's core replay
(`hybrid_cache.sim.core_sim.replay`, the `lax.scan` fast path) with the same `CacheConfig`.
Per policy (profile names, `hybrid_cache.profiles`): per-request cached tokens of both, and
whether they are identical; the engine's prefill tokens computed and mean TTFT; the
simulator's predicted FLOPs saved (`cost_model`, a real model's shapes).

Scaling (`scale_trace`): request i keeps every `stride`-th token of its input and output
(`seq[::stride]`), ids folded into the model's vocabulary (`id % vocab`). Taking every k-th
token of each sequence keeps prefix relations: two inputs that share L tokens share
ceil(L / k) after scaling (folding may add a few shared tokens, the same for both sides).
Requests whose scaled input + output exceed `max_model_len` are dropped; the first
`num_requests` of the rest are served. The engine's outputs, not the trace's, are what the
simulator replays (turn t + 1's prompt holds the trace's answer of turn t, so each turn
leaves the engine's answer at the end of the previous prompt: the branch point).

  python -m experiments.run --gin_file=configs/experiments/engine_vs_sim.gin
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments import plotting
from hybrid_cache import policies
from hybrid_cache import profiles
from hybrid_cache.config import CacheConfig
from hybrid_cache.engine import workload as engine_workload
from hybrid_cache.engine.config import cache_config_for
from hybrid_cache.engine.config import resolve_model_config
from hybrid_cache.engine.engine import Engine
from hybrid_cache.sim import core_sim
from hybrid_cache.sim.cost_model import get_model
from hybrid_cache.sim.metrics import flops_saved
from hybrid_cache.sim.trace import Trace
from hybrid_cache.sim.trace import token_request
from hybrid_cache.sim.vllm_plus import request_tokens

POLICIES = ("vllm_default", "vllm_align_dense", "adaptive")


@dataclasses.dataclass(frozen=True)
class Setup:
  """The slice, the model and the cache sizes (every field a gin-bindable `run` parameter).

  Attributes:
    trace: "sharegpt" (the packaged real ShareGPT, extra `sharegpt`) or a synthetic generator
      (`hybrid_cache.sim.synthetic.KINDS`, e.g. "chat").
    seed: ShareGPT: the seed-th disjoint set of `sharegpt_sessions` sessions (as
      `experiments.beyond_vllm`); synthetic: the generator's seed.
    num_requests: requests served (the first that fit, in trace order).
    sessions: 0 = every session; S > 0 = only the requests of the first S sessions to arrive
      (whole conversations, so later turns find their earlier ones).
    stride: keep every stride-th token (the length scale 1 / stride).
    max_output: cap on a request's scaled output tokens (decode steps; the next turn's prompt
      holds the trace's answer whatever the engine generated).
    warmup: serve the slice once on a throwaway engine first, so that the measured run's TTFT
      holds no compilation (the measured engine starts cold: the same state as the replay's).
    model: the engine's model preset.
    policies: profile names served and replayed.
    block_size: attention block (KV page) tokens.
    checkpoint_unit: the unit U of `adaptive` (every block U, `engine.workload.arm`).
    num_blocks: blocks in the pool (block 0 is the null block).
    max_model_len: longest scaled request (input + output).
    max_num_batched_tokens: token budget per engine step (and the core's).
    cost_model: the simulator's cost model for FLOPs saved (`sim.cost_model.MODELS`).
    sharegpt_sessions: sessions per ShareGPT seed.
  """

  trace: str = "chat"
  seed: int = 0
  num_requests: int = 200
  sessions: int = 0
  stride: int = 4
  max_output: int = 16
  warmup: bool = True
  model: str = "qwen35_tiny"
  policies: tuple[str, ...] = POLICIES
  block_size: int = 128
  checkpoint_unit: int = engine_workload.CHECKPOINT_UNIT
  num_blocks: int = 64
  max_model_len: int = 512
  max_num_batched_tokens: int = 256
  cost_model: str = "qwen3_5_0_8b"
  sharegpt_sessions: int = 100

  def __post_init__(self):
    for name, lo in (
      ("num_requests", 1),
      ("stride", 1),
      ("max_output", 1),
      ("sessions", 0),
      ("sharegpt_sessions", 1),
      ("seed", 0),
    ):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    if not self.policies:
      raise ValueError("policies must name at least one profile, got ()")
    for p in self.policies:
      profiles.resolve(p)  # ValueError naming the profiles

  def cache_config(self, policy: str) -> CacheConfig:
    """The `CacheConfig` both the engine and the simulator run for `policy`."""
    sizes = dict(
      block_size=self.block_size,
      num_blocks=self.num_blocks,
      max_model_len=self.max_model_len,
      max_num_batched_tokens=self.max_num_batched_tokens,
      max_requests=1,
    )
    return cache_config_for(
      self.model, **{**sizes, **engine_workload.arm(policy, self.checkpoint_unit)}
    )


def load_trace(name: str, seed: int, sharegpt_sessions: int = 100) -> Trace:
  """The multi-turn trace `name` ("sharegpt" or a synthetic kind) of `seed`."""
  if name == "sharegpt":
    from hybrid_cache.sim.sharegpt import load_sharegpt

    return load_sharegpt(num_sessions=sharegpt_sessions, first_session=seed * sharegpt_sessions)
  from hybrid_cache.sim import synthetic

  return synthetic.generate(name, seed=seed)


def scale_trace(
  trace: Trace,
  stride: int,
  vocab: int,
  max_len: int,
  num_requests: int,
  max_output: int,
  sessions: int = 0,
) -> list[tuple[list[int], int]]:
  """(prompt, output length) of the first `num_requests` scaled requests that fit (module
  doc): every `stride`-th token, ids modulo `vocab`, input + output <= `max_len`, output in
  [1, max_output] tokens; with `sessions` > 0 only those of the first `sessions` sessions."""
  out = []
  first: list = []
  for r in trace.requests:
    if sessions:
      if r.session_id not in first:
        if len(first) == sessions:
          continue
        first.append(r.session_id)
    toks = request_tokens(r)
    prompt = (toks[: r.num_input_tokens][::stride] % vocab).tolist()
    n_out = min(max_output, max(1, len(range(0, r.num_output_tokens, stride))))
    if prompt and len(prompt) + n_out <= max_len:
      out.append((prompt, n_out))
      if len(out) == num_requests:
        break
  return out


def serve_engine(engine: Engine, requests: Sequence[tuple[list[int], int]]):
  """Serves `requests` one at a time in order; returns their `RequestOutput`s."""
  outs = []
  for prompt, n_out in requests:
    rid = engine.add_request(prompt, n_out)
    outs.append(engine.run()[rid])
  return outs


def realized_trace(requests, outs) -> Trace:
  """The requests as served: each prompt with the tokens the engine generated."""
  reqs = tuple(
    token_request(prompt, o.output_tokens, turn_id=i)
    for i, ((prompt, _), o) in enumerate(zip(requests, outs, strict=True))
  )
  return Trace(reqs, "tokens", "engine")


def compare_policy(setup: Setup, policy: str, requests) -> dict[str, Any]:
  """One policy: the engine's run, the simulator's replay of it, and their agreement."""
  cfg = setup.cache_config(policy)

  def make_engine():
    return Engine(
      setup.model,
      cfg,
      seed=setup.seed,
      cache_manager="jax",
      max_num_seqs=1,
    )

  if setup.warmup:
    serve_engine(make_engine(), requests)
  engine = make_engine()
  t0 = time.perf_counter()
  outs = serve_engine(engine, requests)
  wall = time.perf_counter() - t0
  trace = realized_trace(requests, outs)
  # eviction `tuned` (`adaptive`): the engine has no shadow tuner and serves its first
  # weighting throughout; the replay fixes the same one
  weighting = policies.TUNED_WEIGHTINGS[0] if cfg.eviction == "tuned" else None
  triples, _ = core_sim.replay(trace, cfg, backend="jax", weighting=weighting)
  engine_cached = [o.num_cached_tokens for o in outs]
  sim_cached = [int(t[2]) for t in triples]
  mismatch = [i for i, (a, b) in enumerate(zip(engine_cached, sim_cached)) if a != b]
  ttft = [o.ttft_s for o in outs if o.ttft_s is not None]
  return {
    "cache_fields": profiles.get(policy).cache_overrides(),
    "identical": not mismatch,
    "mismatched_requests": mismatch[:20],
    "num_mismatched": len(mismatch),
    "engine_cached_tokens": int(sum(engine_cached)),
    "sim_cached_tokens": int(sum(sim_cached)),
    "engine_prefill_tokens_computed": engine.stats.prefill_tokens_computed,
    "engine_prompt_tokens": engine.stats.prompt_tokens,
    "engine_mean_ttft_s": float(np.mean(ttft)) if ttft else None,
    "engine_wall_s": wall,
    "sim_flops_saved": flops_saved(get_model(setup.cost_model), np.asarray(sim_cached)),
    "per_request_engine_cached": engine_cached,
    "per_request_sim_cached": sim_cached,
  }


def run(workdir: str, seed: int = 0, **params: Any) -> dict[str, Any]:
  """Serves and replays the slice under every policy; results.json and engine_vs_sim.png."""
  fields = {f.name for f in dataclasses.fields(Setup)}
  unknown = sorted(set(params) - fields)
  if unknown:
    raise ValueError(f"unknown parameter(s) {unknown}; allowed: {sorted(fields)}")
  s = Setup(seed=seed, **params)
  vocab = resolve_model_config(s.model).vocab_size
  trace = load_trace(s.trace, s.seed, s.sharegpt_sessions)
  requests = scale_trace(
    trace, s.stride, vocab, s.max_model_len, s.num_requests, s.max_output, s.sessions
  )
  arms = {p: compare_policy(s, p, requests) for p in s.policies}
  title = f"{s.trace} seed {s.seed}: {len(requests)} requests, 1/{s.stride} length, {s.model}"
  plotting.bar_chart(
    os.path.join(workdir, "engine_vs_sim.png"),
    title,
    arms,
    ["engine_cached_tokens", "sim_cached_tokens", "engine_prefill_tokens_computed"],
  )
  for name, a in arms.items():
    print(
      f"{name:18s} identical={a['identical']!s:5s} engine cached {a['engine_cached_tokens']:7d}"
      f"  sim cached {a['sim_cached_tokens']:7d}  prefill computed"
      f" {a['engine_prefill_tokens_computed']:7d}  mean TTFT {a['engine_mean_ttft_s'] or 0:.4f} s"
      f"  sim FLOPs saved {a['sim_flops_saved']:.3e}"
    )
  return {
    "setup": {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(s).items()},
    "num_requests": len(requests),
    "prompt_tokens": int(sum(len(p) for p, _ in requests)),
    "arms": arms,
  }
