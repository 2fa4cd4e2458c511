"""Concurrent replay (`--replay concurrent`): arrivals, step budget, lookup at admission."""

import json

import pytest

from hybrid_cache.sim import checkpoint_policies as cp
from hybrid_cache.sim import checkpoint_replay
from hybrid_cache.sim import eviction_weightings as weightings
from hybrid_cache.sim.cli import main
from hybrid_cache.sim.concurrent import replay_concurrent
from hybrid_cache.sim.synthetic import agentic
from hybrid_cache.sim.testing import TINY
from hybrid_cache.sim.trace import Trace
from hybrid_cache.sim.trace import token_request
from hybrid_cache.sim.trace import write_marconi

A = list(range(1, 17))  # 16 tokens = 4 units of 4
COPY_MS_PER_BYTE = 1 / (checkpoint_replay.STATE_COPY_GB_PER_S * 1e6)


def _step(tokens):
  return 17.81 + 0.05296 * tokens  # TINY keeps Marconi's TTFT line


def _two(ts1):
  """r0: A -> 5 output tokens (4 decode steps) at t = 0; r1: A + 5 tokens at ts1 seconds."""
  return Trace(
    (
      token_request(A, [50, 51, 52, 53, 54], ts=0.0),
      token_request(A + [60, 61, 62, 63, 64], [70], ts=ts1),
    )
  )


def _run(trace, cap=10_000, **kw):
  return cp.run_checkpoint(
    trace, TINY, cap, "ckpt_dense", unit=4, block_size=4, replay="concurrent", **kw
  )


def test_follow_up_before_predecessor_finishes_misses():
  triples, extra = _run(_two(0.001))
  # r1 arrives at 1 ms, during r0's prefill step; it is admitted at the next step, while r0
  # still decodes (its insertion comes at its finish): no hit
  assert [t[2] for t in triples] == [0, 0]
  t1 = _step(16)
  # step 2: r0's first decode token + r1's whole prompt (21 tokens)
  assert extra["ttft_mean_ms"] == pytest.approx((t1 + (t1 + _step(22) - 1.0)) / 2)
  assert extra["queue_mean_ms"] == pytest.approx((0 + t1 - 1.0) / 2)
  assert extra["replay"] == "concurrent" and extra["max_running_seen"] == 2


def test_follow_up_after_predecessor_finishes_hits():
  triples, extra = _run(_two(1.0))
  # r0 computed 16 + 4 tokens = 5 units, all checkpointed; r1 (cap 5 units) shares 4 of them
  assert [t[2] for t in triples] == [0, 16]
  restore = TINY.state_bytes * COPY_MS_PER_BYTE
  assert extra["ttft_mean_ms"] == pytest.approx((_step(16) + _step(21 - 16) + restore) / 2)
  assert extra["queue_mean_ms"] == 0.0
  # r0: 5 prefill/decode steps; r1: 1 step (one output token: nothing to decode)
  assert extra["steps"] == 6
  assert extra["checkpoint_copy_bytes"] == (5 + 1 + 1) * TINY.state_bytes  # 5 + r1's 1 + restore
  # offered load: the no-cache prefill time of both prompts over the 1 s span of arrivals
  assert extra["offered_load"] == pytest.approx(0.05296 * (16 + 21) / 1000.0)


def test_arrival_scale_stretches_the_trace():
  # r1 at 1 ms x 1000 = 1 s: r0 has finished, r1 hits as in the test above
  triples, extra = _run(_two(0.001), arrival_scale=1000.0)
  assert [t[2] for t in triples] == [0, 16] and extra["arrival_scale"] == 1000.0
  with pytest.raises(ValueError, match="arrival_scale must be a finite number > 0"):
    _run(_two(0.001), arrival_scale=0.0)


def test_chunked_prefill_and_budget_shared_fcfs():
  trace = Trace((token_request(A, [], ts=0.0), token_request(A[:8], [], ts=0.0)))
  _, extra = _run(trace, step_tokens=10)
  # step 1: r0 10 tokens (budget used up, r1 waits); step 2: r0 6 + r1 8 = 14 > 10 -> r1 gets 4
  # of the budget (admitted in step 2), step 3: r1's last 4
  s1, s2, s3 = _step(10), _step(10), _step(4)
  assert extra["ttft_mean_ms"] == pytest.approx((s1 + s2 + (s1 + s2 + s3)) / 2)
  assert extra["queue_mean_ms"] == pytest.approx(s1 / 2)
  assert extra["steps"] == 3


