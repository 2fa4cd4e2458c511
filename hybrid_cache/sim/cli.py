"""`python -m hybrid_cache.sim`: replays a trace under one policy and prints a JSON summary.

  python -m hybrid_cache.sim --trace FILE --format {marconi,mooncake,synthetic,sharegpt} \
      (--model NAME | --model-config PATH) --capacity-bytes X --policy NAME \
      [--block-size B|vllm] [--dump FILE]

Models (`cost_model.MODELS`): marconi_7b (Marconi's default), qwen3_5_like (Qwen3.5-4B shapes,
GDN 3:1), nemotron_h_like (Nemotron-H-8B shapes, Mamba2), qwen3_5_0_8b, qwen3_5_9b,
nemotron_h_8b, gemma3_4b. --block-size vllm takes the attention block size vLLM 0.33 would
pick for the model by page equality (`ModelConfig.vllm_block_size`: qwen3_5_like 576,
nemotron_h_like 1,040, marconi_7b 80; 16 for models without recurrent layers).
--model-config PATH instead builds the cost model from a Hugging Face config.json (PATH: the file
or a directory holding one; `hf_cost_model.py`: Qwen3.5 / Qwen3-Next dense, Nemotron-H dense,
Gemma 3); the summary's model is PATH.

With --format synthetic, --trace names a generator (`synthetic.KINDS`) and --seed picks the
seed; with --format sharegpt, --trace is a ShareGPT JSON file or `default` (the packaged copy,
optional extra `sharegpt`, see `sharegpt.py`). The summary has requests, input_tokens,
token_hit_rate, request_hit_rate, flops_saved, TTFT percentiles, the oracle bounds and wall_s
(replay seconds: trace parsing excluded, any compilation included). fraction_of_oracle divides
by the infinite cache at the policy's --block-size; fraction_of_oracle_own by the one at its own
hit granularity (`hit_granularity`: U for checkpoint policies, the hash block or B for core
policies, both capped at input - 1 tokens; B for the others, whole inputs allowed). --dump writes
[hit, num_input_tokens, tokens_reused] per request in trace order (atomically, only after a
successful replay). Bad input exits with status 2 and a message.

--policy offline_bound (`offline_bound.py`) computes the offline upper bound at the capacity with
hits in multiples of --block-size (default 64; 1 covers every policy): the per-request fields
(token_hit_rate, flops_saved, TTFT, --dump) describe its feasible clairvoyant schedule, and
bound_flops_saved / bound_tokens_reused (with bound_token_hit_rate) are the bounds no policy
exceeds; clairvoyant_flops_saved / clairvoyant_tokens_reused repeat the schedule's values.
--bound-iterations sets its subgradient iterations.

Checkpoint policies (`adaptive`, `ckpt_dense`, `ckpt_sparse:K`, `ckpt_branch`,
`checkpoint_policies.py`): recurrent checkpoints at multiples of --checkpoint-unit U (default
64) for any KV page --block-size B (default 64), exact bytes (states never padded to a page);
`adaptive` takes --alpha A to fix its eviction exponent instead of re-tuning it online.
--hash-block-size H (core policies): vLLM's hash block (partial hits when H < B).
--fine-keys (core policies, beyond vLLM): the core itself keeps recurrent states at multiples of
--checkpoint-unit U for the KV block B (state blocks of U tokens in the policy's mode: vLLM's
states plus the prompt end's and the junction's at U) and keys full attention at every U
(`CacheConfig.fine_keys`); with --page-layout pools states are not padded to a KV page.
--page-layout vllm (core policies): vLLM's own KV-cache groups and page (`core_sim.py`: groups
of equal layer counts, one layer's KV page >= one layer's state), instead of one group per kind.
--page-layout pools (core policies): two pools under the one byte budget, KV pages and state
slots (`CacheConfig.state_slots`): both draw on the whole budget (`CacheConfig.byte_budget`),
or with --state-fraction F that share of the bytes is a fixed pool of slots.

--replay concurrent (checkpoint policies only; default sequential): arrivals at the trace's
timestamps, --step-tokens tokens per engine step (default 8192), at most --max-running requests
at once (default 1024), chunked prefill, FCFS; a request's lookup happens at its admission and
its insertion when it finishes (`concurrent.py`); --arrival-scale X multiplies the arrival times.
ttft_mean_ms / ttft_p50_ms / ttft_p95_ms then include queueing and state copies; queue_*_ms,
steps, makespan_s and offered_load (> 1: the queue grows whatever the cache) are added.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from hybrid_cache import cli_util
from hybrid_cache.policies import ADMISSION_POLICIES
from hybrid_cache.policies import PLACEMENT_POLICIES
from hybrid_cache.policies import RETENTION_POLICIES
from hybrid_cache.sim import checkpoint_policies
from hybrid_cache.sim import concurrent
from hybrid_cache.sim import core_scan
from hybrid_cache.sim import core_sim
from hybrid_cache.sim import synthetic
from hybrid_cache.sim import trace as trace_lib
from hybrid_cache.sim.cost_model import MODELS
from hybrid_cache.sim.cost_model import ModelConfig
from hybrid_cache.sim.cost_model import get_model
from hybrid_cache.sim.hf_cost_model import load_cost_model
from hybrid_cache.sim.marconi_compat import run_marconi
from hybrid_cache.sim.metrics import summarize
from hybrid_cache.sim.offline_bound import offline_bound
from hybrid_cache.sim.oracle import oracle_matched
from hybrid_cache.sim.oracle import oracle_reused
from hybrid_cache.sim.oracle import own_oracle_reused
from hybrid_cache.sim.policies import parse_policy
from hybrid_cache.sim.vllm_plus import run_vllm_plus

DEFAULT_CORE_BLOCK = 64
DEFAULT_FLOP_ALPHA = 1.0  # flop_aware's static alpha unless --alpha is given
DEFAULT_BOUND_ITERATIONS = 500  # offline_bound's subgradient iterations per objective
DEFAULT_CHECKPOINT_UNIT = 64  # the GDN/SSD kernels' chunk: a state at any multiple is free


def _retention(text: str):
  if text == "policy":
    return "policy"
  if text == "dense":
    return None
  try:
    v = int(text)
  except ValueError:
    v = -1
  if v < 0:
    raise ValueError(f"retention must be 'policy', 'dense' or an integer >= 0, got {text!r}")
  return v


def _alpha(text):
  """flop_aware's --alpha: None, 'tuned' or a float in [0, 100] (ValueError otherwise)."""
  if text is None or text == "tuned":
    return text
  try:
    v = float(text)
  except (TypeError, ValueError):
    v = float("nan")
  if not 0.0 <= v <= 100.0:
    raise ValueError(f"alpha must be 'tuned' or a number in [0, 100], got {text!r}")
  return v


