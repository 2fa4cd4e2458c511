"""The serving benchmark's ideal TTFT (`experiments.bench_serving.ideal_ttft`)."""

import types

from experiments import bench_serving


def test_ideal_ttft_sums_the_tokens_of_the_steps_a_request_waits_through():
  out = lambda a, f: types.SimpleNamespace(arrival_step=a, first_token_step=f)  # noqa: E731
  steps = [100, 10, 10, 50]
  # r0 arrives before step 0, first token in step 0: 100; r1 waits steps 0..2: 120;
  # r2 arrives before step 2, first token in step 3: 60
  assert bench_serving.ideal_ttft([out(0, 0), out(0, 2), out(2, 3)], steps) == (100 + 120 + 60) / 3
