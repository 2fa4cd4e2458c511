"""`python -m hybrid_cache.sim`: replays a trace under one policy and prints a JSON summary.

The command line of `cli.py` (whose docstring says what each option means): the parser
(`build_parser`, described by the line above), the option types that refuse a bad value with a
message, and the checks of the trace and of --dump done before any replay.
"""

from __future__ import annotations

import argparse
import json
import math
import os

from hybrid_cache import cli_util
from hybrid_cache.geometry import DEFAULT_TARGET
from hybrid_cache.geometry import TARGETS
from hybrid_cache.geometry import VllmFlags
from hybrid_cache.policies import ADMISSION_POLICIES
from hybrid_cache.policies import PLACEMENT_POLICIES
from hybrid_cache.policies import RETENTION_POLICIES
from hybrid_cache.policies import RETIREMENT_POLICIES
from hybrid_cache.sim import checkpoint_policies
from hybrid_cache.sim import concurrent
from hybrid_cache.sim import core_sim
from hybrid_cache.sim import synthetic
from hybrid_cache.sim import trace as trace_lib
from hybrid_cache.sim.core_groups import LAYOUTS
from hybrid_cache.sim.cost_model import MODELS
from hybrid_cache.sim.simulate import DEFAULT_BOUND_ITERATIONS
from hybrid_cache.sim.simulate import DEFAULT_CHECKPOINT_UNIT

# sessions per ShareGPT seed (`sharegpt.load_sharegpt`'s default `num_sessions`)
SHAREGPT_SESSIONS = 100


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


def _vllm_flags_arg(text: str) -> VllmFlags:
  """--vllm-flags: a JSON object of vLLM flags (`VllmFlags`)."""
  try:
    raw = json.loads(text)
  except json.JSONDecodeError as e:
    raise argparse.ArgumentTypeError(f"vllm flags must be a JSON object: {e.msg}") from None
  if not isinstance(raw, dict):
    raise argparse.ArgumentTypeError(f"vllm flags must be a JSON object, got {text!r}")
  try:
    return VllmFlags.from_mapping(raw)
  except ValueError as e:
    raise argparse.ArgumentTypeError(str(e)) from None


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
  p.add_argument(
    "--target",
    default=DEFAULT_TARGET,
    choices=sorted(TARGETS),
    help="--model-config: the GPU vLLM's geometry is derived for (default %(default)s)",
  )
  p.add_argument(
    "--vllm-flags",
    type=_vllm_flags_arg,
    default=None,
    help="--model-config: vLLM serving flags as a JSON object of vLLM option names, e.g. "
    '\'{"mamba_ssm_cache_dtype": "bfloat16", "tensor_parallel_size": 2}\' (`hybrid_cache.'
    "geometry.VllmFlags`)",
  )
  p.add_argument("--dump", default=None, help="write per-request triples (JSON) here")
  p.add_argument(
    "--limit", type=cli_util.int_arg(1), default=None, help="replay only the first N requests"
  )
  p.add_argument(
    "--max-input", type=cli_util.int_arg(1), default=None, help="mooncake: drop longer inputs"
  )
  p.add_argument(
    "--seed",
    type=cli_util.int_arg(0),
    default=0,
    help=f"synthetic: generator seed; sharegpt: the seed-th set of {SHAREGPT_SESSIONS} sessions",
  )
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
    choices=LAYOUTS,
    default=None,
    help="core policies: model (one group per layer kind, page = the largest), vllm "
    "(vLLM's groups of equal layer counts, per-layer page equality) or pools (KV pages and "
    "state slots under one byte budget; --state-fraction for a fixed split); default pools "
    "for adaptive (pages of its unit), else model",
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
    "--progress",
    action="store_true",
    help="a progress bar over the replayed requests on stderr (core policies: minutes on a "
    "real trace; the JSON summary on stdout is unchanged)",
  )
  p.add_argument(
    "--no-compile-cache",
    action="store_true",
    help="do not use JAX's persistent compilation cache (hybrid_cache/persistent_cache.py)",
  )
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
    default=None,
    help="core policies: where recurrent states are kept (registered placement policy; default"
    " the profile's: adaptive for adaptive, else vllm)",
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
    "--retirement",
    choices=RETIREMENT_POLICIES,
    default=None,
    help="core policies: which superseded recurrent states a finished request drops"
    " (registered retirement policy; default the profile's: superseded for adaptive, else none)",
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
    # seed k: the k-th disjoint set of sessions, as `experiments.beyond_vllm.load`
    trace = load_sharegpt(path, first_session=args.seed * SHAREGPT_SESSIONS)
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
