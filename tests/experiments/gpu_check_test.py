"""`experiments/gpu_check.sh` on a machine without a GPU: every device step skips cleanly (one
"skip (no GPU)" line each, exit status 0) and the summary lands in the log folder."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "gpu_check.sh"


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU behaviour")
def test_device_steps_skip_cleanly_without_a_gpu(tmp_path):
  env = dict(os.environ, GPU_CHECK_STEPS="exact serving bench kernels", PYTHON=sys.executable)
  done = subprocess.run(
    ["bash", str(SCRIPT), str(tmp_path / "logs")],
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert done.returncode == 0, done.stdout + done.stderr
  summary = (tmp_path / "logs" / "summary.txt").read_text()
  for step in ("exact", "serving", "bench", "kernels"):
    assert f"{step}: skip (no GPU)" in summary
  assert "failed steps: 0" in summary
