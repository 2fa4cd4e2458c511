"""Quickstart: the GDN preset serves a shared-prefix workload under cache arms side by side
(`configs/experiments/quickstart.gin`: caching off, vLLM 0.33's serving default
`vllm_default`, align + Marconi junction with a state per block `vllm_align_dense`, and
the core's `adaptive` on 64-token pages); prints a table with the cache fields each
arm sets and saves `quickstart.png`.

  python -m experiments.run --gin_file=configs/experiments/quickstart.gin --workdir=runs/qs
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from experiments import prefix_arms


def _fields(overrides: Mapping[str, Any]) -> str:
  return ", ".join(f"{k}={v}" for k, v in overrides.items())


def format_table(
  arms: dict[str, dict[str, Any]], configs: Mapping[str, Mapping[str, Any]] | None = None
) -> str:
  """The arms as a fixed-width text table (speedup = wall time of off / of the arm), then one
  line per arm in `configs` with the CacheConfig fields it sets."""
  w = max(15, *(len(n) + 2 for n in arms))
  head = f"{'arm':{w}s}{'cached':>8s}{'computed':>10s}{'wall_s':>9s}{'speedup':>9s}{'exact':>7s}"
  lines = [head, "-" * len(head)]
  off = arms["off"]["wall_s"]
  for name, a in arms.items():
    lines.append(
      f"{name:{w}s}{a['cached_tokens']:8d}{a['prefill_tokens_computed']:10d}"
      f"{a['wall_s']:9.3f}{off / a['wall_s']:9.2f}{str(a['outputs_equal_to_off']):>7s}"
    )
  for name in arms:
    if configs and name in configs:
      lines.append(f"{name}: {_fields(configs[name])}")
  return "\n".join(lines)


def run(workdir: str, seed: int = 0, **params: Any) -> dict[str, Any]:
  """Runs the arms; ``params`` are `prefix_arms.ArmsSetup` fields (its defaults apply).

  results.json: `model`, `seed`, `arms` = {name: ...} for the setup's `arms` (default
  `engine_workload.ARM_NAMES`), each with cached_tokens, prefill_tokens_computed, wall_s,
  outputs_equal_to_off, speedup_vs_off, cache_fields (the CacheConfig fields the arm sets), ...
  """
  s = prefix_arms.make_setup({}, params)
  title = f"{s.model}: {s.num_prompts} prompts sharing a {s.prefix_len}-token prefix"
  arms = prefix_arms.run_arms(workdir, seed, s, "quickstart.png", title)
  configs = s.arm_overrides()
  for name, a in arms.items():
    a["speedup_vs_off"] = arms["off"]["wall_s"] / a["wall_s"]
    a["cache_fields"] = configs[name]
  print(format_table(arms, configs))
  print(
    "vllm_default = vLLM 0.33's serving configuration for hybrid models (`hybrid_cache.profiles`)"
  )
  return {"model": s.model, "seed": seed, "setup": prefix_arms.setup_record(s), "arms": arms}
