"""The plain-Python core against vLLM 0.33's real cache manager, on the recorded suite.

`tests/hybrid_cache/vllm_diff/recorded.jsonl.gz` holds generated scenarios with vLLM's outputs
(regenerate: `python -m tests.hybrid_cache.vllm_diff.record --oracle_dir=DIR`). Every scenario
must agree on the semantic fields (the oracle's `compare.py`) and on vLLM's block layout.
The live mode (`vllm_diff_live_test.py`) checks fresh scenarios against the oracle itself.
"""

import collections

from tests.hybrid_cache.vllm_diff import generator
from tests.hybrid_cache.vllm_diff import record
from tests.hybrid_cache.vllm_diff import suite

ROWS = record.load()


def test_recorded_suite_is_large_and_covers_every_family():
  assert len(ROWS) >= 500
  fams = collections.Counter(r["scenario"]["name"].rsplit("_", 1)[0][4:] for r in ROWS)
  assert set(fams) == set(generator.FAMILY_NAMES), fams
  ops = collections.Counter(a["op"] for r in ROWS for a in r["scenario"]["actions"])
  for op in ("prefill", "schedule", "decode", "free", "preempt", "reset_prefix_cache", "lookup"):
    assert ops[op] > 20, ops


def test_generator_is_a_function_of_the_seed():
  for row in ROWS[:20]:
    sc = generator.generate(row["seed"])
    assert sc["config"] == row["scenario"]["config"]
    assert sc["prompts"] == row["scenario"]["prompts"]


def test_reference_agrees_with_vllm_on_every_recorded_scenario():
  n, diffs = suite.disagreements(ROWS, "reference", layout=True)
  assert n == len(ROWS)
  assert not diffs, "\n".join(diffs)
