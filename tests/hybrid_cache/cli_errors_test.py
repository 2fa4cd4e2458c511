"""Bad input to `python -m hybrid_cache.replay` and `python -m hybrid_cache.sim`: exit status 2
and one clear line on stderr naming the file or field (never a traceback).

Mostly in process (`main(argv)` returns the exit status; argparse errors included), plus one
subprocess per CLI for the real entry point.
"""

import json
import os
import subprocess
import sys

import pytest

from hybrid_cache.factory import make_manager
from hybrid_cache.replay import replay as replay_lib
from hybrid_cache.replay import scenario as scenario_lib
from hybrid_cache.sim import cli as sim_cli
from hybrid_cache.sim import trace as trace_lib
from hybrid_cache.sim.cost_model import get_model
from hybrid_cache.sim.simulate import simulate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CFG = {"block_size": 4, "num_blocks": 32, "groups": [{"type": "full"}, {"type": "mamba"}]}


def _one_error_line(err: str, *needles: str) -> str:
  """The single problem line of `err` (the replay's backend notice aside); checks `needles`."""
  assert "Traceback" not in err, err
  lines = [x for x in err.splitlines() if x.strip() and not x.startswith("replay backend:")]
  assert len(lines) == 1, err
  for needle in needles:
    assert needle in lines[0], (needle, lines[0])
  return lines[0]


# ---------------------------------------------------------------------------------------------
# replay
# ---------------------------------------------------------------------------------------------


def _write(tmp_path, name, obj):
  p = tmp_path / name
  p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
  return str(p)


def _replay(capsys, *argv):
  rc = replay_lib.main([*argv, "--backend", "reference", "--compact"])
  out, err = capsys.readouterr()
  return rc, out, err


def test_replay_missing_file(tmp_path, capsys):
  path = str(tmp_path / "nope.json")
  rc, out, err = _replay(capsys, path)
  assert rc == 2 and out == ""
  _one_error_line(err, f"ERROR {path}:", "No such file or directory")


def test_replay_directory_given_as_a_file(tmp_path, capsys):
  (tmp_path / "sub.json").mkdir()  # a glob that matches a directory
  rc, _, err = _replay(capsys, str(tmp_path / "*.json"))
  assert rc == 2
  _one_error_line(err, "sub.json", "Is a directory")


def test_replay_unreadable_file(tmp_path, capsys, monkeypatch):
  path = _write(tmp_path, "a.json", {"config": _CFG, "actions": []})

  def denied(p):
    raise PermissionError(13, "Permission denied", p)

  monkeypatch.setattr(scenario_lib, "read_json", denied)  # root can read a chmod 000 file
  rc, _, err = _replay(capsys, path)
  assert rc == 2
  _one_error_line(err, f"ERROR {path}:", "Permission denied")


def test_replay_malformed_json_names_line_and_column(tmp_path, capsys):
  path = _write(tmp_path, "a.json", '{"config": {},\n  "actions": [,]}')
  rc, _, err = _replay(capsys, path)
  assert rc == 2
  _one_error_line(err, f"ERROR {path}:", "malformed JSON at line 2, column 15")


def test_replay_bad_config_names_the_field(tmp_path, capsys):
  path = _write(tmp_path, "a.json", {"config": {**_CFG, "num_blocks": -1}, "actions": []})
  rc, _, err = _replay(capsys, path)
  assert rc == 2
  _one_error_line(err, f"ERROR {path}:", "num_blocks")


@pytest.mark.parametrize(
  "scenario, needle",
  [
    ([1], "a scenario must be a JSON object"),
    ({"config": _CFG}, "scenario is missing 'actions'"),
    ({"config": _CFG, "actions": [{"op": "jump"}]}, "actions[0].op must be one of"),
    ({"config": _CFG, "actions": [], "name": 7}, "name must be a string"),
  ],
)
def test_replay_bad_scenario_structure(tmp_path, capsys, scenario, needle):
  path = _write(tmp_path, "a.json", scenario)
  rc, _, err = _replay(capsys, path)
  assert rc == 2
  line = _one_error_line(err, needle)
  assert line.count(path) == 1  # the path is not repeated


_PREFILL = {"op": "prefill", "req": "A"}


