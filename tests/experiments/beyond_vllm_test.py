"""experiments.beyond_vllm: records per (seed, capacity), ratios, nothing over the bound."""

import pytest

from experiments import beyond_vllm

PARAMS = {"num_sessions": 4, "sys_prompt_len": 300, "obs_mean": 60.0, "max_turns": 6}


def test_compare_records_and_ratios():
  recs = beyond_vllm.compare(
    "agentic",
    "synthetic",
    capacities=(1.5e9, 3e9),
    seeds=(0, 1),
    block_size=64,
    bound_iterations=30,
    params=PARAMS,
    backend="reference",
  )
  assert [(r["seed"], r["capacity_bytes"]) for r in recs] == [
    (0, 1.5e9),
    (0, 3e9),
    (1, 1.5e9),
    (1, 3e9),
  ]
  for r in recs:
    rows = r["rows"]
    assert set(rows) == set(beyond_vllm.DEFAULT_POLICIES)
    vbest = max(rows["vllm_default"]["flops_saved"], rows["vllm_partial"]["flops_saved"])
    assert r["vllm_best_flops"] == vbest
    bound = rows["offline_bound"]["flops_saved"]
    for p in ("vllm_default", "vllm_partial", "ckpt_adaptive"):
      assert rows[p]["flops_saved"] <= bound
    assert rows["offline_bound"]["clairvoyant_flops_saved"] <= bound
    assert 0.0 <= r["vllm_default_of_token_oracle"] <= 1.0
    if vbest:
      assert r["ckpt_adaptive_over_vllm"] == rows["ckpt_adaptive"]["flops_saved"] / vbest
    assert r["ckpt_adaptive_of_bound"] == rows["ckpt_adaptive"]["flops_saved"] / bound
    assert "adaptive_over_vllm" not in r  # the core's `adaptive` did not run


def test_core_fine_keys_row_stays_under_the_bound():
  """`core_fine_keys` (the core's own states at multiples of U = 64 beside KV blocks of 128,
  `CacheConfig.fine_keys`) hits at multiples of 64, so the bound at unit 64 covers it."""
  recs = beyond_vllm.compare(
    "agentic",
    "synthetic",
    capacities=(3e9,),
    seeds=(0,),
    block_size=128,
    policies=("vllm_partial", "core_fine_keys", "offline_bound"),
    bound_iterations=30,
    params=PARAMS,
    backend="reference",
  )
  rows = recs[0]["rows"]
  assert 0 < rows["core_fine_keys"]["flops_saved"] <= rows["offline_bound"]["flops_saved"]


@pytest.mark.parametrize(
  ("argv", "needle"),
  [
    (["--trace", "missing.jsonl", "--format", "mooncake"], "trace file 'missing.jsonl' does not"),
    (["--trace", "agentic", "--format", "synthetic", "--capacities", "-1"], "capacity_bytes"),
    (["--trace", "agentic", "--format", "bogus"], "argument --format"),
  ],
)
def test_cli_bad_input_is_one_line(argv, needle, capsys):
  if "--capacities" not in argv:
    argv = argv + ["--capacities", "1e9"]
  assert beyond_vllm.main(argv + ["--limit", "4"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and needle in err and err.count("\n") == 1
