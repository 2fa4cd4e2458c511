"""Quickstart: the GDN preset serves a shared-prefix workload with caching off, vLLM `align`
and `align` + Marconi admission; prints a table and saves `quickstart.png`.

  python -m experiments.run --gin_file=configs/experiments/quickstart.gin --workdir=runs/qs
"""

from __future__ import annotations

from typing import Any

from experiments import prefix_arms


def format_table(arms: dict[str, dict[str, Any]]) -> str:
  """The arms as a fixed-width text table (speedup = wall time of off / of the arm)."""
  head = f"{'arm':15s}{'cached':>8s}{'computed':>10s}{'wall_s':>9s}{'speedup':>9s}{'exact':>7s}"
  lines = [head, "-" * len(head)]
  off = arms["off"]["wall_s"]
  for name, a in arms.items():
    lines.append(
      f"{name:15s}{a['cached_tokens']:8d}{a['prefill_tokens_computed']:10d}"
      f"{a['wall_s']:9.3f}{off / a['wall_s']:9.2f}{str(a['outputs_equal_to_off']):>7s}"
    )
  return "\n".join(lines)


def run(workdir: str, seed: int = 0, **params: Any) -> dict[str, Any]:
  """Runs the three arms; ``params`` are `prefix_arms.ArmsSetup` fields (its defaults apply).

  results.json: `model`, `seed`, `arms` = {off, align, align_marconi}, each with cached_tokens,
  prefill_tokens_computed, wall_s, outputs_equal_to_off, speedup_vs_off, ...
  """
  s = prefix_arms.make_setup({}, params)
  title = f"{s.model}: {s.num_prompts} prompts sharing a {s.prefix_len}-token prefix"
  arms = prefix_arms.run_arms(workdir, seed, s, "quickstart.png", title)
  for a in arms.values():
    a["speedup_vs_off"] = arms["off"]["wall_s"] / a["wall_s"]
  print(format_table(arms))
  return {"model": s.model, "seed": seed, "setup": prefix_arms.setup_record(s), "arms": arms}