@pytest.mark.parametrize(
  "actions, needles",
  [
    ([{"op": "step", "req": "Z"}], ["actions[0].req", "active request", "'Z'"]),
    ([{"op": "free", "req": "Z"}], ["actions[0] (op 'free')", "'Z'"]),
    ([_PREFILL, {"op": "decode", "req": "A", "tokens": ["x"]}], ["actions[1].tokens", "'x'"]),
    ([_PREFILL, {"op": "decode", "req": "A", "tokens": [-5]}], ["actions[1]", ">= 0", "-5"]),
    ([{"op": "prefill", "req": "A", "chunk": "x"}], ["actions[0].chunk", ">= 1", "'x'"]),
    ([{"op": "admit", "req": ["A"]}], ["actions[0].req must be a string"]),
    ([{"op": "admit", "req": "A", "lora_name": [1]}], ["actions[0].lora_name", "string"]),
    ([{"op": "admit", "req": "B"}], ["actions[0].req", "prompt name must be one of ['A']"]),
    (
      [{"op": "schedule", "entries": [{"req": "A", "chunk": 0}]}],
      ["actions[0].entries[0].chunk", ">= 1"],
    ),
  ],
)
def test_replay_bad_action_names_the_action_and_field(tmp_path, capsys, actions, needles):
  sc = {"config": _CFG, "prompts": {"A": {"range": [0, 10]}}, "actions": actions}
  path = _write(tmp_path, "a.json", sc)
  rc, out, err = _replay(capsys, path)
  assert rc == 2 and out == ""
  _one_error_line(err, f"ERROR {path}:", *needles)


def test_replay_action_type_error_is_one_line_in_process():
  # A TypeError/KeyError inside the manager becomes a ValueError naming the action.
  class Boom(replay_lib.Replayer):
    def run_action(self, i, a):
      raise KeyError("x")

  sc = {"name": "s", "config": _CFG, "actions": [{"op": "state"}]}
  manager = make_manager(scenario_lib.config_of(sc), "reference")
  with pytest.raises(ValueError, match=r"^actions\[0\] \(op 'state'\): KeyError: 'x'$"):
    Boom(manager, sc).run()


def test_replay_check_bad_expected_is_2_and_mismatch_is_1(tmp_path, capsys):
  sc = {"config": _CFG, "prompts": {"A": [1, 2, 3]}, "actions": [{"op": "lookup", "req": "A"}]}
  path = _write(tmp_path, "a.json", sc)
  _write(tmp_path, "a.expected.json", '{"results": [')
  rc, _, err = _replay(capsys, path, "--check")
  assert rc == 2
  _one_error_line(err, "a.expected.json", "malformed JSON at line 1")
  _write(tmp_path, "a.expected.json", {"results": []})
  rc, out, err = _replay(capsys, path, "--check")
  assert rc == 1 and "FAIL" in out
  assert [x for x in err.splitlines() if not x.startswith("replay backend:")] == []


def test_replay_usage_error_is_one_line(capsys):
  assert replay_lib.main(["x.json", "--backend", "tpu"]) == 2
  _one_error_line(capsys.readouterr().err, "error: argument --backend", "'tpu'")


def test_replay_subprocess_bad_json(tmp_path):
  path = _write(tmp_path, "a.json", '{"config": {,}}')
  r = subprocess.run(
    [sys.executable, "-m", "hybrid_cache.replay", path, "--backend", "reference"],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=120,
  )
  assert r.returncode == 2 and r.stdout == ""
  _one_error_line(r.stderr, f"ERROR {path}:", "malformed JSON at line 1, column 13")


# ---------------------------------------------------------------------------------------------
# sim
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def trace_file(tmp_path):
  p = tmp_path / "t.jsonl"
  p.write_text(json.dumps({"input_tokens": [1, 2, 3], "output_tokens": [4]}) + "\n")
  return str(p)


def _sim(capsys, trace, **flags):
  args = {
    "trace": trace,
    "format": "marconi",
    "model": "marconi_7b",
    "capacity-bytes": "1e12",
    "policy": "oracle",
  }
  args.update(flags)
  argv = [x for k, v in args.items() if v is not None for x in (f"--{k}", v)]
  rc = sim_cli.main(argv)
  out, err = capsys.readouterr()
  return rc, out, err


