"""`fraction_of_oracle_own`: the infinite cache at each policy's own hit granularity."""

import json

import numpy as np
import pytest

from hybrid_cache.sim.cli import main
from hybrid_cache.sim.oracle import oracle_matched
from hybrid_cache.sim.oracle import oracle_reused
from hybrid_cache.sim.oracle import own_oracle_reused
from hybrid_cache.sim.simulate import hit_granularity
from hybrid_cache.sim.testing import trace_of
from hybrid_cache.sim.trace import write_marconi

A = list(range(1, 17))  # 16 tokens
# r0: A -> 50; r1: A + 5 new tokens (shares A + nothing of r0's output); r2: A again
TRACE = trace_of((A, [50]), (A + [60, 61, 62, 63, 64], [70]), (A, []))


def test_own_oracle_by_hand():
  m = oracle_matched(TRACE)
  assert m.tolist() == [0, 16, 16]
  assert oracle_reused(TRACE, 8).tolist() == [0, 16, 16]
  # unit 4, capped at input - 1: r1 min(16, 20) = 16, r2 min(16, 15) = 15 -> 12
  assert own_oracle_reused(m, TRACE, 4, False).tolist() == [0, 16, 12]
  assert own_oracle_reused(m, TRACE, 2, False).tolist() == [0, 16, 14]
  assert own_oracle_reused(m, TRACE, 5, True).tolist() == [0, 15, 15]
  with pytest.raises(ValueError, match="granularity must be >= 1"):
    own_oracle_reused(m, TRACE, 0, False)


def test_granularity_per_policy_kind():
  assert hit_granularity("ckpt", 512, None, 64) == {"hit_granularity": 64, "hit_full_input": False}
  assert hit_granularity("core", 512, {"hash_block_size": 64}, 64)["hit_granularity"] == 64
  assert hit_granularity("core", 512, {}, 64) == {"hit_granularity": 512, "hit_full_input": False}
  assert hit_granularity("marconi", 1, None, 64) == {"hit_granularity": 1, "hit_full_input": True}


def _run(tmp_path, capsys, *extra):
  path = tmp_path / "t.jsonl"
  write_marconi(TRACE, path)
  dump = tmp_path / "d.json"
  argv = ["--trace", str(path), "--format", "marconi", "--model", "marconi_7b"]
  argv += ["--capacity-bytes", "1e11", "--dump", str(dump), *extra]
  assert main(argv) == 0
  return json.loads(capsys.readouterr().out), json.loads(dump.read_text())


def test_cli_checkpoint_policy_fraction_own(tmp_path, capsys):
  out, dump = _run(
    tmp_path, capsys, "--policy", "ckpt_dense", "--block-size", "8", "--checkpoint-unit", "4"
  )
  # a state every 4 tokens of r0's 16: r1 hits 16, r2 (cap 15 tokens) hits 12
  assert [t[2] for t in dump] == [0, 16, 12]
  assert out["hit_granularity"] == 4
  assert out["oracle_tokens_reused"] == 32 and out["fraction_of_oracle"] == pytest.approx(28 / 32)
  assert out["oracle_own_tokens_reused"] == 28 and out["fraction_of_oracle_own"] == 1.0


def test_cli_core_policy_fraction_own(tmp_path, capsys):
  out, dump = _run(
    tmp_path,
    capsys,
    "--policy",
    "vllm_align_dense",
    "--block-size",
    "4",
    "--hash-block-size",
    "2",
    "--backend",
    "reference",
  )
  reused = np.array([t[2] for t in dump])
  assert out["hit_granularity"] == 2 and not out["hit_full_input"]
  assert out["oracle_own_tokens_reused"] == 0 + 16 + 14
  # dense retention + partial hits at the hash block: r2 (cap 15) hits 14, the own oracle
  assert reused.tolist() == [0, 16, 14] and out["fraction_of_oracle_own"] == 1.0
  assert out["fraction_of_oracle"] == pytest.approx(30 / 32)  # oracle at B = 4: 16 + 16
