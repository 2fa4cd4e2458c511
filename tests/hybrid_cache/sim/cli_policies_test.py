"""CLI runs of marconi_compat_vllm and the core-backed policies (subprocess, small traces)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MOONCAKE = os.path.join(ROOT, "experiments", "traces", "mooncake_conversation_trace.jsonl")


def _run(*args):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  return subprocess.run(
    [sys.executable, "-m", "hybrid_cache.sim", *args],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=300,
  )


def _base(policy, cap="1e11", limit="8"):
  return [
    "--trace",
    MOONCAKE,
    "--format",
    "mooncake",
    "--model",
    "marconi_7b",
    "--capacity-bytes",
    cap,
    "--policy",
    policy,
    "--limit",
    limit,
  ]


def test_vllm_plus_runs_at_block_32(tmp_path):
  dump = tmp_path / "d.json"
  r = _run(*_base("marconi_compat_vllm"), "--dump", str(dump))
  assert r.returncode == 0, r.stderr
  s = json.loads(r.stdout)
  assert s["block_size"] == 32 and s["states_admitted"] > 0
  # rows 1-7 share row 0's first 512-token block (16 blocks of 32)
  assert [t[2] for t in json.loads(dump.read_text())] == [0] + [512] * 7
  r = _run(*_base("marconi_compat_vllm"), "--block-size", "16")
  assert r.returncode == 2 and "block_size must be 32" in r.stderr


def test_core_policy_reference_backend(tmp_path):
  dump = tmp_path / "d.json"
  r = _run(
    *_base("vllm_align_dense"),
    "--block-size",
    "512",
    "--backend",
    "reference",
    "--dump",
    str(dump),
  )
  assert r.returncode == 0, r.stderr
  s = json.loads(r.stdout)
  assert s["backend"] == "reference" and s["page_bytes"] == 512 * 65536
  assert s["marconi_junction"] and s["retention_interval"] is None
  # row 1 records the junction at 512 and caches the state there: rows 2-7 reuse block 0
  assert [t[2] for t in json.loads(dump.read_text())] == [0, 0] + [512] * 6
  r = _run(
    *_base("vllm_default"), "--block-size", "512", "--backend", "reference", "--retention", "1024"
  )
  assert r.returncode == 0, r.stderr
  assert json.loads(r.stdout)["retention_interval"] == 1024


@pytest.mark.parametrize(
  "args, needle",
  [
    (["--backend", "tpu"], "backend must be one of"),
    (["--retention", "-3"], "retention must be"),
    (["--capacity-bytes", "1e9"], "capacity_bytes must be >="),
    (["--policy", "flop_aware", "--alpha", "tuned"], "alpha 'tuned' needs backend 'jax'"),
  ],
)
def test_core_bad_input(args, needle):
  argv = _base("vllm_default") + ["--block-size", "512", "--backend", "reference"]
  for k, v in zip(args[::2], args[1::2]):
    if k in argv:
      argv[argv.index(k) + 1] = v
    else:
      argv += [k, v]
  r = _run(*argv)
  assert r.returncode == 2 and needle in r.stderr, r.stderr
