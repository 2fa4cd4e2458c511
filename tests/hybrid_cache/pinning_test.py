"""The pinned tier (SPEC B1) on both backends: window-drop pins, finish pins, demotion.

Every test runs on the jitted core and on the plain-Python reference. Expected values are
derived by hand in the comments from the rules (free queue of §1.6, SWA need = ceil((W-1)/B)),
for the config FULL + SWA(W=8), block size 4 (SWA need = 2 blocks).
"""

from __future__ import annotations

import pytest

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.core.invariants import assert_invariants
from hybrid_cache.factory import make_manager
from hybrid_cache.manager import JaxCacheManager
from hybrid_cache.twin import rules
from hybrid_cache.types import ScheduleEntry as E

BASE = CacheConfig(
  groups=(GroupSpec("full"), GroupSpec("swa", window=8)), block_size=4, num_blocks=41,
  max_model_len=128, max_requests=4,
)  # fmt: skip
A = list(range(100, 124))  # 24 tokens: 6 blocks per group
FULL, SWA = 0, 1


@pytest.fixture(params=["jax", "reference"])
def backend(request):
  return request.param


def _manager(backend, **changes):
  cfg = BASE.replace(**changes)
  return make_manager(cfg, "jax") if backend == "jax" else make_manager(cfg, "reference")


def _check(m):
  if isinstance(m, JaxCacheManager):
    assert_invariants(m.config, m.state)


def _run(m, name, tokens, chunk=None):
  """Adds `name` and schedules it alone until its prompt is computed; returns its rows."""
  m.add_request(name, tokens)
  while m.request_view(name).num_computed_tokens < len(tokens):
    e = m.schedule([E(name, chunk)]).entries[0]
    assert e.scheduled_tokens > 0, e
    _check(m)
  return m.request_view(name).block_ids


# ---------------------------------------------------------------------------------------------
# the rule


def test_finish_pin_indices_rule():
  assert rules.finish_pin_indices("full", [0, 1, 2], 2) == [0, 1, 2]
  assert rules.finish_pin_indices("swa", [0, 1, 5, 6, 7], 2) == [6, 7]
  assert rules.finish_pin_indices("swa", [3, 5], 2) == [5]  # position 4 is not keyed
  assert rules.finish_pin_indices("mamba", [1, 3], 1) == [3]
  assert rules.finish_pin_indices("swa", [], 2) == []


# ---------------------------------------------------------------------------------------------
# finish pins


@pytest.mark.parametrize("pinning", [False, True])
def test_finish_pins_full_prefix_and_last_swa_window(backend, pinning):
  m = _manager(backend, pinning=pinning)
  rows = _run(m, "A", A)  # one chunk: blocks 0..5 in both groups, all keyed, none dropped
  m.free("A")
  st = m.pool_stats()
  # pinned: full 0..5 and the SWA window before 24 (SWA blocks 4, 5); SWA 0..3 go to the tail
  assert st.num_pinned_blocks == (6 + 2 if pinning else 0)
  assert st.num_free_blocks == 40
  _check(m)
  # G: 64 tokens = 16 + 16 blocks = the 28 never-used blocks + 4 more from the queue.
  #   vllm: the tail is A's full 5,4,3,2,1,0 then SWA 5..0: full 2..5 are evicted -> hit 8.
  #   pinned: the normal queue is the 28 fresh + SWA 3..0 -> nothing pinned is taken -> hit 24.
  _run(m, "G", list(range(500, 564)))
  st = m.pool_stats()
  assert st.num_free_blocks == 8 and st.num_pinned_blocks == (8 if pinning else 0)
  expected = 24 if pinning else 8
  assert m.lookup(A + [1, 2]).hit_tokens == expected
  m.free("G")
  _check(m)
  # the repeat reuses A's very blocks
  m.add_request("A2", A + [1, 2])
  e = m.schedule([E("A2")]).entries[0]
  assert e.hit.hit_tokens == expected and e.scheduled_tokens == 26 - expected
  got = m.request_view("A2").block_ids
  n = expected // 4
  assert got[FULL][:n] == rows[FULL][:n]
  assert got[SWA][n - 2 : n] == rows[SWA][n - 2 : n]
  _check(m)


def test_preempt_pins_nothing(backend):
  m = _manager(backend, pinning=True)
  _run(m, "A", A)
  m.preempt("A")
  st = m.pool_stats()
  assert st.num_pinned_blocks == 0 and st.num_free_blocks == 40
  _check(m)
  # re-admitted, it hits its own prefix (max 23 tokens -> 20), then finishing pins 6 + 2
  e = m.schedule([E("A")]).entries[0]
  assert e.hit.hit_tokens == 20 and e.scheduled_tokens == 4
  m.free("A")
  assert m.pool_stats().num_pinned_blocks == 8
  _check(m)