def _block_size_arg(text: str):
  """--block-size: an integer >= 1 or 'vllm' (the model's `vllm_block_size`)."""
  if text == "vllm":
    return text
  try:
    return cli_util.int_arg(1)(text)
  except argparse.ArgumentTypeError:
    raise argparse.ArgumentTypeError(
      f"block size must be an integer >= 1 or 'vllm', got {text!r}"
    ) from None


def _state_fraction(text: str) -> float:
  """--state-fraction: a number in (0, 1)."""
  try:
    v = float(text)
  except ValueError:
    v = math.nan
  if not 0 < v < 1:
    raise argparse.ArgumentTypeError(f"state fraction must be a number in (0, 1), got {text!r}")
  return v


def _backend(text: str) -> str:
  if text not in core_sim.BACKENDS:
    raise argparse.ArgumentTypeError(f"backend must be one of {core_sim.BACKENDS}, got {text!r}")
  return text


def check_capacity(trace: trace_lib.Trace, model: ModelConfig, capacity: float) -> None:
  """ValueError when one request alone (1 state + KV of input + output) exceeds capacity."""
  if not trace.requests:
    return
  longest = max(r.num_tokens for r in trace.requests)
  need = model.state_bytes + model.kv_bytes(longest)
  if capacity < need:
    raise ValueError(
      f"capacity_bytes must be >= {need} (one state + KV of the longest request, "
      f"{longest} tokens, for model {model.name}), got {capacity:g}"
    )


