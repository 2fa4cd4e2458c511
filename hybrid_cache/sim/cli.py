"""`python -m hybrid_cache.sim`: replays a trace under one policy and prints a JSON summary.

  python -m hybrid_cache.sim --trace FILE --format {marconi,mooncake,synthetic,sharegpt} \
      (--model NAME | --model-config PATH) --capacity-bytes X --policy NAME \
      [--block-size B|vllm] [--dump FILE]

Models (`cost_model.MODELS`): marconi_7b (Marconi's default), qwen3_5_like (Qwen3.5-4B shapes,
GDN 3:1), nemotron_h_like (Nemotron-H-8B shapes, Mamba2), qwen3_5_0_8b, qwen3_5_9b,
nemotron_h_8b, gemma3_4b. --block-size vllm takes the attention block size vLLM 0.33 would
pick for the model by page equality (`CostModel.vllm_block_size`: qwen3_5_like 576,
nemotron_h_like 1,040, marconi_7b 80; 16 for models without recurrent layers).
--model-config PATH instead builds the cost model from a Hugging Face config.json (PATH: the file
or a directory holding one; `hf_cost_model.py`: Qwen3.5 / Qwen3-Next, Nemotron-H, Gemma 3, dense
and MoE); the summary's model is PATH. With no --block-size, a core profile on vLLM's pages
(`vllm_default` and its variants; not `adaptive`) runs the cache vLLM 0.33 builds for that
config (`hybrid_cache.geometry.derive`): the block, KV-cache groups (--page-layout vllm), hash
block and step budget (--token-budget) vLLM derives for --target (sm80 | sm90 | sm100 or a
product name, default sm90) and --vllm-flags (a JSON object of vLLM option names); the summary
then has `vllm_geometry`, vLLM's start-up line for it. Qwen3.5-0.8B: 544-token blocks on sm80
(Triton GDN prefill), 576 on sm90 (FlashInfer's 64-token checkpoint grid).

With --format synthetic, --trace names a generator (`synthetic.KINDS`) and --seed picks the seed;
with --format sharegpt, --trace is a ShareGPT JSON file or `default` (the packaged copy, optional
extra `sharegpt`, see `sharegpt.py`) and --seed k takes its k-th disjoint set of 100 sessions
(`first_session = 100 k`, as the experiments' seeds). The summary has requests, input_tokens,
token_hit_rate, request_hit_rate, flops_saved, TTFT percentiles, the oracle bounds and wall_s
(replay seconds: trace parsing excluded, any compilation included). fraction_of_oracle divides by
the infinite cache at the policy's --block-size; fraction_of_oracle_own by the one at its own hit
granularity (`hit_granularity`: U for checkpoint policies, the hash block or B for core policies,
both capped at input - 1 tokens; B for the others, whole inputs allowed). --dump writes [hit,
num_input_tokens, tokens_reused] per request in trace order (atomically, only after a successful
replay). Bad input exits with status 2 and a message.

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
--page-layout vllm (core policies): vLLM's own KV-cache groups and page (`core_groups.py`: groups
of equal layer counts, one layer's KV page >= one layer's state), instead of one group per kind.
--page-layout pools (core policies): two pools under the one byte budget, KV pages and state
slots (`CacheConfig.state_slots`): both draw on the whole budget (`CacheConfig.byte_budget`),
or with --state-fraction F that share of the bytes is a fixed pool of slots.

--progress draws a bar over the replayed requests on stderr (a core policy's replay of a real trace
takes minutes; it advances after each chunk of requests, or each re-tuning interval under
`adaptive`).

--replay concurrent (checkpoint policies only; default sequential): arrivals at the trace's
timestamps, --step-tokens tokens per engine step (default 8192), at most --max-running requests
at once (default 1024), chunked prefill, FCFS; a request's lookup happens at its admission and
its insertion when it finishes (`concurrent.py`); --arrival-scale X multiplies the arrival times.
ttft_mean_ms / ttft_p50_ms / ttft_p95_ms then include queueing and state copies; queue_*_ms,
steps, makespan_s and offered_load (> 1: the queue grows whatever the cache) are added.

The options are parsed and checked in `cli_args.py`; `simulate.py` replays the trace (the same
entry the experiments call).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from hybrid_cache import cli_util
from hybrid_cache import geometry as geometry_lib
from hybrid_cache import persistent_cache
from hybrid_cache import profiles
from hybrid_cache.sim.cli_args import _check_dump
from hybrid_cache.sim.cli_args import _load_trace
from hybrid_cache.sim.cli_args import _retention
from hybrid_cache.sim.cli_args import build_parser
from hybrid_cache.sim.cost_model import get_model
from hybrid_cache.sim.hf_cost_model import load_cost_model
from hybrid_cache.sim.metrics import summarize
from hybrid_cache.sim.oracle import oracle_matched
from hybrid_cache.sim.oracle import own_oracle_reused
from hybrid_cache.sim.policies import parse_policy
from hybrid_cache.sim.simulate import _alpha
from hybrid_cache.sim.simulate import simulate


def _atomic_write(path: str, text: str) -> None:
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def _default_layout(policy: str, model) -> str:
  """The page layout a policy runs with when --page-layout is not given (`build_config`)."""
  p = parse_policy(policy)
  unit = p.kind == "core" and profiles.get(p.name).unit_pages
  return "pools" if unit and model.n_attn and model.n_recurrent else "model"


def _progress_bar(args, total: int):
  """A tqdm bar over `total` requests on stderr with --progress, else None."""
  if not args.progress:
    return None
  from tqdm import tqdm

  return tqdm(total=total, desc=f"replay {args.policy}", unit="req", file=sys.stderr)


def _vllm_geometry(args):
  """vLLM 0.33's geometry for --model-config, when the block is vLLM's to choose: no
  --block-size, a core profile on vLLM's pages (`Profile.unit_pages` off). Else None."""
  if args.model_config is None or args.block_size is not None:
    return None
  p = parse_policy(args.policy)
  if p.kind != "core" or profiles.get(p.name).unit_pages:
    return None
  flags = args.vllm_flags or geometry_lib.VllmFlags()
  if flags.enable_mamba_shared_prefix_checkpoint:
    raise ValueError(
      "vllm flag enable_mamba_shared_prefix_checkpoint is not modelled by the cache core "
      "(supported: false)"
    )
  if args.hash_block_size is not None:
    flags = dataclasses.replace(flags, prefix_match_unit=args.hash_block_size)
  return geometry_lib.derive(args.model_config, args.target, flags)


