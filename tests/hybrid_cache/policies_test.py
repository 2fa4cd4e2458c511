"""The policy seam (`hybrid_cache.policies`): every registered eviction policy's two twins agree,
and the README's worked example (`deepest_first`) is registered, ordered as documented, run by
the simulator and checked by the differential machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import hypothesis.strategies as st
import pytest
from hypothesis import Phase
from hypothesis import settings
from hypothesis.stateful import initialize

from hybrid_cache import policies
from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.factory import make_manager
from hybrid_cache.types import ScheduleEntry
from tests.hybrid_cache.paired_rules import NAMES
from tests.hybrid_cache.paired_rules import eviction_rules
from tests.hybrid_cache.paired_rules import free_queue

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# flop_aware has its own machine and hand-derived tests (flop_eviction_test.py)
GENERIC = tuple(p for p in policies.EVICTION_POLICIES if p not in ("lru", "flop_aware"))


def _serve(m, name, tokens):
  m.add_request(name, tokens)
  for _ in range(8):
    v = m.request_view(name)
    if v.num_computed_tokens >= v.num_tokens:
      break
    m.schedule([ScheduleEntry(name)])
  m.free(name)


@pytest.mark.parametrize("name", policies.EVICTION_POLICIES)
def test_every_registered_policy_has_both_twins(name):
  core, oracle = policies.core_eviction(name), policies.oracle_eviction(name)
  if name == "lru":
    assert core is None and oracle is None
  else:
    assert callable(core.priority) and callable(oracle.priority)
  CacheConfig(groups=(GroupSpec("full"),), num_blocks=8, eviction=name)  # accepted by name


def test_unknown_policy_names_the_field():
  with pytest.raises(ValueError, match="eviction must be one of .*'deepest_first'.*got 'mru'"):
    CacheConfig(groups=(GroupSpec("full"),), num_blocks=8, eviction="mru")


@pytest.mark.parametrize("backend", ["jax", "reference"])
def test_deepest_first_evicts_the_deepest_key_first(backend):
  """Full attention, block 4, fresh queue [1..9]. A (5 tokens) takes 1 (key ends at 4) and 2
  (partial, no key); freeing puts key-less blocks at the head, keyed ones at the tail:
  [2, 3..9, 1]. B (9 tokens) takes 2, 3, 4 (keys end at 4 and 8; 4 partial) and is freed tail
  first: [4..9, 1, 3, 2] = LRU's order. At the next step deepest_first keeps the key-less
  blocks in front, then block 3 (end 8), then the keys ending at 4, least recently freed first
  (1, then 2)."""
  orders = {}
  for eviction in ("lru", "deepest_first"):
    cfg = CacheConfig(
      groups=(GroupSpec("full"),),
      block_size=4,
      num_blocks=10,
      max_model_len=32,
      max_requests=2,
      eviction=eviction,
    )
    m = make_manager(cfg, backend)
    _serve(m, "A", list(range(5)))
    _serve(m, "B", list(range(100, 109)))
    m.schedule([])  # the re-ordering runs at the start of a step
    orders[eviction] = free_queue(m)
  assert orders["lru"] == [4, 5, 6, 7, 8, 9, 1, 3, 2]
  assert orders["deepest_first"] == [4, 5, 6, 7, 8, 9, 3, 1, 2]


# ---------------------------------------------------------------------------------------------
# jitted == oracle on random operations, for every registered (non-flop) eviction policy

_COMMON = dict(max_model_len=64, max_requests=len(NAMES), max_num_batched_tokens=24)
CONFIGS = (
  dict(groups=(GroupSpec("full"), GroupSpec("mamba")), block_size=4, num_blocks=16),
  dict(
    groups=(GroupSpec("full"), GroupSpec("swa", window=8), GroupSpec("mamba", mode="all")),
    block_size=4,
    num_blocks=36,
    pinning=True,
  ),
)
FAMILIES = (tuple(range(100, 116)), tuple(range(200, 212)), (7,) * 10)
prompts = st.builds(
  lambda fam, cut, suffix: list(FAMILIES[fam][:cut]) + suffix,
  st.integers(0, len(FAMILIES) - 1),
  st.integers(0, 16),
  st.lists(st.integers(0, 5), min_size=1, max_size=10),
)
_PHASES = tuple(p for p in Phase if os.environ.get("HC_SHRINK") or p != Phase.shrink)


class EvictionMachine(eviction_rules(prompts)):
  """Drives the jitted core and the oracle under one registered eviction policy; compares every
  result, the pool counters, the free-queue order and the state invariants."""

  @initialize(ci=st.integers(0, len(CONFIGS) - 1), name=st.sampled_from(GENERIC))
  def setup(self, ci, name):
    self.config = CacheConfig(eviction=name, **CONFIGS[ci], **_COMMON)
    self.jax = make_manager(self.config, "jax")
    self.ref = make_manager(self.config, "reference")


TestEvictionMachine = EvictionMachine.TestCase
TestEvictionMachine.settings = settings(
  max_examples=10, stateful_step_count=30, phases=_PHASES, deadline=None
)


# ---------------------------------------------------------------------------------------------
# the simulator finds every registered policy by name


def _write_trace(path):
  """Sessions that share a 2-block system prompt and grow their history by one 512-token block
  per turn (Mooncake rows: one hash id per 512-token block)."""
  rows, t = [], 0
  for turn in range(4):
    for s in range(6):
      ids = [1, 2] + [1000 * (s + 1) + k for k in range(turn + 1)]
      rows.append(
        {"timestamp": t, "input_length": 512 * len(ids) - 100, "output_length": 8, "hash_ids": ids}
      )
      t += 10
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)


@pytest.mark.parametrize("name", GENERIC)
def test_simulator_runs_every_registered_policy(tmp_path, name):
  trace = tmp_path / "trace.jsonl"
  _write_trace(trace)
  out = {}
  for policy in ("lru", name):
    cmd = [sys.executable, "-m", "hybrid_cache.sim", "--trace", str(trace), "--format",
           "mooncake", "--model", "marconi_7b", "--capacity-bytes", "3e9", "--policy", policy,
           "--block-size", "512"]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    out[policy] = json.loads(res.stdout)
  assert out[name]["policy"] == name and out[name]["eviction"] == name
  assert 0 < out[name]["token_hit_rate"] <= out[name]["oracle_token_hit_rate"]