def hit_granularity(kind: str, block_size: int, core: dict | None, checkpoint_unit: int) -> dict:
  """The policy's own hit granularity G and whether it may reuse the whole input.

  Checkpoint policies hit at multiples of the unit U, core policies at U with fine keys, else
  at the hash block (when given) or the block B, both capped at input - 1 tokens; the others
  (Marconi's tree, vLLM+, the oracle and the offline bound) at their block size (1 for
  Marconi) and may reuse the whole input. `fraction_of_oracle_own` divides by the infinite
  cache with the same rules.
  """
  if kind == "ckpt":
    return {"hit_granularity": checkpoint_unit, "hit_full_input": False}
  if kind == "core":
    unit = (core or {}).get("checkpoint_unit") or (core or {}).get("hash_block_size")
    return {"hit_granularity": unit or block_size, "hit_full_input": False}
  return {"hit_granularity": block_size, "hit_full_input": True}


def simulate(
  trace: trace_lib.Trace,
  model: ModelConfig,
  capacity_bytes: float,
  policy_name: str,
  block_size: int | None = None,
  core: dict | None = None,
  bound_iterations: int = DEFAULT_BOUND_ITERATIONS,
  checkpoint_unit: int = DEFAULT_CHECKPOINT_UNIT,
  replay: str = "sequential",
  step_tokens: int | None = None,
  max_running: int | None = None,
  arrival_scale: float | None = None,
) -> tuple[list[tuple[int, int, int]], dict]:
  """Replays `trace`; returns (triples, extra summary fields incl. wall_s).

  `core` (core policies only): backend ("jax" scan | "jax_protocol" | "reference"), retention
  ("policy", None or an int), pinning (bool), token_budget (None = whole prompt per step); see
  `core_sim.py`. `bound_iterations`: offline_bound's subgradient iterations (its triples are
  the clairvoyant schedule's hits; the bounds are in the extra fields, see the module doc).
  `checkpoint_unit`: checkpoint policies' unit U (hits and states at multiples of it); their
  `core` dict may hold "alpha" (adaptive's fixed exponent, None or "tuned" = online).
  `replay`: "sequential" or "concurrent" (checkpoint policies only; `step_tokens`,
  `max_running` (default `concurrent.DEFAULT_*`) and `arrival_scale` (default 1) apply to it
  alone).
  """
  policy = parse_policy(policy_name)
  if replay not in checkpoint_policies.REPLAYS:
    raise ValueError(f"replay must be one of {checkpoint_policies.REPLAYS}, got {replay!r}")
  if replay == "concurrent" and policy.kind != "ckpt":
    raise ValueError(
      "replay 'concurrent' supports the checkpoint policies "
      f"{checkpoint_policies.PLACEMENTS} only, got policy {policy.name!r}"
    )
  if replay == "sequential" and (step_tokens, max_running, arrival_scale) != (None,) * 3:
    raise ValueError("step_tokens, max_running and arrival_scale apply to replay 'concurrent' only")
  if policy.required_block_size is not None:
    if block_size is None:
      block_size = policy.required_block_size
    elif block_size != policy.required_block_size:
      raise ValueError(
        f"block_size must be {policy.required_block_size} for policy {policy.name}, "
        f"got {block_size}"
      )
  if policy.kind in ("core", "bound", "ckpt") and block_size is None:
    block_size = DEFAULT_CORE_BLOCK
  if block_size is None:
    block_size = 1
  if block_size < 1:
    raise ValueError(f"block_size must be >= 1, got {block_size}")
  if not capacity_bytes > 0:
    raise ValueError(f"capacity_bytes must be > 0, got {capacity_bytes!r}")
  extra: dict = {"policy": policy.name, "model": model.name, "block_size": block_size}
  extra |= hit_granularity(policy.kind, block_size, core, checkpoint_unit)
  if policy.kind == "core":
    return _simulate_core(trace, model, capacity_bytes, policy.name, block_size, extra, core)
  if policy.kind == "bound":
    return _simulate_bound(trace, model, capacity_bytes, block_size, extra, bound_iterations)
  if policy.kind == "ckpt":
    alpha = _alpha((core or {}).get("alpha"))
    if alpha is not None and alpha != "tuned" and policy.name != "adaptive":
      raise ValueError(f"alpha applies to adaptive only, got --alpha for {policy.name}")
    check_capacity(trace, model, capacity_bytes)
    triples, ck = checkpoint_policies.run_checkpoint(
      trace,
      model,
      capacity_bytes,
      policy.name,
      unit=checkpoint_unit,
      block_size=block_size,
      alpha=None if alpha == "tuned" else alpha,
      replay=replay,
      step_tokens=concurrent.DEFAULT_STEP_TOKENS if step_tokens is None else step_tokens,
      max_running=concurrent.DEFAULT_MAX_RUNNING if max_running is None else max_running,
      arrival_scale=1.0 if arrival_scale is None else arrival_scale,
    )
    return triples, extra | ck
  check_capacity(trace, model, capacity_bytes)
  t0 = time.perf_counter()
  if policy.kind == "oracle":
    reused = oracle_reused(trace, block_size)
    triples = [
      (int(x > 0), r.num_input_tokens, int(x)) for r, x in zip(trace.requests, reused.tolist())
    ]
  elif policy.kind == "vllm_plus":
    hist, vtree = run_vllm_plus(trace, model, capacity_bytes, block_size)
    triples = [(int(h), n, r) for h, n, r in hist]
    extra |= {
      "states_admitted": vtree.states_admitted,
      "states_evicted": vtree.states_evicted,
      "final_tree_bytes": vtree.tree_bytes,
    }
  else:
    hist, tree = run_marconi(trace, model, capacity_bytes, policy.version, policy.alpha)
    triples = [(int(h), n, r) for h, n, r in hist]
    extra |= {
      "alpha": tree.alpha,
      "tuned_alpha": tree.tuned_alpha,
      "bootstrap_window": tree.bootstrap_window,
      "states_admitted": tree.states_admitted,
      "states_evicted": tree.states_evicted,
      "final_tree_bytes": tree.tree_bytes,
    }
  extra["wall_s"] = time.perf_counter() - t0
  return triples, extra


