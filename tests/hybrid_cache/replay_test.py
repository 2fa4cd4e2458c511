"""Replay of the example scenarios (real vLLM 0.33 outputs) and the replay CLI."""

import glob
import json
import os
import subprocess
import sys

import pytest

from hybrid_cache.replay import replay as replay_lib
from hybrid_cache.replay import scenario as scenario_lib

SCEN_DIR = os.path.join(os.path.dirname(__file__), "scenarios")
SCENARIOS = sorted(
  f for f in glob.glob(os.path.join(SCEN_DIR, "*.json")) if not f.endswith(".expected.json")
)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _jax_available() -> bool:
  return replay_lib.default_backend() == "jax"


BACKENDS = [
  "reference",
  pytest.param(
    "jax",
    marks=pytest.mark.skipif(
      not _jax_available(), reason="hybrid_cache.manager.JaxCacheManager is not importable yet"
    ),
  ),
]


def test_examples_exist():
  assert len(SCENARIOS) >= 4


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", SCENARIOS, ids=os.path.basename)
def test_example_reproduces_expected(path, backend):
  out = replay_lib.replay_file(path, backend)
  with open(path[: -len(".json")] + ".expected.json") as f:
    expected = json.load(f)
  assert replay_lib.first_difference(expected, out) is None
  assert out["scenario"] == expected["scenario"]
  assert out["description"] == expected["description"]
  # layout fields are compared too: spot-check one explicitly
  for e, a in zip(expected["results"], out["results"]):
    if "block_ids" in e:
      assert e["block_ids"] == a["block_ids"]
    if "note" in e:
      assert e["note"] == a["note"]


def test_first_difference_reports_path():
  path = SCENARIOS[0]
  out = replay_lib.replay_file(path, "reference")
  with open(path[: -len(".json")] + ".expected.json") as f:
    expected = json.load(f)
  out["results"][1]["chunks"] = [999]
  assert replay_lib.first_difference(expected, out) == "results[1].chunks"


def test_cli_check_and_out_dir(tmp_path):
  path = SCENARIOS[0]
  cmd = [sys.executable, "-m", "hybrid_cache.replay", path, "--backend", "reference"]
  r = subprocess.run(cmd + ["--check"], capture_output=True, text=True, cwd=REPO)
  assert r.returncode == 0, r.stdout + r.stderr
  assert "PASS" in r.stdout
  assert "backend: reference" in r.stderr
  r = subprocess.run(
    cmd + ["--compact", "--out-dir", str(tmp_path)], capture_output=True, text=True, cwd=REPO
  )
  assert r.returncode == 0, r.stderr
  written = tmp_path / os.path.basename(path)
  text = written.read_text()
  assert text.count("\n") == 1  # compact: one line
  assert json.loads(text)["scenario"] == os.path.basename(path)[: -len(".json")]


def test_cli_check_fails_on_mismatch(tmp_path):
  src = SCENARIOS[0]
  dst = tmp_path / os.path.basename(src)
  with open(src) as f:
    dst.write_text(f.read())
  with open(src[: -len(".json")] + ".expected.json") as f:
    expected = json.load(f)
  expected["results"][0]["num_free_blocks"] += 1
  (tmp_path / (os.path.basename(src)[: -len(".json")] + ".expected.json")).write_text(
    json.dumps(expected)
  )
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "hybrid_cache.replay.replay",
      str(tmp_path),
      "--check",
      "--backend",
      "reference",
    ],
    capture_output=True,
    text=True,
    cwd=REPO,
  )
  assert r.returncode != 0
  assert "FAIL" in r.stdout and "results[0].num_free_blocks" in r.stdout


def test_prompt_forms():
  prompts = {"P": {"range": [0, 3]}, "Q": {"concat": ["P", [9], {"repeat": [7, 2]}]}}
  assert scenario_lib.resolve_prompt("Q", prompts) == [0, 1, 2, 9, 7, 7]
  with pytest.raises(ValueError, match="prompt name"):
    scenario_lib.resolve_prompt("nope", prompts)
  with pytest.raises(ValueError, match="refers to itself"):
    scenario_lib.resolve_prompt("A", {"A": {"concat": ["A"]}})
