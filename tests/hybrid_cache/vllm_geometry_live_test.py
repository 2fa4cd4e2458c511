"""Live geometry test: vLLM 0.33's own functions run now, on every case, against `derive`.

Skipped unless `HYBRID_CACHE_VLLM_ORACLE` names the directory `setup_oracle.sh` built:

  HYBRID_CACHE_VLLM_ORACLE=/tmp/vllm-oracle python -m pytest -q \\
    tests/hybrid_cache/vllm_geometry_live_test.py

(about 40 s: one oracle process per target). It also checks that the recorded answers
(`vllm_geometry/recorded.json.gz`, which the default run compares against) are what vLLM says.
"""

import os

import pytest

from hybrid_cache.geometry import derive
from tests.hybrid_cache.vllm_geometry import cases
from tests.hybrid_cache.vllm_geometry import record
from tests.hybrid_cache.vllm_geometry.compare import differences

ORACLE_DIR = os.environ.get("HYBRID_CACHE_VLLM_ORACLE")

pytestmark = pytest.mark.skipif(
  not ORACLE_DIR, reason="set HYBRID_CACHE_VLLM_ORACLE to the vLLM oracle's directory"
)


def test_vllm_now_agrees_with_derive_and_the_recording():
  rows = record.run_oracle(ORACLE_DIR, cases.cases())
  mismatches = [d for row in rows for d in differences(row, derive)]
  assert not mismatches, f"{len(mismatches)} mismatches:\n" + "\n".join(mismatches[:40])
  assert rows == record.load_recorded(), "vLLM's answers differ from the recording: re-record"