def _simulate_bound(trace, model, capacity_bytes, block_size, extra, iterations):
  check_capacity(trace, model, capacity_bytes)  # as every policy (the bound itself needs none)
  t0 = time.perf_counter()
  res = offline_bound(trace, model, capacity_bytes, block_size, iterations=iterations)
  triples = [
    (int(h > 0), r.num_input_tokens, int(h))
    for r, h in zip(trace.requests, res.clairvoyant_h.tolist())
  ]
  total_in = trace.input_tokens
  extra |= {
    "bound_flops_saved": res.bound_flops,
    "bound_tokens_reused": res.bound_tokens,
    "bound_token_hit_rate": res.bound_tokens / total_in if total_in else 0.0,
    "clairvoyant_flops_saved": res.clairvoyant_flops,
    "clairvoyant_tokens_reused": res.clairvoyant_tokens,
    "bound_iterations": iterations,
    "bound_best_iteration_flops": res.best_iteration_flops,
    "bound_best_iteration_tokens": res.best_iteration_tokens,
    "wall_s": time.perf_counter() - t0,
  }
  return triples, extra


def _simulate_core(trace, model, capacity_bytes, name, block_size, extra, core):
  core = dict(core or {})
  backend = core.pop("backend", "jax")
  retention = core.pop("retention", "policy")
  pinning = core.pop("pinning", False)
  budget = core.pop("token_budget", None)
  alpha = _alpha(core.pop("alpha", None))
  hbs = core.pop("hash_block_size", None)
  layout = core.pop("page_layout", "model")
  state_fraction = core.pop("state_fraction", None)
  placement = core.pop("placement", "vllm")
  admission = core.pop("admission", "all")
  retention_policy = core.pop("retention_policy", "prefix")
  unit = core.pop("checkpoint_unit", None)
  if core:
    raise ValueError(
      "core options must be backend/retention/pinning/token_budget/alpha/hash_block_size/"
      "page_layout/state_fraction/placement/admission/retention_policy/checkpoint_unit, "
      f"got {core}"
    )
  if name == "flop_aware" and alpha is None:
    alpha = DEFAULT_FLOP_ALPHA
  check_capacity(trace, model, capacity_bytes)
  core_sim.token_ids_fit(trace)
  cfg, sizing = core_sim.build_config(
    trace,
    model,
    capacity_bytes,
    name,
    block_size,
    retention=retention,
    pinning=pinning,
    token_budget=budget,
    hash_block_size=hbs,
    layout=layout,
    state_fraction=state_fraction,
    placement=placement,
    admission=admission,
    retention_policy=retention_policy,
    checkpoint_unit=unit,
  )
  t0 = time.perf_counter()
  triples, counters = core_sim.replay(
    trace, cfg, backend, alpha=alpha if name == "flop_aware" else None, model=model
  )
  extra |= sizing | counters
  extra["wall_s"] = time.perf_counter() - t0
  return triples, extra


