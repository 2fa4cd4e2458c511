"""In-process bad-input checks of the CLI: atomic --dump, missing optional extra, a core
replay that cannot make progress (nothing written)."""

import json
import os
import sys

import pytest

from hybrid_cache.sim import cli


def test_atomic_write_leaves_nothing_on_failure(tmp_path, monkeypatch):
  target = tmp_path / "d.json"
  target.write_text("old")

  def boom(src, dst):
    raise OSError("disk full")

  monkeypatch.setattr(os, "replace", boom)
  with pytest.raises(OSError, match="disk full"):
    cli._atomic_write(str(target), "new")
  assert target.read_text() == "old" and os.listdir(tmp_path) == ["d.json"]


def test_sharegpt_without_the_extra_is_a_clean_error(tmp_path, monkeypatch, capsys):
  monkeypatch.setitem(sys.modules, "sentencepiece", None)
  dump = tmp_path / "d.json"
  argv = ["--trace", "default", "--format", "sharegpt", "--model", "marconi_7b"]
  argv += ["--capacity-bytes", "1e10", "--policy", "oracle", "--dump", str(dump)]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert "hybrid-cache[sharegpt]" in err and "sentencepiece" in err
  assert not dump.exists()


def test_sharegpt_seed_picks_a_disjoint_session_set(monkeypatch, capsys):
  """--seed k with --format sharegpt loads the k-th set of 100 sessions (the experiments'
  seeds, `experiments.beyond_vllm.load`); the loader's own error reaches the user."""
  from hybrid_cache.sim import sharegpt

  seen = []

  def fake(path=None, *, first_session=0, **kw):
    seen.append((path, first_session))
    raise ValueError(f"no conversation is left after first_session={first_session}")

  monkeypatch.setattr(sharegpt, "load_sharegpt", fake)
  argv = ["--trace", "default", "--format", "sharegpt", "--model", "marconi_7b"]
  argv += ["--capacity-bytes", "1e10", "--policy", "oracle", "--seed", "2"]
  assert cli.main(argv) == 2
  assert seen == [(None, 200)]
  assert "first_session=200" in capsys.readouterr().err


def test_core_replay_that_cannot_progress_writes_nothing(tmp_path, monkeypatch, capsys):
  from hybrid_cache.sim import core_sim

  p = tmp_path / "t.jsonl"
  rows = [{"input_tokens": list(range(1, 40)), "output_tokens": [7, 8]} for _ in range(3)]
  p.write_text("".join(json.dumps(r) + "\n" for r in rows))

  def fail(trace, config, backend="jax", **kw):
    raise ValueError("request 1 made no progress (allocation failed); capacity too small")

  monkeypatch.setattr(core_sim, "replay", fail)
  dump = tmp_path / "d.json"
  argv = ["--trace", str(p), "--format", "marconi", "--model", "marconi_7b"]
  argv += ["--capacity-bytes", "1e12", "--policy", "vllm_default", "--block-size", "8"]
  argv += ["--dump", str(dump)]
  assert cli.main(argv) == 2
  assert "request 1 made no progress" in capsys.readouterr().err
  assert sorted(os.listdir(tmp_path)) == ["t.jsonl"]
