"""`python -m hybrid_cache.sim` as a subprocess: summary, dump, and clean errors."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MOONCAKE = str(
  pathlib.Path(__file__).resolve().parents[3]
  / "experiments"
  / "traces"
  / "mooncake_conversation_trace.jsonl"
)


def _run(*args):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  return subprocess.run(
    [sys.executable, "-m", "hybrid_cache.sim", *args],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=120,
  )


def _marconi_file(tmp_path):
  rows = [
    {"input_tokens": [1, 2, 3], "output_tokens": [4]},
    {"input_tokens": [1, 2, 3, 4, 5], "output_tokens": [6]},
    {"input_tokens": [1, 2, 9], "output_tokens": []},
    {"input_tokens": [1, 2, 7], "output_tokens": []},
  ]
  p = tmp_path / "t.jsonl"
  p.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return p


def test_summary_and_dump(tmp_path):
  dump = tmp_path / "d.json"
  r = _run(
    "--trace",
    str(_marconi_file(tmp_path)),
    "--format",
    "marconi",
    "--model",
    "marconi_7b",
    "--capacity-bytes",
    "1e12",
    "--policy",
    "marconi_compat_sglang",
    "--dump",
    str(dump),
  )
  assert r.returncode == 0, r.stderr
  s = json.loads(r.stdout)
  assert s["requests"] == 4 and s["input_tokens"] == 14
  assert s["token_hit_rate"] == pytest.approx(6 / 14) and s["request_hit_rate"] == 0.5
  assert s["flops_saved"] > 0 and s["wall_s"] >= 0 and s["oracle_tokens_reused"] == 8
  assert json.loads(dump.read_text()) == [[0, 3, 0], [1, 5, 4], [0, 3, 0], [1, 3, 2]]


def test_mooncake_and_synthetic(tmp_path):
  r = _run(
    "--trace",
    MOONCAKE,
    "--format",
    "mooncake",
    "--model",
    "marconi_7b",
    "--capacity-bytes",
    "2e10",
    "--policy",
    "marconi_compat_static:1.0",
    "--limit",
    "50",
  )
  assert r.returncode == 0, r.stderr
  assert json.loads(r.stdout)["requests"] == 50
  r = _run(
    "--trace",
    "self_consistency",
    "--format",
    "synthetic",
    "--model",
    "qwen3_5_9b",
    "--capacity-bytes",
    "1e11",
    "--policy",
    "oracle",
    "--block-size",
    "16",
  )
  assert r.returncode == 0, r.stderr
  assert json.loads(r.stdout)["fraction_of_oracle"] == 1.0


@pytest.mark.parametrize(
  "args, needle",
  [
    (["--policy", "lru_magic"], "policy must be one of"),
    (["--policy", "marconi_compat_static:x"], "alpha"),
    (["--model", "gpt9"], "model must be one of"),
    (["--capacity-bytes", "1e6"], "capacity_bytes must be >="),
    (["--block-size", "16"], "block_size must be 1"),
  ],
)
def test_bad_input_clean_error(tmp_path, args, needle):
  dump = tmp_path / "d.json"
  base = {
    "--trace": str(_marconi_file(tmp_path)),
    "--format": "marconi",
    "--model": "marconi_7b",
    "--capacity-bytes": "1e12",
    "--policy": "marconi_compat",
  }
  for k, v in zip(args[::2], args[1::2]):
    base[k] = v
  argv = [x for kv in base.items() for x in kv] + ["--dump", str(dump)]
  r = _run(*argv)
  assert r.returncode == 2 and needle in r.stderr and r.stdout == ""
  assert not dump.exists() and os.listdir(tmp_path) == ["t.jsonl"]


def test_malformed_trace_line(tmp_path):
  p = tmp_path / "bad.jsonl"
  p.write_text('{"input_tokens": [1], "output_tokens": []}\n{"input_tokens": [1,\n')
  r = _run(
    "--trace",
    str(p),
    "--format",
    "marconi",
    "--model",
    "marconi_7b",
    "--capacity-bytes",
    "1e12",
    "--policy",
    "marconi_compat",
  )
  assert r.returncode == 2 and "bad.jsonl:2:" in r.stderr