def _atomic_write(path: str, text: str) -> None:
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def build_parser() -> argparse.ArgumentParser:
  p = cli_util.ArgumentParser(prog="python -m hybrid_cache.sim", description=__doc__.split("\n")[0])
  p.add_argument(
    "--trace",
    required=True,
    help="trace file; generator name for synthetic; sharegpt: a ShareGPT JSON or 'default'",
  )
  p.add_argument(
    "--format", required=True, choices=("marconi", "mooncake", "synthetic", "sharegpt")
  )
  model = p.add_mutually_exclusive_group(required=True)
  model.add_argument("--model", help=f"a preset, one of {sorted(MODELS)}")
  model.add_argument(
    "--model-config",
    help="a Hugging Face config.json, or a directory holding one (`hf_cost_model.py`: "
    "qwen3_5, qwen3_next, nemotron_h, gemma3)",
  )
  p.add_argument(
    "--capacity-bytes", required=True, type=cli_util.positive_float_arg, help="finite, > 0"
  )
  p.add_argument("--policy", required=True)
  p.add_argument(
    "--block-size",
    type=_block_size_arg,
    default=None,
    help=">= 1, or 'vllm': the block vLLM 0.33 picks for the model by page equality",
  )
  p.add_argument("--dump", default=None, help="write per-request triples (JSON) here")
  p.add_argument(
    "--limit", type=cli_util.int_arg(1), default=None, help="replay only the first N requests"
  )
  p.add_argument(
    "--max-input", type=cli_util.int_arg(1), default=None, help="mooncake: drop longer inputs"
  )
  p.add_argument("--seed", type=cli_util.int_arg(0), default=0, help="synthetic: generator seed")
  p.add_argument(
    "--bound-iterations",
    type=cli_util.int_arg(0),
    default=DEFAULT_BOUND_ITERATIONS,
    help="offline_bound: subgradient iterations per objective (0: the capacity-cut oracle)",
  )
  p.add_argument(
    "--checkpoint-unit",
    type=cli_util.int_arg(1),
    default=DEFAULT_CHECKPOINT_UNIT,
    help="checkpoint policies: tokens per checkpoint unit U (states at its multiples)",
  )
  p.add_argument(
    "--fine-keys",
    action="store_true",
    help="core policies (beyond vLLM): recurrent state blocks of --checkpoint-unit U (the "
    "prompt end's and the junction's states at U) and full attention keyed at every U inside "
    "its blocks (CacheConfig.fine_keys): hits at U for any --block-size",
  )
  p.add_argument(
    "--hash-block-size",
    type=cli_util.int_arg(1),
    default=None,
    help="core policies: vLLM's hash block (partial hits when it divides a larger block)",
  )
  p.add_argument(
    "--replay",
    choices=checkpoint_policies.REPLAYS,
    default="sequential",
    help="sequential (one request at a time) or concurrent (checkpoint policies: timestamps, "
    "a token budget per step, several running requests)",
  )
  p.add_argument(
    "--step-tokens",
    type=cli_util.int_arg(1),
    default=None,
    help=f"--replay concurrent: tokens per engine step (default {concurrent.DEFAULT_STEP_TOKENS})",
  )
  p.add_argument(
    "--max-running",
    type=cli_util.int_arg(1),
    default=None,
    help=f"--replay concurrent: most running requests (default {concurrent.DEFAULT_MAX_RUNNING})",
  )
  p.add_argument(
    "--arrival-scale",
    type=cli_util.positive_float_arg,
    default=None,
    help="--replay concurrent: multiply arrival times (> 1 lowers the offered load; default 1)",
  )
  p.add_argument(
    "--page-layout",
    choices=core_sim.LAYOUTS,
    default="model",
    help="core policies: model (one group per layer kind, page = the largest), vllm "
    "(vLLM's groups of equal layer counts, per-layer page equality) or pools (KV pages and "
    "state slots under one byte budget; --state-fraction for a fixed split)",
  )
  p.add_argument(
    "--state-fraction",
    type=_state_fraction,
    default=None,
    help="--page-layout pools: a fixed share of --capacity-bytes for recurrent-state slots, in "
    "(0, 1) (default: pages and slots share the whole budget)",
  )
  p.add_argument("--no-oracle", action="store_true", help="skip the oracle bound in the summary")
  p.add_argument(
    "--backend",
    type=_backend,
    default="jax",
    help="core policies: jax (jitted scan), jax_protocol (JaxCacheManager) or reference",
  )
  p.add_argument(
    "--retention", default="policy", help="core policies: policy, dense, or an interval in tokens"
  )
  p.add_argument("--pinning", action="store_true", help="core policies: SWA/prefix pinned tier")
  p.add_argument(
    "--placement",
    choices=PLACEMENT_POLICIES,
    default="vllm",
    help="core policies: where recurrent states are kept (registered placement policy)",
  )
  p.add_argument(
    "--admission",
    choices=ADMISSION_POLICIES,
    default="all",
    help="core policies: which kept recurrent states are registered (registered policy)",
  )
  p.add_argument(
    "--retention-policy",
    choices=RETENTION_POLICIES,
    default="prefix",
    help="core policies with --pinning: what a finished request pins (registered policy)",
  )
  p.add_argument(
    "--token-budget",
    type=cli_util.int_arg(1),
    default=None,
    help="core policies: tokens per step (None: prompt)",
  )
  p.add_argument(
    "--alpha",
    default=None,
    help="flop_aware: static alpha in [0, 100] (default 1), or 'tuned' (Marconi's online tuner)",
  )
  return p


