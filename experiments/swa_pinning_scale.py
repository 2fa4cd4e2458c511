"""vLLM PR #40676 (SWA pinning) at its own scale: the working-set sweep on a real Gemma 3 config.

The PR's plan: N distinct prefixes of ~28k tokens (N from 15 to 60) on a Gemma-3/4-like model
(sliding-window + full attention) with 1.47M tokens of KV cache, each prefix sent, then sent
again with a new suffix; the hit rate of the repeats and their time to first token, pinning
off and on. Here the model is a published Gemma 3 config (`configs/hf/gemma_3_27b` by
default), its cache the one vLLM 0.33 builds for `vllm serve` (`hybrid_cache.geometry`:
16-token blocks, 6 sliding-window groups + 1 full, retention interval 0, vLLM 0.33's free
order, the server's 8,192-token step budget on an H100), sized to
`kv_tokens` tokens as vLLM counts them (num_blocks = kv_tokens / block * groups), and each
point one replay through `python -m hybrid_cache.sim` (`--pinning` for the pinned tier, SPEC
B1). TTFT is the simulator's cost-model estimate (Marconi's prefill line, an assumption).

Retention (`retentions`): vLLM 0.33's default interval 0 keeps a sliding-window block only at a
request's replay boundary (its prompt's last block) and junctions, so a repeat whose suffix
differs finds no window before the shared prefix's end, pinned or not; "dense" keeps every
block hashed (vLLM 0.33's `prefix_cache_retention_interval=None`), the regime the PR measured.

`summary_table` renders the rows; the PR reported 0.22% without pinning and 83.7% with it at
30 prefixes (Gemma-3, vLLM's free order of the time: every freed block to the queue's tail).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments import plotting
from hybrid_cache import geometry
from hybrid_cache.sim import cli as sim_cli
from hybrid_cache.sim import trace as trace_lib

CONFIG_DIR = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "hf"
)
PR_HIT_RATE_AT_30 = {"pinning_off": 0.0022, "pinning_on": 0.837}


def working_set_trace(
  num_prefixes: int, prefix_len: int, suffix_len: int, output_len: int, seed: int, path: str
) -> int:
  """N prefixes sent once each, then once more each with a new suffix (Marconi JSONL at
  `path`); returns the index of the first repeat."""
  rng = np.random.RandomState(seed)
  vocab = 200_000
  prefixes = [rng.randint(0, vocab, prefix_len).tolist() for _ in range(num_prefixes)]
  prompts = [p + rng.randint(0, vocab, suffix_len).tolist() for p in prefixes]
  prompts += [p + rng.randint(0, vocab, suffix_len).tolist() for p in prefixes]
  reqs = [
    trace_lib.token_request(
      p, list(range(vocab + i * output_len, vocab + (i + 1) * output_len)), session_id=i
    )
    for i, p in enumerate(prompts)
  ]
  trace_lib.write_marconi(trace_lib.Trace(tuple(reqs)), path)
  return num_prefixes


def run(
  workdir: str,
  seed: int = 0,
  config: str = "gemma_3_27b",
  target: str = "sm90",
  num_prefixes: Sequence[int] = (15, 20, 30, 40, 50, 60),
  prefix_len: int = 28_000,
  suffix_len: int = 64,
  output_len: int = 16,
  kv_tokens: int = 1_470_000,
  retentions: Sequence[str] = ("0", "dense"),
) -> dict[str, Any]:
  """The sweep (module docstring): a row per (N, retention, pinning)."""
  os.makedirs(workdir, exist_ok=True)
  model_config = os.path.join(CONFIG_DIR, config)
  g = geometry.derive(model_config, target, usage_context="server")
  capacity = kv_tokens / g.block_size * len(g.groups) * g.bytes_per_block
  rows = []
  for n in num_prefixes:
    path = os.path.join(workdir, f"trace_{n}.jsonl")
    first_repeat = working_set_trace(n, prefix_len, suffix_len, output_len, seed + n, path)
    for retention, pinning in [(r, p) for r in retentions for p in (False, True)]:
      dump = os.path.join(workdir, f"dump_{n}_{retention}_{int(pinning)}.json")
      s = sim_cli.run(
        [
          f"--trace={path}",
          "--format=marconi",
          f"--model-config={model_config}",
          f"--target={target}",
          "--policy=vllm_default",
          '--vllm-flags={"usage_context": "server"}',
          f"--capacity-bytes={capacity}",
          f"--dump={dump}",
          "--no-oracle",
          f"--retention={retention}",
          *(["--pinning"] if pinning else []),
        ]
      )
      with open(dump) as f:
        triples = json.load(f)[first_repeat:]
      cached = sum(t[2] for t in triples)
      prompt = sum(t[1] for t in triples)
      rows.append(
        {
          "num_prefixes": n,
          "retention": retention,
          "pinning": pinning,
          "repeat_hit_rate": cached / prompt,
          "repeat_cached_tokens": cached,
          "ttft_mean_ms_all": s["ttft_mean_ms"],
          "working_set_tokens": n * (prefix_len + suffix_len),
          "kv_tokens": kv_tokens,
        }
      )
  series = {
    f"retention {ret}, pinning {'on' if on else 'off'}": {
      "repeat hit rate": [
        r["repeat_hit_rate"] for r in rows if (r["retention"], r["pinning"]) == (ret, on)
      ]
    }
    for ret in retentions
    for on in (False, True)
  }
  plotting.line_chart(
    os.path.join(workdir, "hit_rate.png"),
    f"#40676 working set on {config} ({target}), {kv_tokens:,} KV tokens",
    list(num_prefixes),
    series,
    ["repeat hit rate"],
    "prefixes of the working set",
  )
  return {
    "vllm_geometry": g.summary(),
    "capacity_bytes": capacity,
    "pr_hit_rate_at_30": PR_HIT_RATE_AT_30,
    "rows": rows,
  }


def summary_table(results: dict[str, Any]) -> str:
  lines = [
    "| prefixes | working set (tokens) | retention | pinning | repeat hit rate | mean TTFT (ms) |"
  ]
  lines.append("|---|---|---|---|---|---|")
  for r in results["rows"]:
    lines.append(
      f"| {r['num_prefixes']} | {r['working_set_tokens']:,} | {r['retention']} | "
      f"{'on' if r['pinning'] else 'off'} | {100 * r['repeat_hit_rate']:.1f}% | "
      f"{r['ttft_mean_ms_all']:.0f} |"
    )
  return "\n".join(lines)
