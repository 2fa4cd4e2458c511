"""Bad input to `python -m experiments.run`: exit status 2 and one `error:` line naming the gin
file or binding (never a traceback).

In process: the flags are parsed as `app.run` parses them, then `main(argv)` returns the exit
status. Two subprocess runs check the real entry point (flag errors included).
"""

from __future__ import annotations

import os
import subprocess
import sys

import gin
import pytest
from absl import flags
from absl.testing import flagsaver

from experiments import run as run_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICKSTART = "configs/experiments/quickstart.gin"
HEADER = "from __gin__ import dynamic_registration\nfrom experiments import run\n"


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _main(*args: str) -> int:
  was_parsed = flags.FLAGS.is_parsed()
  with flagsaver.flagsaver():
    try:
      return run_lib.main(flags.FLAGS(["run", *args]))
    finally:
      if not was_parsed:
        flags.FLAGS.unparse_flags()


def _one_error_line(err: str, *needles: str) -> str:
  assert "Traceback" not in err, err
  lines = [x for x in err.splitlines() if x.startswith("error:")]
  assert len(lines) == 1, err
  for needle in needles:
    assert needle in lines[0], (needle, lines[0])
  return lines[0]


def _gin(tmp_path, text: str) -> str:
  p = tmp_path / "bad.gin"
  p.write_text(HEADER + text)
  return str(p)


def test_missing_gin_file_flag(capsys):
  assert _main() == 2
  _one_error_line(capsys.readouterr().err, "--gin_file is required")


def test_nonexistent_gin_file(tmp_path, capsys):
  path = str(tmp_path / "nope.gin")
  assert _main(f"--gin_file={path}") == 2
  _one_error_line(capsys.readouterr().err, f"--gin_file {path!r} does not exist")


def test_directory_as_gin_file(tmp_path, capsys):
  assert _main(f"--gin_file={tmp_path}") == 2
  _one_error_line(capsys.readouterr().err, "is a directory")


def test_malformed_gin_file_names_file_and_line(tmp_path, capsys):
  path = _gin(tmp_path, "run.run_experiment.seed = (1,\nrun.run_experiment.seed = 2\n")
  assert _main(f"--gin_file={path}") == 2
  _one_error_line(capsys.readouterr().err, f"{path}:4:", "run.run_experiment.seed = 2")


def test_unknown_parameter_in_gin_file(tmp_path, capsys):
  path = _gin(tmp_path, "run.run_experiment.sede = 3\n")
  assert _main(f"--gin_file={path}") == 2
  _one_error_line(capsys.readouterr().err, f"{path}:3:", "parameter named 'sede'")


def test_unknown_configurable_in_gin_file(tmp_path, capsys):
  path = _gin(tmp_path, "run.run_experiment.experiment = @nowhere.run\n")
  assert _main(f"--gin_file={path}") == 2
  _one_error_line(capsys.readouterr().err, f"{path}:3:", "nowhere.run")


def test_no_experiment_bound(tmp_path, capsys):
  path = _gin(tmp_path, "run.run_experiment.seed = 3\n")
  assert _main(f"--gin_file={path}") == 2
  _one_error_line(capsys.readouterr().err, "no experiment", "run.run_experiment.experiment")


@pytest.mark.parametrize(
  "binding, needles",
  [
    ("zzz.run.nope = 3", ["--gin_bindings 'zzz.run.nope = 3'", "No configurable matching"]),
    ("quickstart.run.num_prompts = (1,", ["--gin_bindings", "EOF in multi-line statement"]),
    ("quickstart.run.num_prompts =", ["--gin_bindings", "Unable to parse value"]),
    ("quickstart.run.nope = 3", ["quickstart.run:", "unknown parameter(s) ['nope']"]),
    ("quickstart.run.num_prompts = 0", ["quickstart.run:", "num_prompts", ">= 1, got 0"]),
    ("quickstart.run.prefix_len = -5", ["quickstart.run:", "prefix_len", ">= 0, got -5"]),
  ],
)
def test_bad_binding(tmp_path, capsys, binding, needles):
  rc = _main(f"--gin_file={QUICKSTART}", f"--gin_bindings={binding}", f"--workdir={tmp_path}")
  assert rc == 2
  _one_error_line(capsys.readouterr().err, *needles)


def test_unexpected_argument(capsys):
  assert _main(f"--gin_file={QUICKSTART}", "extra") == 2
  _one_error_line(capsys.readouterr().err, "unexpected arguments ['extra']")


@pytest.mark.parametrize(
  "arg, needle",
  [("--gin_file=nope.gin", "--gin_file 'nope.gin' does not exist"), ("--gin_fil=x", "gin_fil")],
)
def test_subprocess_one_line(arg, needle):
  r = subprocess.run(
    [sys.executable, "-m", "experiments.run", arg],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=120,
  )
  assert r.returncode == 2 and r.stdout == ""
  assert r.stderr.count("\n") == 1 and r.stderr.startswith("error:"), r.stderr
  assert needle in r.stderr


def test_subprocess_unknown_binding_prints_no_config():
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.run",
      f"--gin_file={QUICKSTART}",
      "--gin_bindings=quickstart.run.no_such_param = 3",
      "--workdir=/tmp/hybrid_cache_run_errors_test",
    ],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=120,
  )
  assert r.returncode == 2 and r.stdout == ""
  errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "no_such_param" in errors[0], r.stderr
  assert "Parameters for" not in r.stderr and "quickstart.run.prefix_len" not in r.stderr
