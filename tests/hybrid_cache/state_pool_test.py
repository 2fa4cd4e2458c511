"""Two pools under one byte budget (`CacheConfig.state_slots`): KV pages and recurrent-state slots.

Hand-derived cases on both backends, the byte split (`hybrid_cache.pools`), the compile key and
a jitted-vs-twin state machine over configs with a state pool.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import initialize
from hypothesis.stateful import invariant

from hybrid_cache import CacheConfig
from hybrid_cache import GroupSpec
from hybrid_cache import ScheduleEntry
from hybrid_cache import make_manager
from hybrid_cache import pools
from hybrid_cache.core import compile_cache
from hybrid_cache.core.invariants import check_invariants
from tests.hybrid_cache.differential_test import _COMMON
from tests.hybrid_cache.differential_test import _PHASES
from tests.hybrid_cache.differential_test import DifferentialMachine
from tests.hybrid_cache.paired_rules import free_queue

BACKENDS = ("jax", "reference")
A = list(range(100, 108))  # 8 tokens: 2 blocks of 4
B = list(range(200, 208))
C = list(range(300, 304))  # 4 tokens: 1 block


def _all_mode(num_blocks: int, state_slots: int) -> CacheConfig:
  return CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("mamba", mode="all")),
    block_size=4,
    num_blocks=num_blocks,
    state_slots=state_slots,
    max_model_len=32,
    max_requests=4,
  )


def _run(m, name, tokens):
  m.add_request(name, tokens)
  return m.schedule([ScheduleEntry(name)]).entries[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_states_draw_from_their_own_pool_and_evict_only_states(backend):
  """Pages 1..8, slots 9..12 (mode all: one state per block, 2 per 8-token prompt).

  a and b take pages 1-4 and slots 9-12: c (1 page + 1 slot) is refused with 4 pages free,
  the slot pool being empty. Freeing a puts its blocks at the queue tail, tail first per group
  (pages 2, 1; slots 10, 9); c then pops page 5 (never used, at the head) and slot 10, which
  evicts a's state at token 8 only: a's prefix still hits at 4 (page 1 + slot 9).
  """
  cfg = _all_mode(num_blocks=9, state_slots=4)
  m = make_manager(cfg, backend)
  ea, eb = _run(m, "a", A), _run(m, "b", B)
  assert ea.new_block_ids == ((1, 2), (9, 10))
  assert eb.new_block_ids == ((3, 4), (11, 12))
  ec = _run(m, "c", C)
  assert (ec.scheduled_tokens, ec.reason) == (0, "allocate_slots_failed")
  assert m.pool_stats().num_free_blocks == 4  # the four unused pages
  assert m.lookup(A + [1]).hit_tokens == 8
  m.free("a")
  ec = m.schedule([ScheduleEntry("c")]).entries[0]
  assert ec.scheduled_tokens == 4
  assert ec.new_block_ids == ((5,), (10,))
  assert m.lookup(A + [1]).hit_tokens == 4
  if backend == "jax":
    assert check_invariants(cfg, m.state) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_pool_of_the_same_blocks_admits_c(backend):
  """The contrast: one shared pool of 12 usable blocks admits c beside a and b."""
  m = make_manager(_all_mode(num_blocks=13, state_slots=0), backend)
  _run(m, "a", A), _run(m, "b", B)
  ec = _run(m, "c", C)
  assert ec.scheduled_tokens == 4 and ec.new_block_ids == ((9,), (10,))


@pytest.mark.parametrize("backend", BACKENDS)
def test_watermark_counts_pages_only(backend):
  """a (2 pages, slots 9-10) and b (1 page, slot 11) run: 5 pages and 1 slot are free. c needs
  1 page + 1 slot: admitted under watermark 4 (1 + 4 <= 5 pages; the slot pool keeps no
  watermark, else 1 + 4 > 1 slot), refused under watermark 5."""
  for wm, ok in ((4, True), (5, False)):
    cfg = _all_mode(num_blocks=9, state_slots=4).replace(watermark_blocks=wm)
    m = make_manager(cfg, backend)
    _run(m, "a", A)
    _run(m, "b", B[:4])
    ec = _run(m, "c", C)
    assert (ec.scheduled_tokens == 4) == ok, wm


def test_split_byte_budget():
  assert pools.split_byte_budget(1000, 100, 30, 0.3) == (8, 10)  # 700 // 100 + 1, 300 // 30
  nb, ns = pools.split_byte_budget(10e9, 3.1e6, 7.3e7, 0.5)
  assert (nb - 1) * 3.1e6 + ns * 7.3e7 <= 10e9
  for args, field in (
    ((1000, 100, 30, 0.0), "state_fraction"),
    ((1000, 100, 30, 1.0), "state_fraction"),
    ((1000, 0, 30, 0.5), "page_bytes"),
    ((100, 100, 30, 0.5), "capacity_bytes \\* \\(1 - state_fraction\\)"),
    ((1000, 10, 600, 0.5), "capacity_bytes \\* state_fraction"),
  ):
    with pytest.raises(ValueError, match=field):
      pools.split_byte_budget(*args)


def test_config_checks_and_compile_key():
  with pytest.raises(ValueError, match="state_slots must be >= 0, got -1"):
    _all_mode(9, -1)
  with pytest.raises(ValueError, match="state_slots=2 needs a mamba group"):
    CacheConfig(groups=(GroupSpec("full"),), num_blocks=8, state_slots=2)
  # the slot count is a runtime parameter: configs sharing the padded id space share programs
  key = compile_cache.compile_key
  assert key(_all_mode(9, 4)) == key(_all_mode(10, 3)) == key(_all_mode(11, 2))
  assert key(_all_mode(9, 4)) != key(_all_mode(13, 0))
  assert key(key(_all_mode(9, 4))) == key(_all_mode(9, 4))
  assert _all_mode(9, 4).to_dict()["state_slots"] == 4
  assert "state_slots" not in _all_mode(9, 0).to_dict()


def _budget(byte_budget: int = 14) -> CacheConfig:
  """Pages 1..8 (2 bytes each), slots 9..12 (3 bytes each) under one budget."""
  return _all_mode(num_blocks=9, state_slots=4).replace(
    byte_budget=byte_budget, page_bytes=2, slot_bytes=3
  )


@pytest.mark.parametrize("backend", BACKENDS)
def test_shared_byte_budget_admits_and_evicts_by_bytes(backend):
  """a holds pages 1-2 and slots 9-10: 2 * 2 + 2 * 3 = 10 of 14 bytes. b needs 10 more: refused
  while a runs (ids are free: 6 pages, 2 slots), admitted once a is freed (cached blocks can be
  evicted). b's pops take never-used ids (pages 3-4, slots 11-12), leaving 20 bytes held or
  cached: the first cached free blocks in free-queue order lose their keys until 7 >= 6 bytes
  are gone: a's blocks were freed tail first per group (pages 2, 1, then slots 10, 9), so pages
  2 and 1 and slot 10 go, slot 9 (a's state at token 4) stays cached: 13 bytes."""
  cfg = _budget()
  m = make_manager(cfg, backend)
  assert _run(m, "a", A).new_block_ids == ((1, 2), (9, 10))
  eb = _run(m, "b", B)
  assert (eb.scheduled_tokens, eb.reason) == (0, "allocate_slots_failed")
  assert m.pool_stats().num_free_blocks == 8
  m.free("a")
  eb = m.schedule([ScheduleEntry("b")]).entries[0]
  assert eb.scheduled_tokens == 8 and eb.new_block_ids == ((3, 4), (11, 12))
  stats = m.pool_stats()
  assert stats.num_free_cached_blocks == 1 and stats.cached_blocks_per_group == (2, 3)
  assert m.lookup(A + [1]).hit_tokens == 0  # page 1 is gone
  if backend == "jax":
    assert check_invariants(cfg, m.state) == []
    assert int(m.state.states_evicted) == 1  # slot 10


@pytest.mark.parametrize("backend", BACKENDS)
def test_ids_alone_admit_what_the_budget_refuses(backend):
  """The same two requests without the budget: b fits the free ids beside a."""
  m = make_manager(_all_mode(num_blocks=9, state_slots=4), backend)
  _run(m, "a", A)
  assert _run(m, "b", B).new_block_ids == ((3, 4), (11, 12))


def test_byte_budget_checks_and_compile_key():
  with pytest.raises(ValueError, match="byte_budget=10 needs state_slots > 0"):
    CacheConfig(groups=(GroupSpec("full"), GroupSpec("mamba")), num_blocks=8, byte_budget=10)
  with pytest.raises(ValueError, match="byte_budget must be <= 1073741824"):
    _budget(1 << 31)
  with pytest.raises(ValueError, match="page_bytes must be >= 1"):
    _budget().replace(page_bytes=0)
  key = compile_cache.compile_key
  # the budget and the costs are runtime parameters; having one is static
  assert key(_budget(14)) == key(_budget(20).replace(page_bytes=5, slot_bytes=7))
  assert key(_budget(14)) != key(_all_mode(9, 4))
  assert _budget().to_dict()["byte_budget"] == 14


def test_shared_byte_budget_sizing():
  got = pools.shared_byte_budget(1000, 100, 30)
  assert got == {
    "num_blocks": 11,
    "state_slots": 33,
    "byte_budget": 1000,
    "page_bytes": 100,
    "slot_bytes": 30,
  }
  big = pools.shared_byte_budget(2e11, 33554432, 26787840)
  assert big["byte_budget"] <= 1 << 29 and big["num_blocks"] == 5961
  unit = 2e11 / big["byte_budget"]  # a power of two (rounded budget)
  assert big["page_bytes"] * unit >= 33554432 and big["slot_bytes"] * unit >= 26787840
  with pytest.raises(ValueError, match="capacity_bytes must be >= max"):
    pools.shared_byte_budget(10, 100, 30)


# configs of the state machine: every recurrent mode and rule family with a state pool
POOL_CONFIGS = (
  CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("swa", window=8), GroupSpec("mamba")),
    block_size=4,
    num_blocks=24,
    state_slots=7,
    pinning=True,
    watermark_blocks=1,
    **_COMMON,
  ),
  # partial hits (vLLM §2.5): copy-on-write copies of states come from the slot pool
  CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("mamba", block_size=8)),
    block_size=4,
    num_blocks=20,
    state_slots=9,
    **_COMMON,
  ),
  CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("mamba", mode="all")),
    block_size=4,
    num_blocks=20,
    state_slots=12,
    eviction="flop_aware",
    full_sequence_must_fit=False,
    **_COMMON,
  ),
  # one byte budget for both pools: ids for either to fill it, bytes bind first (pinned tier
  # and window groups included)
  CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("swa", window=8), GroupSpec("mamba")),
    block_size=4,
    num_blocks=31,
    state_slots=15,
    byte_budget=60,
    page_bytes=2,
    slot_bytes=5,
    pinning=True,
    watermark_blocks=1,
    **_COMMON,
  ),
  CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("mamba", mode="all")),
    block_size=4,
    num_blocks=25,
    state_slots=16,
    byte_budget=48,
    page_bytes=2,
    slot_bytes=3,
    eviction="chain_value",
    **_COMMON,
  ),
)


