"""`python -m hybrid_cache.explain` on a trace whose every loss has a known cause."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from hybrid_cache.explain import TraceArgs
from hybrid_cache.explain import explain
from hybrid_cache.explain import table
from hybrid_cache.explain import write
from hybrid_cache.explain.__main__ import main
from hybrid_cache.sim import trace as trace_lib

CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "..", "configs", "hf", "qwen3_5_0p8b")
BLOCK = 544  # vLLM's block for Qwen3.5-0.8B on sm80


def _trace(path):
  rng = np.random.RandomState(0)
  prefix = rng.randint(0, 5000, 1200).tolist()  # > 2 blocks: a junction at 1,088
  short = rng.randint(5000, 9000, 300).tolist()  # < 1 block: never hit by vLLM
  prompts = [prefix + rng.randint(10_000, 20_000, 700).tolist() for _ in range(4)]
  prompts += [short + rng.randint(20_000, 30_000, 50).tolist() for _ in range(2)]
  reqs = [
    trace_lib.token_request(p, list(range(40_000 + 8 * i, 40_008 + 8 * i)), session_id=i)
    for i, p in enumerate(prompts)
  ]
  trace_lib.write_marconi(trace_lib.Trace(tuple(reqs)), path)
  return str(path)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
  path = _trace(tmp_path_factory.mktemp("explain") / "trace.jsonl")
  return explain(TraceArgs(path, "marconi"), CONFIG, "sm80", capacity_bytes=4e10)


def test_what_vllm_hits_and_why_not_more(result):
  assert "block 544" in result["vllm_geometry"]
  # the first prompt keeps its state in its own tokens (at 1,632); the second re-sights the
  # prefix and caches the junction's state at 1,088; the last two hit it
  assert result["vllm_cached_tokens"] == 2 * 2 * BLOCK
  rows = result["per_request"]
  assert [r["hit"] for r in rows] == [0, 0, 1088, 1088, 0, 0]
  assert [r["reason"] for r in rows] == [
    "nothing_lost",  # nothing to reuse: the first request
    "no_state_at_prefix_end",
    "no_state_at_prefix_end",  # the 112 tokens past the junction's block
    "no_state_at_prefix_end",
    "nothing_lost",
    "below_block_floor",  # 300 shared tokens under one 544-token block
  ]
  assert rows[5]["below_block_floor"] == 300
  assert rows[1]["no_state_at_prefix_end"] == 1200


def test_the_parts_add_up_to_the_reusable_tokens(result):
  for r in result["per_request"]:
    parts = [r[k] for k in ("hit", "below_block_floor", "evicted", "not_retained")]
    parts += [r["partial_block"], r["no_state_at_prefix_end"], r["unattributed"]]
    assert sum(parts) == r["reusable"]
  assert result["reusable_tokens"] == 3 * 1200 + 300
  rec = result["recoveries"]
  assert rec["bound"]["tokens"] == result["reusable_tokens"] - result["vllm_cached_tokens"]
  assert rec["adaptive"]["tokens"] > 0  # states at multiples of 64 catch the short prefix


def test_table_and_files(result, tmp_path):
  text = table(result)
  assert "below block floor" in text and "prefix_match_unit=32" in text
  paths = write(result, str(tmp_path))
  assert all(os.path.getsize(p) > 0 for p in paths)
  with open(paths[1]) as f:
    assert len([json.loads(line) for line in f]) == 6


def test_bad_input_is_one_line(capsys, tmp_path):
  assert main(["--trace", "x", "--format", "marconi", "--model-config", str(tmp_path)]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error:") and "\n" not in err
