"""Two pools under one byte budget (`CacheConfig.state_slots`): KV pages and recurrent-state slots.

Hand-derived cases on both backends, the byte split (`hybrid_cache.pools`), the compile key and
a jitted-vs-oracle state machine over configs with a state pool.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import initialize

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
)


class StatePoolMachine(DifferentialMachine):
  """`DifferentialMachine` (every operation, view, pool count and invariant compared, the
  pool membership of every table entry included) over configs with a state pool."""

  @initialize(ci=st.integers(0, len(POOL_CONFIGS) - 1))
  def setup(self, ci):
    self.config = POOL_CONFIGS[ci]
    self.jax = make_manager(self.config, "jax")
    self.ref = make_manager(self.config, "reference")


TestStatePool = StatePoolMachine.TestCase
TestStatePool.settings = settings(
  max_examples=10, stateful_step_count=25, deadline=None, phases=_PHASES
)