def test_window_drop_pins_then_finish_pins(backend):
  m = _manager(backend, pinning=True)
  _run(m, "A", A, chunk=8)  # at c=16 SWA blocks 0, 1 leave the window -> pinned
  assert m.pool_stats().num_pinned_blocks == 2
  m.free("A")
  assert m.pool_stats().num_pinned_blocks == 2 + 6 + 2
  _check(m)


# ---------------------------------------------------------------------------------------------
# Issue 2 must-show: an SWA prefix the vllm profile loses stays hittable with pinning


@pytest.mark.parametrize("pinning", [False, True])
def test_pinning_keeps_an_swa_prefix_hittable_that_vllm_loses(backend, pinning):
  m = _manager(backend, pinning=pinning)
  _run(m, "A", A, chunk=8)  # SWA blocks 0, 1 dropped at c=16 (12 blocks ever used, 28 fresh)
  m.free("A")
  # G: 60 tokens = 15 + 15 blocks = the 28 fresh + 2 more.
  #   vllm: the cached tail starts with the dropped SWA 1, 0 -> they are evicted, while full
  #   blocks 0, 1 survive: the 8-token prefix loses its SWA window.
  #   pinned: the normal queue is 28 fresh + SWA 3, 2 (not in a pinned window) -> exactly 30.
  _run(m, "G", list(range(500, 560)))
  info = m.lookup(A[:8] + [1, 2, 3])
  assert info.per_group_hit_tokens[FULL] == 8  # the full prefix survives either way
  assert info.per_group_hit_tokens[SWA] == (8 if pinning else 0)
  assert info.hit_tokens == (8 if pinning else 0)
  assert m.pool_stats().num_pinned_blocks == (10 if pinning else 0)
  _check(m)


# ---------------------------------------------------------------------------------------------
# Issue 2 must-show: pinned working set > free capacity, admission demotes the oldest


def test_admission_demotes_oldest_pinned_when_pinned_set_exceeds_unpinned_free(backend):
  m = _manager(backend, pinning=True, num_blocks=21)  # 20 usable blocks
  a_rows = _run(m, "A", A)  # 12 blocks
  m.free("A")  # pinned: A full 5..0, A SWA 5, 4 (8); normal: 8 fresh + A SWA 3..0
  b = list(range(300, 324))
  _run(m, "B", b)  # 12 blocks = exactly the normal queue
  m.free("B")  # pinned: A's 8 then B's 8; normal: B SWA 3..0
  st = m.pool_stats()
  assert st.num_free_blocks == 20 and st.num_pinned_blocks == 16  # 16 pinned > 4 unpinned
  _check(m)
  # C: 32 tokens = 8 + 8 blocks > 4 unpinned: 12 pinned are demoted, oldest first:
  # all of A's 8, then B's full 5, 4, 3, 2.
  m.add_request("C", list(range(700, 732)))
  e = m.schedule([E("C")]).entries[0]
  assert e.admission and e.scheduled_tokens == 32 and e.reason is None
  st = m.pool_stats()
  assert st.num_free_blocks == 4 and st.num_pinned_blocks == 4
  assert m.lookup(A + [1, 2]).per_group_hit_tokens == (0, 0)
  assert m.lookup(b + [1, 2]).per_group_hit_tokens[FULL] == 8  # B full 0, 1 still pinned
  # B's SWA 4, 5 (the newest pinned) still serve a window: the SWA lookup alone finds 24
  assert m.lookup(b + [1, 2]).per_group_hit_tokens[SWA] == 24
  # A's pinned blocks (full 0..5, SWA 4, 5) were demoted and reused by C
  held = {x for row in m.request_view("C").block_ids for x in row}
  assert set(a_rows[FULL]) | set(a_rows[SWA][4:]) <= held
  _check(m)


def test_admission_fails_only_when_pinned_plus_unpinned_is_short(backend):
  m = _manager(backend, pinning=True, num_blocks=21)
  _run(m, "A", A)
  m.free("A")
  m.add_request("C", list(range(700, 744)))  # 11 + 11 = 22 > 20 blocks
  e = m.schedule([E("C")]).entries[0]
  assert e.scheduled_tokens == 0 and e.reason == "allocate_slots_failed"
  assert m.pool_stats().num_pinned_blocks == 8  # a failed admission demotes nothing
  m.add_request("D", list(range(800, 840)))  # 10 + 10 = 20 blocks: all of them
  assert m.schedule([E("D")]).entries[0].scheduled_tokens == 40
  st = m.pool_stats()
  assert st.num_free_blocks == 0 and st.num_pinned_blocks == 0
  _check(m)
