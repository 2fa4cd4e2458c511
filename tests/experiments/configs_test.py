"""Every .gin under configs/ parses, and every experiment config smoke-runs at tiny size."""

from __future__ import annotations

import json
import pathlib

import gin
import pytest

from experiments import run as run_lib

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
GIN_FILES = sorted(CONFIGS.rglob("*.gin"))

_SMALL = [
  "max_new_tokens = 1",
  "cache_manager = 'reference'",
  "progress = False",
  "max_num_batched_tokens = 32",
  "max_model_len = 128",
]
# Tiny bindings per experiment config (file stem -> bindings); a new config needs an entry.
TINY = {
  # attention blocks of 128 (the gin's): a 150-token prefix hits; `adaptive` needs a budget of
  # whole 64-token recurrent blocks
  "quickstart": [
    "num_prompts = 3",
    "prefix_len = 150",
    "suffix_len = 5",
    "max_new_tokens = 1",
    "cache_manager = 'reference'",
    "progress = False",
    "max_num_batched_tokens = 64",
    "max_model_len = 256",
  ],
  "shared_prefix_divergence": [
    "num_prompts = 3",
    "prefix_len = 40",
    "suffix_len = 20",
    *_SMALL,
  ],
  "spec_decode": [
    "prefix_len = 32",
    "question_len = 8",
    "num_questions = 2",
    "num_conversations = 3",
    "max_new_tokens = 6",
    "num_speculative_tokens = 2",
    "concurrency = 2",
    "rounds = 1",
    "cache_manager = 'reference'",
    "progress = False",
    "max_num_batched_tokens = 32",
    "max_model_len = 128",
  ],
  "beyond_vllm": [
    "seeds = (0,)",
    "capacities = (1.5e9,)",
    "params = {'num_sessions': 3, 'sys_prompt_len': 300, 'obs_mean': 60.0, 'max_turns': 6}",
    "block_size = 64",
    "bound_iterations = 20",
    "backend = 'reference'",
  ],
  "adaptive_ablation": [
    "trace = 'agentic'",
    "fmt = 'synthetic'",
    "capacities = (1.5e9,)",
    "params = {'num_sessions': 3, 'sys_prompt_len': 300, 'obs_mean': 60.0, 'max_turns': 6}",
    "block_size = 128",
    "backend = 'reference'",
  ],
  "capacity_sweep": [
    "trace = 'agentic'",
    "fmt = 'synthetic'",
    "params = {'num_sessions': 3, 'sys_prompt_len': 300, 'obs_mean': 60.0, 'max_turns': 6}",
    "cap_min = 1.5e9",
    "cap_max = 3e9",
    "num_points = 3",
    "block_size = 64",
    "progress = False",
  ],
  "bench_serving": [
    "size = 'qwen35_like_mid'",
    "dtype = 'float32'",
    "model_overrides = {'num_layers': 4, 'd_model': 128, 'vocab_size': 256, 'mlp_hidden': 256}",
    "num_prompts = 3",
    "prefix_len = 40",
    "suffix_len = 8",
    "max_new_tokens = 2",
    "concurrency = 2",
    "block_size = 16",
    "max_num_batched_tokens = 64",
    "repeats = 1",
    "arms = ('off', 'vllm_default')",
  ],
  "numerics_divergence": [
    "num_layers = 4",
    "d_model = 128",
    "vocab_size = 256",
    "num_prompts = 2",
    "prefix_len = 40",
    "suffix_len = 8",
    "max_new_tokens = 2",
    "block_size = 16",
    "chunk = 64",
  ],
  "engine_vs_sim": [
    "trace = 'chat'",
    "sessions = 2",
    "num_requests = 4",
    "stride = 8",
    "max_output = 2",
    "warmup = False",
    "policies = ('vllm_default',)",
  ],
  "swa_pinning_sweep": [
    "num_prefixes = (1, 2)",
    "prefix_len = 40",
    "num_blocks = 24",
    *_SMALL,
  ],
  "explain_mooncake": [
    "trace = 'experiments/traces/mooncake_conversation_trace.jsonl'",
    "limit = 6",
    "capacity_bytes = 2e9",
  ],
  "swa_pinning_scale": [
    "num_prefixes = (2,)",
    "prefix_len = 64",
    "suffix_len = 8",
    "output_len = 2",
    "kv_tokens = 4096",
  ],
  "vllm_pr30877": [
    "targets = ('sm80',)",
    "prompt_multiple = 2",
    "max_tokens = 2",
  ],
  "vllm_pr37898": [
    "configs = ('qwen3_5_0p8b',)",
    "targets = ('sm80',)",
    "arms = ('vllm_default',)",
    "system_repeats = 2",
    "num_letters = 2",
    "max_tokens = 2",
  ],
}


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _is_experiment(path: pathlib.Path) -> bool:
  return "run.run_experiment.experiment" in path.read_text()


def test_configs_exist():
  assert {p.stem for p in GIN_FILES if _is_experiment(p)} >= set(TINY)


@pytest.mark.parametrize("path", GIN_FILES, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_gin_file_parses(path):
  gin.add_config_file_search_path(str(CONFIGS))
  gin.parse_config_files_and_bindings([str(path)], [], finalize_config=False)
  if _is_experiment(path):
    assert gin.query_parameter("run.run_experiment.experiment") is not None


@pytest.mark.parametrize("path", [p for p in GIN_FILES if _is_experiment(p)], ids=lambda p: p.stem)
def test_experiment_smoke_runs_at_tiny_size(path, tmp_path):
  assert path.stem in TINY, f"add tiny bindings for {path.name} to TINY"
  fn = next(
    line.split("@", 1)[1].strip()
    for line in path.read_text().splitlines()
    if line.startswith("run.run_experiment.experiment")
  )
  binds = [f"{fn}.{b}" for b in TINY[path.stem]]
  results = run_lib.execute([str(path)], binds, str(tmp_path))
  assert (tmp_path / "config.gin").read_text().strip()
  saved = json.loads((tmp_path / "results.json").read_text())
  assert saved["gin_files"] == [str(path)]
  assert list(tmp_path.glob("*.png"))
  if path.stem in ("quickstart", "shared_prefix_divergence"):
    arms = saved["arms"]
    assert set(arms) == (
      {"off", "vllm_default", "vllm_align_dense", "adaptive"}
      if path.stem == "quickstart"
      else {"off", "vllm_default", "align_dense_no_junction"}
    )
    for a in arms.values():
      assert a["outputs_equal_to_off"] is True
      for k in ("cached_tokens", "prefill_tokens_computed", "wall_s"):
        assert k in a
    assert arms["off"]["cached_tokens"] == 0
    assert arms["vllm_default"]["cached_tokens"] > 0
  assert results["gin_bindings"] == binds
