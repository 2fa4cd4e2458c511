"""Shared part of the shared-prefix experiments (`quickstart`, `shared_prefix_divergence`).

Both serve `num_prompts` prompts that share a `prefix_len`-token prefix (each followed by its own
`suffix_len` random tokens) under cache arms (`arms`: "off" and profile names of
`hybrid_cache.profiles`; by default the standard three, `off`, `vllm_default`,
`align_dense_no_junction`, see `engine_workload.STANDARD_ARMS`), side by side on the same
model, and plot cached tokens, computed prefill tokens and wall time per arm. An arm whose
profile runs on pages of the checkpoint unit (`adaptive`) gets blocks of `checkpoint_unit`
tokens; the others use `block_size` for every group. An experiment is
its defaults (a dict of `ArmsSetup` overrides) plus how it reports the arms.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from absl import logging

from experiments import plotting
from hybrid_cache.engine import config as engine_config
from hybrid_cache.engine import workload as engine_workload

PLOTTED = ["cached_tokens", "prefill_tokens_computed", "wall_s"]


@dataclasses.dataclass(frozen=True)
class ArmsSetup:
  """Workload and engine settings (every field is a gin-bindable `run` parameter).

  Attributes:
    model: model preset served by every arm.
    arms: "off" (first) and profile names (`hybrid_cache.profiles`), served side by side.
    checkpoint_unit: the unit U of the unit-page arms (`adaptive`: every block U) and of
      fine-key arms (recurrent blocks of U): a multiple of the kernels' checkpoint chunk (64).
    num_prompts, prefix_len, suffix_len: the shared-prefix workload.
    max_new_tokens: decode tokens per request.
    block_size, num_blocks, max_num_batched_tokens, max_model_len: cache/engine sizes.
    concurrency: requests in flight (1: one after another); also the engine's max_num_seqs.
    cache_manager: "jax" (jitted core) or "reference" (the plain-Python twin).
    repeats: timed rounds after the warm-up round; the best round is reported.
    token_buckets: padded step sizes of the jitted model step (None: engine default).
    implementation: kernels of the model step ("xla" | "pallas" | "interpret" | None = by
      backend; `engine_config.IMPLEMENTATIONS`).
    progress: print per-round progress.
  """

  model: str = "qwen35_tiny"
  arms: tuple[str, ...] = engine_workload.ARM_NAMES
  checkpoint_unit: int = engine_workload.CHECKPOINT_UNIT
  num_prompts: int = 8
  prefix_len: int = 250
  suffix_len: int = 20
  max_new_tokens: int = 4
  block_size: int = 16
  num_blocks: int = 256
  max_num_batched_tokens: int = 512
  max_model_len: int = 512
  concurrency: int = 1
  cache_manager: str = "jax"
  repeats: int = 1
  token_buckets: tuple[int, ...] | None = (32, 512)
  implementation: str | None = None
  progress: bool = True

  def __post_init__(self):
    # The workload's sizes (the engine's are checked by its config): ValueError naming the field.
    for name, lo in _MIN_SIZES.items():
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    if self.prefix_len + self.suffix_len < 1:
      raise ValueError("prefix_len + suffix_len must be >= 1 (a prompt needs a token), got 0")
    engine_config.check_implementation(self.implementation)
    if not self.arms or self.arms[0] != "off" or len(set(self.arms)) != len(self.arms):
      raise ValueError(f"arms must start with 'off' and name each arm once, got {self.arms!r}")
    for name in self.arms:
      engine_workload.arm(name)  # ValueError naming the allowed profiles
    if isinstance(self.checkpoint_unit, bool) or not isinstance(self.checkpoint_unit, int):
      raise ValueError(f"checkpoint_unit must be an integer, got {self.checkpoint_unit!r}")

  def arm_overrides(self) -> dict[str, dict[str, Any]]:
    """Arm name -> its `cache_config_for` overrides (`adaptive`: blocks of U)."""
    return {name: engine_workload.arm(name, self.checkpoint_unit) for name in self.arms}


_MIN_SIZES = {
  "num_prompts": 1,
  "prefix_len": 0,
  "suffix_len": 0,
  "max_new_tokens": 1,
  "concurrency": 1,
  "repeats": 1,
}


def make_setup(defaults: Mapping[str, Any], params: Mapping[str, Any]) -> ArmsSetup:
  """`ArmsSetup` from the experiment's defaults overridden by the caller's (gin) params.

  Raises:
    ValueError: a name that is not an `ArmsSetup` field, or a workload size out of range.
  """
  fields = {f.name for f in dataclasses.fields(ArmsSetup)}
  unknown = sorted(set(defaults) - fields) + sorted(set(params) - fields)
  if unknown:
    raise ValueError(f"unknown parameter(s) {unknown}; allowed: {sorted(fields)}")
  return ArmsSetup(**{**dict(defaults), **dict(params)})


def setup_record(setup: ArmsSetup) -> dict[str, Any]:
  """Every resolved `ArmsSetup` field (defaults included) as JSON-ready values.

  config.gin records only the bound parameters; results.json carries this record so the exact
  setup of a run sits next to its results.
  """
  return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(setup).items()}


def run_arms(
  workdir: str, seed: int, setup: ArmsSetup, plot_name: str, title: str
) -> dict[str, dict[str, Any]]:
  """Serves the workload under the standard arms, saves `workdir/plot_name`; returns the arms.

  Each arm's record has `cached_tokens`, `prefill_tokens_computed`, `wall_s`,
  `outputs_equal_to_off`, `latency_ratio_vs_off`, ... (see `engine_workload.compare_arms`).
  """
  s = setup
  logging.info("prefix arms setup (seed %d): %s", seed, s)
  prompts = engine_workload.shared_prefix_prompts(seed, s.num_prompts, s.prefix_len, s.suffix_len)
  common = dict(
    block_size=s.block_size,
    num_blocks=s.num_blocks,
    max_num_batched_tokens=s.max_num_batched_tokens,
    max_model_len=s.max_model_len,
    max_requests=max(s.concurrency, 1),
  )
  arms = engine_workload.compare_arms(
    s.model,
    s.arm_overrides(),
    prompts,
    s.max_new_tokens,
    common=common,
    seed=seed,
    repeats=s.repeats,
    concurrency=s.concurrency,
    engine_kwargs=dict(
      cache_manager=s.cache_manager,
      token_buckets=s.token_buckets,
      max_num_seqs=s.concurrency,
      implementation=s.implementation,
    ),
    progress=s.progress,
  )
  plotting.bar_chart(os.path.join(workdir, plot_name), title, arms, PLOTTED)
  return arms
