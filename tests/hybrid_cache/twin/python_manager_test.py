"""PythonCacheManager specifics: state copies, pinned tier (SPEC B1), pool invariants."""

import random

import pytest

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.factory import make_manager
from hybrid_cache.twin.python_manager import PythonCacheManager
from hybrid_cache.types import ScheduleEntry
from hybrid_cache.types import StateCopy

FULL, MAMBA = GroupSpec("full"), GroupSpec("mamba")
SWA8 = GroupSpec("swa", window=8)


def step(m, name, chunk=None):
  return m.schedule([ScheduleEntry(name, chunk)])


def test_state_copies_follow_prev_and_curr_columns():
  m = PythonCacheManager(CacheConfig(groups=(FULL, MAMBA), block_size=4, num_blocks=64))
  p = list(range(1000, 1016))
  m.add_request("A", p + list(range(100, 106)))
  r1 = step(m, "A")
  assert r1.entries[0].scheduled_tokens == 20 and r1.state_copies == ()  # no initial state
  r2 = step(m, "A")
  assert m.request_view("A").block_ids[1] == (0, 0, 0, 0, 6, 8)
  assert r2.state_copies == (StateCopy("A", 1, 6, 8, 0),)
  # decode inside the same block: no copy
  m.append_tokens("A", [7])
  assert step(m, "A").state_copies == ()
  m.free("A")
  # a prefix hit: the hit block is the source
  m.add_request("B", p + list(range(100, 104)) + [5, 5, 5])
  r = step(m, "B")
  e = r.entries[0]
  assert e.hit.hit_tokens == 20
  row = m.request_view("B").block_ids[1]
  assert r.state_copies == (StateCopy("B", 1, row[4], row[5], 0),)
  assert row[4] == 6


def _pin_setup(pinning, min_drop=1):
  cfg = CacheConfig(
    groups=(FULL, SWA8), block_size=4, num_blocks=41, pinning=pinning, pin_min_drop_size=min_drop
  )
  m = make_manager(cfg, "reference")
  a = list(range(32))
  m.add_request("A", a)
  while m.request_view("A").num_computed_tokens < 32:
    assert step(m, "A", 8).entries[0].scheduled_tokens == 8
  return m, a


def test_pinning_pins_window_drops_and_counts_them_free():
  m, _ = _pin_setup(True)
  st = m.pool_stats()
  assert st.num_pinned_blocks == 4  # SWA blocks 0..3 dropped at c=16 and c=24
  assert st.num_free_blocks == len(m.free_queue()) + 4
  assert st.num_used_blocks == 40 - st.num_free_blocks
  row = m.request_view("A").block_ids[1]
  assert row[:4] == (0, 0, 0, 0)
  m.free("A")
  # + the finish pins: A's full prefix (blocks 0..7) and its last SWA window (blocks 6, 7)
  assert m.pool_stats().num_pinned_blocks == 4 + 8 + 2
  assert m.pool_stats().num_free_blocks == 40


def test_pin_min_drop_size_skips_small_drops():
  m, _ = _pin_setup(True, min_drop=3)
  assert m.pool_stats().num_pinned_blocks == 0


@pytest.mark.parametrize("pinning,hit", [(False, 0), (True, 16)])
def test_pinned_windows_survive_pressure(pinning, hit):
  m, a = _pin_setup(pinning)
  m.free("A")
  m.add_request("D", list(range(5000, 5056)))  # 14 + 14 blocks
  assert step(m, "D").entries[0].scheduled_tokens == 56
  assert m.lookup(a[:16] + [999] * 5).hit_tokens == hit


def test_pinned_blocks_are_demoted_under_pressure():
  m, _ = _pin_setup(True)
  m.free("A")
  m.add_request("E", list(range(7000, 7080)))  # needs all 40 blocks
  e = step(m, "E").entries[0]
  assert e.scheduled_tokens == 80
  st = m.pool_stats()
  assert st.num_free_blocks == 0 and st.num_pinned_blocks == 0


def test_preempt_and_readmit():
  m = PythonCacheManager(CacheConfig(groups=(FULL, MAMBA), block_size=4, num_blocks=64))
  m.add_request("A", list(range(18)))
  step(m, "A")
  step(m, "A")
  m.append_tokens("A", [50])
  m.preempt("A")
  v = m.request_view("A")
  assert v.status == "preempted" and v.num_computed_tokens == 0 and v.num_tokens == 19
  assert m.pool_stats().num_used_blocks == 0
  e = step(m, "A").entries[0]
  assert e.admission and e.hit.hit_tokens == 16  # its own prefix is cached
  assert m.request_view("A").status == "running"


def test_token_budget_shared_by_entries():
  m = PythonCacheManager(
    CacheConfig(groups=(FULL,), block_size=4, num_blocks=64, max_num_batched_tokens=10)
  )
  m.add_request("A", list(range(8)))
  m.add_request("B", list(range(100, 108)))
  m.add_request("C", list(range(200, 208)))
  r = m.schedule([ScheduleEntry("A"), ScheduleEntry("B"), ScheduleEntry("C")])
  assert [e.scheduled_tokens for e in r.entries] == [8, 2, 0]
  assert r.entries[2].reason == "no_token_budget"


def test_allocation_failure_when_pool_is_full():
  m = PythonCacheManager(CacheConfig(groups=(FULL,), block_size=4, num_blocks=5))
  m.add_request("A", list(range(12)))
  step(m, "A")
  m.add_request("B", list(range(100, 108)))
  e = step(m, "B").entries[0]
  assert e.scheduled_tokens == 0 and e.reason == "allocate_slots_failed"
  assert m.request_view("B").status == "waiting"


@pytest.mark.parametrize("pinning", [False, True])
def test_pool_invariants_random_ops(pinning):
  rng = random.Random(0)
  cfg = CacheConfig(
    groups=(FULL, SWA8, MAMBA),
    block_size=4,
    num_blocks=48,
    pinning=pinning,
    max_num_batched_tokens=24,
  )
  m = make_manager(cfg, "reference")
  prefixes = [list(range(k * 100, k * 100 + 12)) for k in range(3)]
  n = 0
  for _ in range(300):
    active = list(m.active_requests())
    op = rng.random()
    if op < 0.3 or not active:
      name = f"r{n}"
      n += 1
      m.add_request(
        name, rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(1, 20))]
      )
    elif op < 0.75:
      names = rng.sample(active, min(len(active), rng.randrange(1, 4)))
      m.schedule([ScheduleEntry(x, rng.choice([None, 4, 7])) for x in names])
    elif op < 0.85:
      x = rng.choice(active)
      v = m.request_view(x)
      if v.status == "running" and v.num_computed_tokens == v.num_tokens and v.num_tokens < 60:
        m.append_tokens(x, [rng.randrange(50)])
    elif op < 0.95:
      m.free(rng.choice(active))
    else:
      m.preempt(rng.choice(active))
    st = m.pool_stats()
    held = {b for x in m.active_requests() for row in m.request_view(x).block_ids for b in row}
    held.discard(0)
    free = m.free_queue()
    assert len(set(free)) == len(free) and not held & set(free)
    assert st.num_used_blocks == len(held)
    assert st.num_free_blocks == len(free) + st.num_pinned_blocks
    assert st.num_free_blocks + st.num_used_blocks == cfg.num_blocks - 1
    for b in held:
      assert m.ref_count(b) >= 1