class StatePoolMachine(DifferentialMachine):
  """`DifferentialMachine` (every operation, view, pool count and invariant compared, the
  pool membership of every table entry and, with a byte budget, its bound included) over
  configs with a state pool, plus the free-queue order (both pools share its keys; with a
  re-keying eviction policy the twin's recency stamps once diverged here)."""

  @initialize(ci=st.integers(0, len(POOL_CONFIGS) - 1))
  def setup(self, ci):
    self.config = POOL_CONFIGS[ci]
    self.jax = make_manager(self.config, "jax")
    self.ref = make_manager(self.config, "reference")

  @invariant()
  def same_free_queue(self):
    if hasattr(self, "jax"):
      assert free_queue(self.jax) == free_queue(self.ref)


TestStatePool = StatePoolMachine.TestCase
TestStatePool.settings = settings(
  max_examples=10, stateful_step_count=25, deadline=None, phases=_PHASES
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reused_blocks_are_restamped_in_the_twin(backend):
  """Pages 1-4, slots 5-8, `deepest_first` (the deepest key first, ties least recently freed
  first). a takes pages 1-2 and slots 5-6, b pages 3-4 and slots 7-8; each is freed. At c's
  step the queue is re-keyed deepest first: the blocks ending at 8 (a's 2 and 6 before b's 4 and
  8), so c pops pages 2, 4 and slots 6, 8, and is freed. Re-keyed again: c's 4 and 8 (end 8),
  then the blocks ending at 4 by when they were last freed: a's 1, 5, b's 3, 7, c's 2, 6. (The
  twin once replaced its stamping free list by a plain list when popping from one pool, so c's
  2 and 6 kept the stamps of a's life and came before b's.)"""
  m = make_manager(
    _all_mode(num_blocks=5, state_slots=4).replace(eviction="deepest_first"), backend
  )
  popped = []
  for name, tokens in (("a", A), ("b", B), ("c", list(range(400, 408)))):
    popped.append(_run(m, name, tokens).new_block_ids)
    m.free(name)
  assert popped == [((1, 2), (5, 6)), ((3, 4), (7, 8)), ((2, 4), (6, 8))]
  m.schedule([])  # the re-ordering runs at the start of a step
  assert free_queue(m) == [4, 8, 1, 5, 3, 7, 2, 6]
