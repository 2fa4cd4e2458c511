"""vLLM PR #37898's experiment on vLLM 0.33's geometry: the PR's own numbers, exactly."""

from __future__ import annotations

import pytest

from experiments import vllm_pr37898


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  """Four replays: both models on the Triton target, 0.8B's two arms on Hopper."""
  triton = vllm_pr37898.run(
    str(tmp_path_factory.mktemp("pr37898")), targets=("sm80",), arms=("vllm_default",)
  )
  hopper = vllm_pr37898.run(
    str(tmp_path_factory.mktemp("pr37898_sm90")),
    configs=("qwen3_5_0p8b",),
    targets=("sm90",),
    arms=("before_pr", "vllm_default"),
  )
  return {**triton, "rows": triton["rows"] + hopper["rows"]}


def _cached(results, config, target, arm):
  (row,) = [
    r for r in results["rows"] if (r["config"], r["target"], r["arm"]) == (config, target, arm)
  ]
  return row["block_size"], row["prompt_tokens_cached"]


def test_prompts_have_the_prs_token_counts(results):
  assert results["shared_tokens_letter_prompts"] == 15_601
  assert results["shared_tokens_first_prompt"] == 15_600
  assert len(results["prompt_tokens"]) == 21


@pytest.mark.parametrize("config", ["qwen3_5_0p8b", "qwen3_5_35b_a3b"])
def test_vllm_default_on_triton_gdn_prefill_is_the_prs_number(results, config):
  block, cached = _cached(results, config, "sm80", "vllm_default")
  assert cached == vllm_pr37898.PR_CACHED_TOKENS[config]
  assert block == {"qwen3_5_0p8b": 544, "qwen3_5_35b_a3b": 1056}[config]


def test_hopper_geometry_and_the_junctions_gain(results):
  # FlashInfer's 64-token checkpoint grid: 576-token blocks, 19 hits at the last block boundary
  # inside the 15,601 shared tokens
  assert _cached(results, "qwen3_5_0p8b", "sm90", "vllm_default") == (576, 19 * 15_552)
  # before the PR, one chunk of 16,384 tokens ends past the shared prefix: nothing to reuse
  assert _cached(results, "qwen3_5_0p8b", "sm90", "before_pr")[1] == 0