def _load_trace(args: argparse.Namespace) -> trace_lib.Trace:
  """The --trace of --format (ValueError naming the file on a missing or unreadable one)."""
  if args.format == "synthetic":
    trace = synthetic.generate(args.trace, seed=args.seed)
    return trace if args.limit is None else trace.head(args.limit)
  if args.format == "sharegpt":
    from hybrid_cache.sim.sharegpt import load_sharegpt

    path = None if args.trace == "default" else args.trace
    if path is not None and os.path.isdir(path):
      raise ValueError(f"trace file {path!r} is a directory")
    trace = load_sharegpt(path)
    return trace if args.limit is None else trace.head(args.limit)
  path = args.trace
  if not os.path.exists(path):
    raise ValueError(f"trace file {path!r} does not exist")
  if os.path.isdir(path):
    raise ValueError(f"trace file {path!r} is a directory")
  try:
    return trace_lib.load(path, args.format, limit=args.limit, max_input=args.max_input)
  except OSError as e:
    raise ValueError(f"trace file {path!r}: {cli_util.os_error_text(e)}") from None
  except UnicodeDecodeError as e:
    raise ValueError(f"trace file {path!r} is not UTF-8 text (byte {e.start})") from None
  except OverflowError as e:
    raise ValueError(f"trace file {path!r}: a number does not fit in int64 ({e})") from None