def test_admission_waits_for_memory():
  b = list(range(100, 140))
  trace = Trace((token_request(A + A + b[:8], [], ts=0.0), token_request(b, [], ts=0.0)))
  # each works on 10 pages of 16 B + one 34 B state = 194 B; two do not fit in 300 B
  triples, extra = _run(trace, cap=300)
  assert extra["refused_admissions"] == 1 and extra["max_running_seen"] == 1
  written = 10 * TINY.state_bytes * COPY_MS_PER_BYTE  # r0's 10 checkpoints, after its step
  assert extra["queue_mean_ms"] == pytest.approx((_step(40) + written) / 2)
  assert extra["ttft_mean_ms"] == pytest.approx((_step(40) + _step(40) * 2 + written) / 2)
  assert [t[2] for t in triples] == [0, 0]


def test_decode_only_jump_matches_step_by_step():
  """A long decode with a late arrival: the jump lands the arrival on the same step."""
  trace = Trace(
    (token_request(A, list(range(200, 300)), ts=0.0), token_request(A + [7], [], ts=0.5))
  )
  calls = []

  def admit(i):
    calls.append(i)
    return 0, 0

  res = replay_concurrent(trace, TINY, admit, lambda i: 0, lambda b: 0.0)
  # by hand: t1 = step(16); then 1-token steps of step(1) until t >= 500 ms
  t1 = _step(16)
  k = -(-(500 - t1) // _step(1))
  admit_at = t1 + k * _step(1)
  assert res.queue_ms[1] == pytest.approx(admit_at - 500)
  assert res.ttft_ms[1] == pytest.approx(admit_at + _step(18) - 500)
  assert res.steps == 1 + 99  # r1 rides along with one of r0's 99 decode steps
  assert calls == [0, 1]


@pytest.mark.parametrize("policy", ("ckpt_adaptive", "ckpt_dense", "ckpt_sparse:3", "ckpt_branch"))
def test_concurrent_online_prefix_of_a_cut_trace(policy, tmp_path, monkeypatch):
  monkeypatch.setattr(weightings, "RETUNE_EVERY", 4)
  trace = agentic(seed=3, num_sessions=6, sys_prompt_len=300, min_turns=3, max_turns=6)
  trace = trace.head(60)
  path = tmp_path / "t.jsonl"
  write_marconi(trace, path)
  dumps = []
  for limit in (None, 37, 11):
    out = tmp_path / f"d{limit}.json"
    argv = ["--trace", str(path), "--format", "marconi", "--model", "marconi_7b"]
    argv += ["--capacity-bytes", "3e9", "--policy", policy, "--block-size", "128"]
    argv += ["--replay", "concurrent", "--step-tokens", "2048", "--no-oracle", "--dump", str(out)]
    if limit is not None:
      argv += ["--limit", str(limit)]
    assert main(argv) == 0
    dumps.append(json.loads(out.read_text()))
  full = dumps[0]
  assert any(t[2] for t in full)
  assert dumps[1] == full[:37]
  assert dumps[2] == full[:11]


def test_cli_concurrent_fields_and_refusals(tmp_path, capsys):
  trace = agentic(seed=1, num_sessions=4, sys_prompt_len=200, min_turns=2, max_turns=4)
  path = tmp_path / "t.jsonl"
  write_marconi(trace, path)
  base = ["--trace", str(path), "--format", "marconi", "--model", "marconi_7b"]
  base += ["--capacity-bytes", "3e9"]
  assert main(base + ["--policy", "ckpt_adaptive", "--replay", "concurrent"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert out["replay"] == "concurrent" and out["step_tokens"] == 8192
  assert out["max_running"] == 1024
  assert out["ttft_p95_ms"] >= out["ttft_p50_ms"] > 0 and out["steps"] > 0
  assert "ttft_mean_ms_with_copies" not in out
  for argv, needle in (
    (
      ["--policy", "vllm_default", "--replay", "concurrent"],
      "replay 'concurrent' supports the checkpoint",
    ),
    (["--policy", "ckpt_adaptive", "--step-tokens", "64"], "apply to replay 'concurrent' only"),
    (["--policy", "ckpt_adaptive", "--arrival-scale", "2"], "apply to replay 'concurrent' only"),
    (
      ["--policy", "ckpt_adaptive", "--replay", "concurrent", "--arrival-scale", "0"],
      "--arrival-scale",
    ),
    (["--policy", "ckpt_adaptive", "--replay", "parallel"], "--replay"),
    (
      ["--policy", "ckpt_adaptive", "--replay", "concurrent", "--step-tokens", "0"],
      "--step-tokens",
    ),
  ):
    assert main(base + argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