def main(argv: list[str] | None = None) -> int:
  """Runs the CLI; returns the exit status (2 with one `error:` line on bad input)."""
  try:
    args = build_parser().parse_args(argv)
  except SystemExit as e:  # usage errors (printed by the parser) and --help
    return e.code if isinstance(e.code, int) else cli_util.USAGE_ERROR
  if not args.no_compile_cache:
    persistent_cache.enable()
  try:
    summary = replay_summary(args)
  except (ValueError, OSError, ImportError) as e:
    print(f"error: {cli_util.one_line(e)}", file=sys.stderr)
    return cli_util.USAGE_ERROR
  print(json.dumps(summary, indent=1))
  return 0


def run(argv: list[str]) -> dict:
  """The summary `python -m hybrid_cache.sim ARGV` prints (ValueError on bad input), for
  experiments that replay through the command line's exact path."""
  try:
    args = build_parser().parse_args(argv)
  except SystemExit:
    raise ValueError(f"bad simulator arguments {argv!r} (python -m hybrid_cache.sim -h)") from None
  return replay_summary(args)


def replay_summary(args) -> dict:
  """Replays the trace the parsed `args` name; returns the JSON summary (module docstring)."""
  model = get_model(args.model) if args.model_config is None else load_cost_model(args.model_config)
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
  geometry = _vllm_geometry(args)
  if geometry is not None:  # vLLM's own block, groups, hash block and step budget
    block_size = geometry.block_size
    if core["token_budget"] is None:
      core["token_budget"] = geometry.max_num_batched_tokens
    if geometry.partial_hits and args.hash_block_size is None:
      core["hash_block_size"] = geometry.hash_block_size
    if args.page_layout is None:
      args.page_layout = "vllm"
  # None: not given (placement, retirement, page layout: the profile's, `core_sim.build_config`)
  seams = (
    ("placement", None),
    ("admission", "all"),
    ("retention_policy", "prefix"),
    ("retirement", None),
  )
  for seam, default in seams:
    if getattr(args, seam) != default:
      if parse_policy(args.policy).kind != "core":
        raise ValueError(f"{seam} applies to core policies only, got {args.policy!r}")
      core[seam] = getattr(args, seam)
  if args.page_layout is not None:
    if parse_policy(args.policy).kind != "core":
      raise ValueError(
        f"page_layout {args.page_layout!r} applies to core policies only, got {args.policy!r}"
      )
    core["page_layout"] = args.page_layout
  if args.state_fraction is not None:
    layout = args.page_layout or _default_layout(args.policy, model)
    if layout != "pools":
      raise ValueError(f"state_fraction needs --page-layout pools, got --page-layout {layout}")
    core["state_fraction"] = args.state_fraction
  if args.fine_keys:
    if parse_policy(args.policy).kind != "core":
      raise ValueError(f"fine_keys applies to core policies only, got {args.policy!r}")
    core["checkpoint_unit"] = args.checkpoint_unit
  if args.dump:
    _check_dump(args.dump)
  trace = _load_trace(args)
  bar = _progress_bar(args, len(trace.requests))
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
      progress=None if bar is None else lambda k: bar.update(k - bar.n),
    )
    if bar is not None:
      bar.update(len(trace.requests) - bar.n)
  except (OverflowError, MemoryError) as e:  # a pool no machine can hold
    raise ValueError(
      f"--capacity-bytes {args.capacity_bytes:g} is too large to simulate ({type(e).__name__}: {e})"
    ) from None
  finally:
    if bar is not None:
      bar.leave = bar.n == bar.total  # a replay that failed leaves no bar behind its error
      bar.close()
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
  if geometry is not None:
    summary["block_size_rule"] = f"vllm_geometry:{geometry.target.name}"
    summary["vllm_geometry"] = geometry.summary()
  summary["requests_per_s"] = len(triples) / extra["wall_s"] if extra["wall_s"] > 0 else None
  if args.dump:
    try:
      _atomic_write(args.dump, json.dumps([list(t) for t in triples]) + "\n")
    except OSError as e:
      raise ValueError(f"--dump {args.dump!r}: {cli_util.os_error_text(e)}") from None
  return summary
