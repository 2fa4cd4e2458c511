"""Live differential test: fresh generated scenarios on vLLM's real manager and on both cores.

Skipped unless `HYBRID_CACHE_VLLM_ORACLE` names the directory `setup_oracle.sh` built, e.g.

  HYBRID_CACHE_VLLM_ORACLE=/tmp/vllm-oracle HYBRID_CACHE_LIVE_COUNT=2000 \\
    python -m pytest -q tests/hybrid_cache/vllm_diff_live_test.py

`HYBRID_CACHE_LIVE_COUNT` scenarios (default 200) from `HYBRID_CACHE_LIVE_SEED` on (default:
a seed from the clock, printed, so a failure can be replayed; recorded seeds start at 0, live
ones at 10**6 and above). `HYBRID_CACHE_LIVE_BACKENDS` (default "reference,jax") picks the
cores. Every disagreement is listed with its seed.
"""

import os
import time

import pytest

from tests.hybrid_cache.vllm_diff import generator
from tests.hybrid_cache.vllm_diff import oracle
from tests.hybrid_cache.vllm_diff import suite

ORACLE_DIR = os.environ.get("HYBRID_CACHE_VLLM_ORACLE")

pytestmark = pytest.mark.skipif(
  not ORACLE_DIR, reason="set HYBRID_CACHE_VLLM_ORACLE to the vLLM oracle's directory"
)


def _settings():
  count = int(os.environ.get("HYBRID_CACHE_LIVE_COUNT", "200"))
  seed = os.environ.get("HYBRID_CACHE_LIVE_SEED")
  first = int(seed) if seed else 10**6 + int(time.time()) % 10**8
  backends = os.environ.get("HYBRID_CACHE_LIVE_BACKENDS", "reference,jax").split(",")
  return count, first, [b.strip() for b in backends if b.strip()]


def test_fresh_scenarios_agree_with_vllm():
  count, first, backends = _settings()
  print(f"live differential: {count} scenarios from seed {first}, backends {backends}")
  runner = oracle.OracleRunner(ORACLE_DIR)
  scenarios = [generator.generate(s) for s in range(first, first + count)]
  # family by family, so that the jitted core reuses its programs within a family
  order = sorted(range(count), key=lambda i: scenarios[i]["name"].rsplit("_", 1)[0])
  rows, rejected = [], 0
  for i, (sc, result) in zip(order, oracle.run_repaired(runner, [scenarios[i] for i in order])):
    if result is None:
      rejected += 1
      continue
    rows.append({"seed": first + i, "scenario": sc, "expected": suite.compare.trim(result)})
  assert rejected <= count // 100, f"vLLM rejected {rejected} generated scenarios"
  for backend in backends:
    n, diffs = suite.disagreements(rows, backend, layout=True, limit=20)
    print(f"{backend}: {n} scenarios, {len(diffs)} listed disagreements")
    assert not diffs, f"{backend} (seeds from {first}):\n" + "\n".join(diffs)
