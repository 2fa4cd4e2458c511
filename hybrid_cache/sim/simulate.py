"""Replays a trace under one policy name: the simulator's one entry for every policy family.

`simulate` parses the name (`policies.parse_policy`) and hands the trace to the family's
replay: the cache core's profiles (`core_sim.py`), the offline bound (`offline_bound.py`), the
checkpoint policies (`checkpoint_policies.py`), the infinite cache (`oracle.py`), Marconi's
tree (`marconi_compat.py`) or its vLLM+ baseline (`vllm_plus.py`). It returns the per-request
triples and the family's extra summary fields; the command line (`cli.py`, which documents each
option) and the experiments call it. Every policy is refused a capacity that one request alone
exceeds (`check_capacity`); `hit_granularity` names the policy's own hit unit, for
`fraction_of_oracle_own`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hybrid_cache.sim import checkpoint_policies
from hybrid_cache.sim import concurrent
from hybrid_cache.sim import core_sim
from hybrid_cache.sim import trace as trace_lib
from hybrid_cache.sim.cost_model import CostModel
from hybrid_cache.sim.marconi_compat import run_marconi
from hybrid_cache.sim.offline_bound import offline_bound
from hybrid_cache.sim.oracle import oracle_reused
from hybrid_cache.sim.policies import CKPT_POLICIES
from hybrid_cache.sim.policies import UNIT_ADAPTIVE
from hybrid_cache.sim.policies import parse_policy
from hybrid_cache.sim.vllm_plus import run_vllm_plus

DEFAULT_CORE_BLOCK = 64
DEFAULT_FLOP_ALPHA = 1.0  # flop_aware's static alpha unless --alpha is given
DEFAULT_BOUND_ITERATIONS = 500  # offline_bound's subgradient iterations per objective
DEFAULT_CHECKPOINT_UNIT = 64  # the GDN/SSD kernels' chunk: a state at any multiple is free


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


def check_capacity(trace: trace_lib.Trace, model: CostModel, capacity: float) -> None:
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
  model: CostModel,
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
  progress: Callable[[int], None] | None = None,
) -> tuple[list[tuple[int, int, int]], dict]:
  """Replays `trace`; returns (triples, extra summary fields incl. wall_s).

  `core` (core policies only): backend ("jax" scan | "jax_protocol" | "reference"), retention
  ("policy", None or an int), pinning (bool), token_budget (None = whole prompt per step); see
  `core_sim.py`. `bound_iterations`: offline_bound's subgradient iterations (its triples are
  the clairvoyant schedule's hits; the bounds are in the extra fields, see `cli.py`).
  `checkpoint_unit`: checkpoint policies' unit U (hits and states at multiples of it); their
  `core` dict may hold "alpha" (adaptive's fixed exponent, None or "tuned" = online).
  `replay`: "sequential" or "concurrent" (checkpoint policies only; `step_tokens`,
  `max_running` (default `concurrent.DEFAULT_*`) and `arrival_scale` (default 1) apply to it
  alone).
  `progress(k)` (core policies; the others take seconds), if given, is told the requests
  replayed so far as the replay advances (`core_sim.replay`).
  """
  policy = parse_policy(policy_name)
  if replay not in checkpoint_policies.REPLAYS:
    raise ValueError(f"replay must be one of {checkpoint_policies.REPLAYS}, got {replay!r}")
  if replay == "concurrent" and policy.kind != "ckpt":
    raise ValueError(
      "replay 'concurrent' supports the checkpoint policies "
      f"{CKPT_POLICIES} only, got policy {policy.name!r}"
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
    return _simulate_core(
      trace, model, capacity_bytes, policy.name, block_size, extra, core, progress
    )
  if policy.kind == "bound":
    return _simulate_bound(trace, model, capacity_bytes, block_size, extra, bound_iterations)
  if policy.kind == "ckpt":
    alpha = _alpha((core or {}).get("alpha"))
    if alpha is not None and alpha != "tuned" and policy.placement != "adaptive":
      raise ValueError(f"alpha applies to {UNIT_ADAPTIVE} only, got --alpha for {policy.name}")
    check_capacity(trace, model, capacity_bytes)
    triples, ck = checkpoint_policies.run_checkpoint(
      trace,
      model,
      capacity_bytes,
      policy.placement,
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


def _simulate_core(trace, model, capacity_bytes, name, block_size, extra, core, progress=None):
  core = dict(core or {})
  backend = core.pop("backend", "jax")
  retention = core.pop("retention", "policy")
  pinning = core.pop("pinning", False)
  budget = core.pop("token_budget", None)
  alpha = _alpha(core.pop("alpha", None))
  hbs = core.pop("hash_block_size", None)
  layout = core.pop("page_layout", None)  # None: the profile's (`core_sim.build_config`)
  state_fraction = core.pop("state_fraction", None)
  placement = core.pop("placement", None)  # None: the profile's
  admission = core.pop("admission", "all")
  retention_policy = core.pop("retention_policy", "prefix")
  retirement = core.pop("retirement", None)  # None: the profile's
  unit = core.pop("checkpoint_unit", None)
  if core:
    raise ValueError(
      "core options must be backend/retention/pinning/token_budget/alpha/hash_block_size/"
      "page_layout/state_fraction/placement/admission/retention_policy/retirement/"
      "checkpoint_unit, "
      f"got {core}"
    )
  if alpha is not None and name != "flop_aware":  # (it used to fix the unit cache's, `adaptive`)
    raise ValueError(
      f"alpha applies to flop_aware and {UNIT_ADAPTIVE} only, got --alpha for {name}"
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
    retirement=retirement,
    checkpoint_unit=unit,
  )
  t0 = time.perf_counter()
  triples, counters = core_sim.replay(
    trace,
    cfg,
    backend,
    alpha=alpha if name == "flop_aware" else None,
    model=model,
    progress=progress,
  )
  extra |= sizing | counters
  extra["wall_s"] = time.perf_counter() - t0
  return triples, extra