def _check_dump(path: str) -> None:
  """ValueError when --dump cannot be written (before the replay, so no work is lost)."""
  if os.path.isdir(path):
    raise ValueError(f"--dump {path!r} is a directory")
  parent = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(parent):
    raise ValueError(f"--dump {path!r}: directory {parent!r} does not exist")


def main(argv: list[str] | None = None) -> int:
  """Runs the CLI; returns the exit status (2 with one `error:` line on bad input)."""
  try:
    args = build_parser().parse_args(argv)
  except SystemExit as e:  # usage errors (printed by the parser) and --help
    return e.code if isinstance(e.code, int) else cli_util.USAGE_ERROR
  core_scan.enable_compile_cache()
  try:
    model = (
      get_model(args.model) if args.model_config is None else load_cost_model(args.model_config)
    )
    parse_policy(args.policy)
    block_size = args.block_size
    if block_size == "vllm":
      block_size = model.vllm_block_size()
    core = {
      "backend": args.backend,
      "retention": _retention(args.retention),
      "pinning": args.pinning,
      "token_budget": args.token_budget,
      "alpha": _alpha(args.alpha),
    }
    if args.hash_block_size is not None:
      core["hash_block_size"] = args.hash_block_size
    seams = (("placement", "vllm"), ("admission", "all"), ("retention_policy", "prefix"))
    for seam, default in seams:
      if getattr(args, seam) != default:
        if parse_policy(args.policy).kind != "core":
          raise ValueError(f"{seam} applies to core policies only, got {args.policy!r}")
        core[seam] = getattr(args, seam)
    if args.page_layout != "model":
      if parse_policy(args.policy).kind != "core":
        raise ValueError(
          f"page_layout {args.page_layout!r} applies to core policies only, got {args.policy!r}"
        )
      core["page_layout"] = args.page_layout
    if args.state_fraction is not None:
      if args.page_layout != "pools":
        raise ValueError(
          f"state_fraction needs --page-layout pools, got --page-layout {args.page_layout}"
        )
      core["state_fraction"] = args.state_fraction
    if args.fine_keys:
      if parse_policy(args.policy).kind != "core":
        raise ValueError(f"fine_keys applies to core policies only, got {args.policy!r}")
      core["checkpoint_unit"] = args.checkpoint_unit
    if args.dump:
      _check_dump(args.dump)
    trace = _load_trace(args)
    try:
      triples, extra = simulate(
        trace,
        model,
        args.capacity_bytes,
        args.policy,
        block_size,
        core=core,
        bound_iterations=args.bound_iterations,
        checkpoint_unit=args.checkpoint_unit,
        replay=args.replay,
        step_tokens=args.step_tokens,
        max_running=args.max_running,
        arrival_scale=args.arrival_scale,
      )
    except (OverflowError, MemoryError) as e:  # a pool no machine can hold
      raise ValueError(
        f"--capacity-bytes {args.capacity_bytes:g} is too large to simulate "
        f"({type(e).__name__}: {e})"
      ) from None
    oracle = own = None
    if not args.no_oracle:
      matched = oracle_matched(trace)
      bs = extra["block_size"]
      oracle = ((matched // bs) * bs).tolist()
      own = own_oracle_reused(
        matched, trace, extra["hit_granularity"], extra["hit_full_input"]
      ).tolist()
    summary = summarize(triples, model, oracle_reused=oracle, oracle_own_reused=own) | extra
    if args.block_size == "vllm":
      summary["block_size_rule"] = "vllm"
    summary["requests_per_s"] = len(triples) / extra["wall_s"] if extra["wall_s"] > 0 else None
    if args.dump:
      try:
        _atomic_write(args.dump, json.dumps([list(t) for t in triples]) + "\n")
      except OSError as e:
        raise ValueError(f"--dump {args.dump!r}: {cli_util.os_error_text(e)}") from None
  except (ValueError, OSError, ImportError) as e:
    print(f"error: {cli_util.one_line(e)}", file=sys.stderr)
    return cli_util.USAGE_ERROR
  print(json.dumps(summary, indent=1))
  return 0
