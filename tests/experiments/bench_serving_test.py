"""The serving benchmark's ideal TTFT (`experiments.bench_serving.ideal_ttft`)."""

import types

from experiments import bench_serving


def test_ideal_ttft_sums_the_tokens_of_the_steps_a_request_waits_through():
  out = lambda a, f: types.SimpleNamespace(arrival_step=a, first_token_step=f)  # noqa: E731
  steps = [100, 10, 10, 50]
  # r0 arrives before step 0, first token in step 0: 100; r1 waits steps 0..2: 120;
  # r2 arrives before step 2, first token in step 3: 60
  assert bench_serving.ideal_ttft([out(0, 0), out(0, 2), out(2, 3)], steps) == (100 + 120 + 60) / 3


def test_adaptive_arm_gets_its_checkpoint_unit_and_serves_exactly(tmp_path):
  """Chat turns ending off the 128-token grid: 3 conversations x 2 turns, turn-major, one
  request at a time, a 100-token system prompt, 30-token user and assistant turns (turn 1
  prompts 130 tokens, turn 2 190). `vllm_default` keeps each prompt end floored to 128 (the
  junction at 100 floors to 0): the three turn 2 prompts hit 128, 384 in all. `adaptive`
  (recurrent blocks of 64) keeps each prompt end floored to 64 (128 here) and the branch point
  at 100 floored to 64 (left by the second conversation's turn 1): the third turn 1 hits 64 as
  well, 448 in all. Outputs equal the uncached run."""
  res = bench_serving.run(
    str(tmp_path),
    size="qwen35_like_mid",
    model_overrides={"num_layers": 4, "d_model": 128, "vocab_size": 256, "mlp_hidden": 256},
    workload="chat",
    arms=("off", "vllm_default", "adaptive"),
    num_conversations=3,
    turns=2,
    system_len=100,
    user_len=30,
    assistant_len=30,
    max_new_tokens=2,
    concurrency=1,
    block_size=128,
    checkpoint_unit=64,
    max_num_batched_tokens=256,
    repeats=1,
  )
  arms = res["arms"]
  assert all(a["outputs_equal_to_off"] for a in arms.values())
  assert arms["vllm_default"]["cached_tokens"] == 3 * 128
  assert arms["adaptive"]["cached_tokens"] == 64 + 3 * 128
