"""The invariant checker flags corrupted states and stays silent on real ones."""

from __future__ import annotations

import pytest

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.core.invariants import assert_invariants
from hybrid_cache.core.invariants import check_invariants
from hybrid_cache.manager import JaxCacheManager
from hybrid_cache.core.state import BIG
from hybrid_cache.types import ScheduleEntry as E

CFG = CacheConfig(
  groups=(GroupSpec("full"), GroupSpec("mamba")), block_size=4, num_blocks=32, max_model_len=64,
  max_requests=4,
)  # fmt: skip


@pytest.fixture(scope="module")
def live():
  m = JaxCacheManager(CFG)
  m.add_request("A", list(range(22)))
  m.schedule([E("A")])
  m.schedule([E("A")])
  m.add_request("B", list(range(16)) + [50, 51])
  m.schedule([E("B")])
  return m


def test_clean_after_real_operations(live):
  assert check_invariants(CFG, live.state) == []
  assert_invariants(CFG, live.state)


def _corrupt(state, **kw):
  return state.replace(**kw)


@pytest.mark.parametrize(
  "mutate,needle",
  [
    (lambda s: _corrupt(s, ref_cnt=s.ref_cnt.at[1].set(-1)), "negative ref"),
    (lambda s: _corrupt(s, queue_key=s.queue_key.at[0, 1].set(-5)), "exactly one of"),
    (lambda s: _corrupt(s, queue_key=s.queue_key.at[0, 0].set(-9)), "null block"),
    (lambda s: _corrupt(s, ref_cnt=s.ref_cnt.at[1].add(1)), "ref counts differ"),
    (lambda s: _corrupt(s, block_hash=s.block_hash.at[1, 0].add(1)), "lanes differ"),
    (lambda s: _corrupt(s, tables=s.tables.at[0, 1, 15].set(3)), "past the row length"),
    (lambda s: _corrupt(s, block_group=s.block_group.at[1].set(1)), "held by another"),
    (
      lambda s: _corrupt(s, queue_key=s.queue_key.at[1, 30].set(7).at[0, 30].set(BIG)),
      "pinned flag",
    ),
  ],
)
def test_detects_corruption(live, mutate, needle):
  bad = mutate(live.state)
  errs = check_invariants(CFG, bad)
  assert any(needle in e for e in errs), errs
  with pytest.raises(AssertionError, match="invariants violated"):
    assert_invariants(CFG, bad)
