"""The simulator's unit cache (`checkpoint_cache.UnitCache`, placement `adaptive`) against the
cache core's placement `adaptive` (`core/policies/adaptive.py`) replayed by `core_sim`: the
same hits on every request where their rules coincide (issue 28, item 3: the unit cache as a
fast model checked against the core).

Setting: capacity that never evicts (so eviction, retirement and byte accounting do not enter),
plain LRU, no retirement, U = 64; the core on 64-token pages for every group (`pools` layout,
align mode: a state at the branch point, the prompt end and each output's last 64, all
hittable). Then both place a state at the branch point and at the continuation point on the
learned alignment, and a hit is the deepest such state on the request's path.

Known deviation (not exercised here): the unit cache knows a request's whole output when it
places, the core registers states as they are computed. With the output flag on, the core keeps
the prompt's point as well as the output's (the output is unknown while the prompt is
computed; `core/policies/adaptive.py`, "Online deviations"), so a later request with the same
prompt (parallel samples: the `agentic` and `rl_rollouts` generators, or these generators mixed
in one trace) hits deeper in the core. Measured on the first 150 requests of `agentic` seed 0:
4 requests differ, the core deeper on each; on ShareGPT's first 150: none.
"""

from __future__ import annotations

import numpy as np
import pytest

from hybrid_cache.sim import checkpoint_policies
from hybrid_cache.sim import core_sim
from hybrid_cache.sim import synthetic
from hybrid_cache.sim.cost_model import get_model
from hybrid_cache.sim.eviction_weightings import PLAIN_LRU
from hybrid_cache.sim.metrics import flops_saved
from hybrid_cache.sim.trace import Trace

U = 64
REQUESTS = 60
CAPACITY = 5e10  # nothing is evicted from either cache on these 60-request traces
KINDS = ("chat", "agent", "shared_prefix", "doc_qa", "self_consistency")
MODEL = get_model("marconi_7b")


@pytest.fixture(scope="module")
def traces():
  return {k: synthetic.generate(k, seed=0).head(REQUESTS) for k in KINDS}


@pytest.fixture(scope="module")
def core_config(traces):
  """One core config for every trace (one compile): sized on their union."""
  union = Trace(tuple(r for t in traces.values() for r in t.requests), "tokens", "union")
  config, _ = core_sim.build_config(
    union, MODEL, CAPACITY, "vllm_default", U, layout="pools", placement="adaptive"
  )
  return config


@pytest.mark.parametrize("kind", KINDS)
def test_unit_cache_and_core_hit_the_same_on_every_request(kind, traces, core_config):
  trace = traces[kind]
  (row,) = checkpoint_policies.sweep_settings(
    trace, MODEL, [CAPACITY], "adaptive", [PLAIN_LRU], U, U, retirement=False
  )
  unit, _ = row[0]
  core, counters = core_sim.replay(trace, core_config)
  assert counters["states_evicted"] == 0
  unit_hits = [t[2] for t in unit]
  core_hits = [t[2] for t in core]
  assert core_hits == unit_hits
  assert sum(core_hits) > 0  # the traces do reuse
  saved = [flops_saved(MODEL, np.array([t[2] for t in x], np.int64)) for x in (unit, core)]
  assert saved[0] == saved[1]