@pytest.mark.parametrize(
  "flags, needles",
  [
    ({"block-size": "0"}, ["--block-size", "integer >= 1", "'0'"]),
    ({"capacity-bytes": "inf"}, ["--capacity-bytes", "finite number > 0", "'inf'"]),
    ({"capacity-bytes": "-1"}, ["--capacity-bytes", "finite number > 0"]),
    ({"limit": "0"}, ["--limit", "integer >= 1"]),
    ({"max-input": "0"}, ["--max-input", "integer >= 1"]),
    ({"seed": "-1"}, ["--seed", "integer >= 0"]),
    ({"token-budget": "0"}, ["--token-budget", "integer >= 1"]),
    ({"alpha": "101"}, ["alpha must be 'tuned' or a number in [0, 100]", "'101'"]),
    ({"backend": "tpu"}, ["--backend", "backend must be one of", "'tpu'"]),
    ({"retention": "-3"}, ["retention must be"]),
    ({"format": "csv"}, ["--format", "invalid choice: 'csv'"]),
    ({"model": "gpt9"}, ["model must be one of", "'gpt9'"]),
    ({"policy": "lru_magic"}, ["policy must be one of", "'lru_magic'"]),
    ({"trace": "nope", "format": "synthetic"}, ["synthetic kind must be one of", "'nope'"]),
    ({"trace": None}, ["required", "--trace"]),
  ],
)
def test_sim_bad_flag(capsys, trace_file, flags, needles):
  flags = {"trace": trace_file, **flags}
  rc, out, err = _sim(capsys, **flags)
  assert rc == 2 and out == ""
  _one_error_line(err, "error:", *needles)


def test_sim_block_size_zero_is_not_turned_into_one(trace_file):
  trace = trace_lib.load(trace_file, "marconi")
  with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
    simulate(trace, get_model("marconi_7b"), 1e12, "oracle", 0)


def test_sim_missing_and_directory_trace(tmp_path, capsys):
  rc, _, err = _sim(capsys, str(tmp_path / "nope.jsonl"))
  assert rc == 2
  _one_error_line(err, "trace file", "nope.jsonl", "does not exist")
  rc, _, err = _sim(capsys, str(tmp_path))
  assert rc == 2
  _one_error_line(err, "trace file", "is a directory")


def test_sim_unreadable_trace(capsys, trace_file, monkeypatch):
  def denied(path, fmt, **kw):
    raise PermissionError(13, "Permission denied", path)

  monkeypatch.setattr(trace_lib, "load", denied)  # root can read a chmod 000 file
  rc, _, err = _sim(capsys, trace_file)
  assert rc == 2
  _one_error_line(err, "trace file", "t.jsonl", "Permission denied")


@pytest.mark.parametrize(
  "content, needles",
  [
    (b'{"input_tokens": [1, 2]}\n{"input_tokens": [1,\n', ["bad.jsonl:2:", "malformed JSON"]),
    (b'{"input_tokens": [1], "turn_id": [1]}\n', ["bad.jsonl:1:", "'turn_id'", "integer"]),
    (b'{"input_tokens": [99999999999999999999]}\n', ["bad.jsonl:1:", "< 2**63"]),
    (b"\xff\xfe{}\n", ["bad.jsonl", "not UTF-8"]),
  ],
)
def test_sim_malformed_trace(tmp_path, capsys, content, needles):
  p = tmp_path / "bad.jsonl"
  p.write_bytes(content)
  rc, out, err = _sim(capsys, str(p))
  assert rc == 2 and out == ""
  _one_error_line(err, "error:", *needles)


def test_sim_dump_into_a_missing_directory(tmp_path, capsys, trace_file):
  rc, _, err = _sim(capsys, trace_file, dump=str(tmp_path / "no" / "d.json"))
  assert rc == 2
  _one_error_line(err, "--dump", "does not exist")


def test_sim_subprocess_block_size_zero(trace_file):
  argv = ["--trace", trace_file, "--format", "marconi", "--model", "marconi_7b"]
  argv += ["--capacity-bytes", "1e12", "--policy", "oracle", "--block-size", "0"]
  r = subprocess.run(
    [sys.executable, "-m", "hybrid_cache.sim", *argv],
    capture_output=True,
    text=True,
    cwd=REPO,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
    timeout=120,
  )
  assert r.returncode == 2 and r.stdout == ""
  _one_error_line(
    r.stderr, "error: argument --block-size: block size must be an integer >= 1 or 'vllm', got '0'"
  )
