"""Eviction `tuned` (`core/policies/tuned.py`, twin `twin/policies/tuned.py`): GreedyDual or
LRU-2 by the state's weighting, set at run time; its layout keeps both policies' bookkeeping;
the differential machine switches the weighting between steps. The simulator's shadow tuner
that sets it: `tests/hybrid_cache/sim/core_scan_test.py`."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import initialize
from hypothesis.stateful import rule

from hybrid_cache import policies
from hybrid_cache.config import CacheConfig
from hybrid_cache.core.layout import layout
from hybrid_cache.core.policies import tuned as core_tuned
from hybrid_cache.factory import make_manager
from hybrid_cache.twin.policies import tuned as twin_tuned
from tests.hybrid_cache.paired_rules import eviction_rules
from tests.hybrid_cache.policies_test import _COMMON
from tests.hybrid_cache.policies_test import _GD_CONFIGS
from tests.hybrid_cache.policies_test import _PHASES
from tests.hybrid_cache.policies_test import prompts
from tests.hybrid_cache.retirement_policy_test import _ALL
from tests.hybrid_cache.retirement_policy_test import _serve


def test_tuned_keeps_both_policies_bookkeeping():
  """It reads the costs, chain features, clock and history; its state carries every
  `block_aux` column and the clock; both twins name the same weightings."""
  assert policies.EVICTION["tuned"] == policies.Reads(True, True, True, True)
  lay = layout(CacheConfig(**_ALL, eviction="tuned"))
  assert lay.chain_features and lay.eviction_clock and lay.access_history
  m = make_manager(CacheConfig(**_ALL, eviction="tuned"), "jax")
  _serve(m, "a", list(range(9)))
  assert m.state.has_chain and m.state.has_clock and m.state.has_history
  assert core_tuned.WEIGHTINGS == twin_tuned.WEIGHTINGS == ("greedy_dual", "lru2")
  assert core_tuned.weighting(m.state) == "greedy_dual"
  m.set_eviction_weighting("lru2")
  assert core_tuned.weighting(m.state) == "lru2"


@pytest.mark.parametrize("backend", ["jax", "reference"])
def test_a_weighting_is_set_only_on_tuned_and_by_name(backend):
  m = make_manager(CacheConfig(**_ALL, eviction="tuned"), backend)
  with pytest.raises(ValueError, match="weighting must be one of"):
    m.set_eviction_weighting("lru")
  other = make_manager(CacheConfig(**_ALL, eviction="lru2"), backend)
  with pytest.raises(ValueError, match="eviction must be 'tuned'"):
    other.set_eviction_weighting("lru2")


class TunedMachine(eviction_rules(prompts)):
  """The eviction machine under `tuned` (GreedyDual's configurations, with retirement
  `superseded`), the weighting switched on both twins between steps: the free-queue order,
  the chain features, the clock, the access history and the KV owners stay equal."""

  @initialize(ci=st.integers(0, len(_GD_CONFIGS) - 1))
  def setup(self, ci):
    self.config = CacheConfig(
      eviction="tuned", retirement="superseded", **_GD_CONFIGS[ci], **_COMMON
    )
    self.jax = make_manager(self.config, "jax")
    self.ref = make_manager(self.config, "reference")

  @rule(name=st.sampled_from(core_tuned.WEIGHTINGS))
  def switch(self, name):
    self._both(lambda m: m.set_eviction_weighting(name))


TestTunedMachine = TunedMachine.TestCase
TestTunedMachine.settings = settings(
  max_examples=8, stateful_step_count=30, phases=_PHASES, deadline=None
)
