"""The lazy free-queue order (`core/eviction.py`, "Lazy order") on small pools.

The core orders only each pool's first `eviction.order_window` blocks per step on pools of more
than `eviction.LAZY_FROM` blocks, and the rest when a step reaches them. Here `LAZY_FROM` is 0,
so the differential machines' small pools (window 8) run the lazy order: every pop, byte-budget
eviction and the completed queue must equal the twin's, which sorts its whole list.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import settings

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.core import compile_cache
from hybrid_cache.core import eviction
from hybrid_cache.core import scheduler
from hybrid_cache.core.layout import layout
from hybrid_cache.core.state import BIG
from hybrid_cache.factory import make_manager
from hybrid_cache.types import ScheduleEntry
from tests.hybrid_cache.paired_rules import exact_free_keys
from tests.hybrid_cache.paired_rules import free_queue
from tests.hybrid_cache.policies_test import EvictionMachine
from tests.hybrid_cache.state_pool_test import StatePoolMachine
from tests.hybrid_cache.tuned_eviction_test import TunedMachine


@pytest.fixture(autouse=True)
def lazy_everywhere(monkeypatch):
  """Every pool ordered lazily; programs compiled before or here are dropped on both sides
  (the order window is read when a program is traced)."""
  compile_cache.clear()
  jax.clear_caches()
  monkeypatch.setattr(eviction, "LAZY_FROM", 0)
  yield
  compile_cache.clear()
  jax.clear_caches()


_FEW = dict(max_examples=4, stateful_step_count=30, deadline=None)


class LazyEvictionMachine(EvictionMachine):
  """Every generic eviction policy, one pool."""


class LazyTunedMachine(TunedMachine):
  """`tuned` with retirement and weighting switches."""


class LazyStatePoolMachine(StatePoolMachine):
  """Two pools, some with a shared byte budget (its eviction walks the queue)."""


TestLazyEviction = LazyEvictionMachine.TestCase
TestLazyEviction.settings = settings(**_FEW)
TestLazyTuned = LazyTunedMachine.TestCase
TestLazyTuned.settings = settings(**_FEW)
TestLazyStatePool = LazyStatePoolMachine.TestCase
TestLazyStatePool.settings = settings(**_FEW)

CFG = CacheConfig(
  groups=(GroupSpec("full"), GroupSpec("mamba", mode="all")),
  block_size=4,
  num_blocks=64,
  max_model_len=128,
  max_requests=2,
  eviction="greedy_dual",
)


def _fill(m, n: int):
  """Serves and frees `n` distinct 24-token requests: their keyed blocks fill the free queue."""
  for i in range(n):
    name = f"r{i}"
    m.add_request(name, list(range(1000 * i, 1000 * i + 24)))
    while m.schedule([ScheduleEntry(name, None)]).entries[0].num_computed_tokens < 24:
      pass
    m.free(name)


def test_the_lazy_part_exists_and_completes_to_the_twins_order():
  lay = layout(CFG)
  assert eviction.lazy(lay) and eviction.order_window(lay) == 8
  jm, ref = make_manager(CFG, "jax"), make_manager(CFG, "reference")
  for m in (jm, ref):
    _fill(m, 4)
  # one step re-keys the queue: 8 blocks ordered, the other keyed ones left in the lazy region
  for m in (jm, ref):
    m.add_request("x", [5, 6, 7, 8])
    m.schedule([ScheduleEntry("x", None)])
  s = jax.device_get(jm.state)
  assert int(s.order_exact) < BIG
  qk = np.asarray(s.free_key)
  lo, hi = int(s.order_lazy), int(s.order_lazy) + qk.shape[0]
  assert ((qk >= lo) & (qk < hi)).sum() > 0
  # the jitted completion and its NumPy mirror agree, and give the twin's queue
  np.testing.assert_array_equal(
    np.asarray(scheduler.free_queue_keys(CFG, jm.state)), exact_free_keys(s)
  )
  assert free_queue(jm) == free_queue(ref)


def test_a_pop_past_the_window_takes_the_full_order():
  """A request of 64 tokens pops 16 pages and 16 states, more than the 8 ordered ones: the
  queue is completed first, so the pops and the queue after them equal the twin's."""
  jm, ref = make_manager(CFG, "jax"), make_manager(CFG, "reference")
  outs = []
  for m in (jm, ref):
    _fill(m, 4)
    m.add_request("big", list(range(50000, 50064)))
    outs.append(m.schedule([ScheduleEntry("big", None)]).entries[0])
  assert outs[0] == outs[1]
  assert free_queue(jm) == free_queue(ref)
