"""Reference §7 acceptance scenarios (S01–S38 subset) against the cache core.

Scenarios expressible through the `CacheManager` API run on both backends (the jax one is
skipped while `hybrid_cache.manager` is not importable); the rest test the pure rules of
`hybrid_cache.twin.rules` or use the twin's test-only helpers.
"""

import pytest

from hybrid_cache import hashing
from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.factory import make_manager
from hybrid_cache.hashing import MultiModalItem
from hybrid_cache.hashing import RequestExtras
from hybrid_cache.twin import rules
from hybrid_cache.twin.python_manager import PythonCacheManager
from hybrid_cache.types import ScheduleEntry


def _jax_available():
  try:
    from hybrid_cache.manager import JaxCacheManager  # noqa: F401
  except Exception:  # noqa: BLE001
    return False
  return True


BACKENDS = [
  "reference",
  pytest.param(
    "jax",
    marks=pytest.mark.skipif(
      not _jax_available(), reason="hybrid_cache.manager.JaxCacheManager is not importable yet"
    ),
  ),
]

FULL, MAMBA = GroupSpec("full"), GroupSpec("mamba")


def make(backend, **kw):
  cfg = CacheConfig(**kw)
  if backend == "reference":
    return make_manager(cfg, "reference")

  return make_manager(cfg, "jax")


def run(m, name, tokens=None, chunk=None):
  """Adds (if tokens given) and schedules one step; returns the entry result."""
  if tokens is not None:
    m.add_request(name, tokens)
  return m.schedule([ScheduleEntry(name, chunk)]).entries[0]


def prefill(m, name, tokens, chunk=None):
  m.add_request(name, tokens)
  out = []
  while True:
    e = run(m, name, chunk=chunk)
    out.append(e)
    v = m.request_view(name)
    if e.scheduled_tokens == 0 or v.num_computed_tokens == v.num_tokens:
      return out


# ---------------------------------------------------------------------------------------------
# S01 single group: prefill, hit, free order, eviction order
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_s01_single_group_free_and_eviction_order(backend):
  m = make(backend, groups=(FULL,), block_size=16, num_blocks=11)
  common = [0] * 16 + [1] * 16 + [2] * 16
  e0 = run(m, "R0", common + [3] * 7)
  assert e0.hit.hit_tokens == 0 and e0.new_block_ids == ((1, 2, 3, 4),)
  assert m.pool_stats().cached_blocks_per_group == (3,)
  e1 = run(m, "R1", common + [3] * 5)
  assert e1.hit.hit_tokens == 48 and e1.hit.hit_blocks_per_group == (3,)
  assert e1.new_block_ids == ((5,),)
  assert m.request_view("R1").block_ids == ((1, 2, 3, 5),)
  assert m.pool_stats().num_free_blocks == 5
  m.free("R0")
  m.free("R1")
  if backend == "reference":
    assert m.free_queue() == (5, 4, 6, 7, 8, 9, 10, 3, 2, 1)
  e2 = run(m, "R2", common + [3] * 6)
  assert e2.hit.hit_tokens == 48 and e2.new_block_ids == ((5,),)
  assert m.pool_stats().num_free_blocks == 6
  m.free("R2")
  e3 = run(m, "R3", [99] * 160)
  assert e3.new_block_ids == ((5, 4, 6, 7, 8, 9, 10, 3, 2, 1),)
  st = m.pool_stats()
  assert st.num_free_blocks == 0 and st.cached_blocks_per_group == (10,)


# ---------------------------------------------------------------------------------------------
# S02/S03 FA+SWA+SWA layout and eviction variants
# ---------------------------------------------------------------------------------------------

SWA32 = GroupSpec("swa", window=32)
COMMON3 = [0] * 16 + [1] * 16 + [2] * 16


@pytest.mark.parametrize("backend", BACKENDS)
def test_s02_hybrid_hit_layout(backend):
  m = make(backend, groups=(FULL, SWA32, SWA32), block_size=16, num_blocks=21)
  e0 = run(m, "R0", COMMON3 + [3] * 7)
  assert e0.new_block_ids == ((1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12))
  e1 = run(m, "R1", COMMON3 + [4] * 5)
  assert e1.hit.hit_tokens == 48
  assert e1.hit.hit_blocks_per_group == (3, 2, 2)
  assert e1.new_block_ids == ((13,), (14,), (15,))
  assert m.request_view("R1").block_ids == ((1, 2, 3, 13), (0, 6, 7, 14), (0, 10, 11, 15))


S03_CASES = [
  ([(1, 0), (2, 0)], 48),
  ([(0, 0)], 0),
  ([(0, 2), (1, 2), (2, 2)], 32),
  ([(0, 2)], 32),
  ([(1, 2)], 32),
  ([(2, 2)], 32),
  ([(0, 2), (1, 0), (2, 0)], 0),
]


@pytest.mark.parametrize("evict,hit", S03_CASES)
def test_s03_eviction_variants(evict, hit):
  m = PythonCacheManager(CacheConfig(groups=(FULL, SWA32, SWA32), block_size=16, num_blocks=21))
  r0, r1 = COMMON3 + [3] * 7, COMMON3 + [4] * 5
  run(m, "R0", r0)
  run(m, "R1", r1)
  m.free("R0")
  m.free("R1")
  for group, idx in evict:
    assert m.evict_hash(r1, group, idx) >= 1
  assert m.lookup(r1).hit_tokens == hit


# ---------------------------------------------------------------------------------------------
# S04/S05 EAGLE
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [48, 37])
def test_s04_eagle_single_full(backend, n):
  m = make(
    backend, groups=(FULL,), block_size=16, num_blocks=20, use_eagle=True, num_speculative_tokens=1
  )
  prefill(m, "P", [0] * n)
  m.free("P")
  assert m.lookup([0] * n).hit_tokens == 16


SWA48 = GroupSpec("swa", window=48)
COMMON6 = [i for i in range(6) for _ in range(16)]


def _s05(backend):
  m = make(
    backend,
    groups=(FULL, SWA48, SWA48),
    block_size=16,
    num_blocks=31,
    use_eagle=True,
    num_speculative_tokens=1,
  )
  e0 = run(m, "R0", COMMON6 + [6] * 7)
  return m, e0


@pytest.mark.parametrize("backend", BACKENDS)
def test_s05_eagle_hybrid_layout(backend):
  m, e0 = _s05(backend)
  assert e0.new_block_ids == (tuple(range(1, 8)), tuple(range(8, 15)), tuple(range(15, 22)))
  e1 = run(m, "R1", COMMON6 + [7] * 5)
  assert e1.hit.hit_tokens == 80
  assert e1.new_block_ids == ((22, 23), (24, 25), (26, 27))
  assert m.request_view("R1").block_ids == (
    (1, 2, 3, 4, 5, 22, 23),
    (0, 0, 10, 11, 12, 24, 25),
    (0, 0, 17, 18, 19, 26, 27),
  )


S05_CASES = [
  ([(1, 0), (2, 0)], 80),
  ([(0, 0)], 0),
  ([(0, 5), (1, 5), (2, 5)], 64),
  ([(0, 5)], 64),
  ([(1, 4)], 48),
  ([(2, 4)], 48),
  ([(0, 5), (1, 0), (2, 0)], 64),
]


@pytest.mark.parametrize("evict,hit", S05_CASES)
def test_s05_eagle_eviction_variants(evict, hit):
  m, _ = _s05("reference")
  r1 = COMMON6 + [7] * 5
  run(m, "R1", r1)
  m.free("R0")
  m.free("R1")
  for group, idx in evict:
    assert m.evict_hash(r1, group, idx) >= 1
  assert m.lookup(r1).hit_tokens == hit


# ---------------------------------------------------------------------------------------------
# S06/S07 SWA scan table and freeing sequence (pure rules)
# ---------------------------------------------------------------------------------------------

S06_TABLE = [
  ("F" * 10, 0),
  ("T", 1),
  ("TF", 1),
  ("TT", 2),
  ("TTF", 2),
  ("TTT", 3),
  ("TTTF", 3),
  ("TTFTFFTTFTTT", 12),
  ("TTFTFFTTFFF", 8),
  ("TTFTFFTTFFFT", 8),
]


@pytest.mark.parametrize("pattern,blocks", S06_TABLE)
def test_s06_swa_scan_table(pattern, blocks):
  cached = lambda i: (100 + i,) if pattern[i] == "T" else None  # noqa: E731
  entries, length = rules.find_swa(cached, 2, 4, 2 * len(pattern), False, 2)
  assert len(entries) == blocks and length == 2 * blocks
  # the run is real, everything left of it is null
  real = [i for i, e in enumerate(entries) if e is not None]
  assert all(pattern[i] == "T" for i in real)
  if real:
    assert real == list(range(real[0], blocks))


def test_s07_swa_freeing_sequence():
  row = list(range(1, 12))
  freed = {}
  for c in (0, 4, 5, 6, 7, 11):
    idx = rules.skipped_indices(row, rules.num_skipped_tokens("swa", c, 4) // 2)
    freed[c] = idx
    for i in idx:
      row[i] = 0
  assert freed == {0: [], 4: [], 5: [0], 6: [], 7: [1], 11: [3, 2]}


# ---------------------------------------------------------------------------------------------
# S08–S11 mixed block sizes, masks, LCM clamp, EAGLE peek
# ---------------------------------------------------------------------------------------------

FA32 = GroupSpec("full", block_size=32)
S08_TOKENS = [i for i in range(10) for _ in range(16)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_s08_mixed_block_sizes(backend):
  m = make(backend, groups=(FA32, GroupSpec("swa", block_size=16, window=32)), num_blocks=100)
  e0 = run(m, "R0", S08_TOKENS, chunk=112)
  assert e0.scheduled_tokens == 112
  assert e0.new_block_ids == ((1, 2, 3, 4), tuple(range(5, 12)))
  h1 = m.lookup(S08_TOKENS[:113])
  assert h1.hit_tokens == 96 and h1.hit_blocks_per_group == (3, 2)
  assert m.lookup(S08_TOKENS[:97]).hit_tokens == 96


def test_s08_unaligned_run_start():
  m = PythonCacheManager(
    CacheConfig(groups=(FA32, GroupSpec("swa", block_size=16, window=32)), num_blocks=100)
  )
  run(m, "R0", S08_TOKENS, chunk=112)
  assert m.evict_hash(S08_TOKENS, 1, 5) == 1
  assert m.evict_hash(S08_TOKENS, 1, 6) == 0  # never cached (past the 32-aligned boundary)
  h = m.lookup(S08_TOKENS[:113])
  assert h.hit_tokens == 64 and h.hit_blocks_per_group == (2, 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_s09_swa_tail_only(backend):
  m = make(backend, groups=(FA32, GroupSpec("swa", block_size=8, window=8)), num_blocks=40)
  toks = list(range(64))
  run(m, "R", toks)
  assert m.pool_stats().cached_blocks_per_group == (2, 2)
  if backend == "reference":
    assert m.cached_positions(toks, 1) == {3, 7}


@pytest.mark.parametrize("backend", BACKENDS)
def test_s10_lcm_clamp(backend):
  m = make(backend, groups=(FA32, GroupSpec("swa", block_size=16, window=32)), num_blocks=40)
  toks = list(range(112))
  run(m, "R", toks)
  assert m.pool_stats().cached_blocks_per_group == (3, 6)
  if backend == "reference":
    assert m.cached_positions(toks, 1) == set(range(6))


@pytest.mark.parametrize("backend", BACKENDS)
def test_s11_eagle_swa_small_window(backend):
  m = make(
    backend,
    groups=(FA32, GroupSpec("swa", block_size=8, window=8, eagle=True)),
    num_blocks=40,
    use_eagle=True,
    num_speculative_tokens=1,
  )
  toks = list(range(40))
  run(m, "R", toks)
  assert m.pool_stats().cached_blocks_per_group == (1, 2)
  if backend == "reference":
    assert m.cached_positions(toks, 1) == {3, 4}
  m.free("R")
  assert m.lookup(toks + [999]).hit_tokens == 32


# ---------------------------------------------------------------------------------------------
# S13/S15/S18 simple hybrid, Marconi detection, same-step deferral
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_s13_simple_hybrid_single_pass_and_junction_split(backend):
  m = make(backend, groups=(FULL, MAMBA), block_size=16, num_blocks=40)
  y = list(range(113))
  x = y[:96] + list(range(500, 520))
  m.add_request("X", x)
  for cap in (48, 32, 32, None):
    run(m, "X", chunk=cap)
  assert m.request_view("X").num_computed_tokens == 116
  m.free("X")
  h = m.lookup(y)
  assert h.hit_tokens == 80 and h.per_group_hit_tokens == (96, 80)
  assert h.hit_blocks_per_group == (5, 1) and h.shared_prefix_boundary == 96
  e = run(m, "Y", y)
  assert e.hit.hit_tokens == 80 and e.scheduled_tokens == 16  # cut at the junction 96


def test_s13_split_rule():
  kw = dict(num_tokens=113, num_prompt_tokens=113, block_size=16, use_eagle=False)
  assert rules.block_aligned_split(80, 33, shared_prefix_boundary=96, **kw) == 16
  assert rules.block_aligned_split(80, 33, shared_prefix_boundary=0, **kw) == 32
  assert rules.block_aligned_split(0, 7, shared_prefix_boundary=0, **kw) == 0
  assert rules.block_aligned_split(112, 1, shared_prefix_boundary=0, **kw) == 1


PREFIX15 = [0] * 16 + [1] * 16 + [2] * 16


def test_s15_marconi_detection():
  m = PythonCacheManager(CacheConfig(groups=(FULL, MAMBA), block_size=16, num_blocks=30))
  e = run(m, "q0", PREFIX15)
  assert e.hit.hit_tokens == 0 and e.hit.shared_prefix_boundary == 0
  while m.request_view("q0").num_computed_tokens < 48:
    run(m, "q0")
  # vLLM's test allocates 48 tokens in one call (no split): no state at 32.
  m.evict_hash(PREFIX15, 1, 1)
  h1 = m.lookup(PREFIX15 + [100] * 7)
  assert h1.hit_tokens == 48 and h1.shared_prefix_boundary == 0
  q2 = PREFIX15[:-1] + [101]
  h2 = m.lookup(q2)
  assert h2.hit_tokens == 0 and h2.shared_prefix_boundary == 32
  e2 = run(m, "q2", q2)
  assert e2.scheduled_tokens == 32


@pytest.mark.parametrize("backend", BACKENDS)
def test_s18_same_step_mamba_deferral(backend):
  m = make(backend, groups=(FULL, MAMBA), block_size=16, num_blocks=40)
  m.add_request("X", [5] * 48 + [1, 2, 3])
  m.add_request("Y", [5] * 48 + [7, 8, 9])
  r = m.schedule([ScheduleEntry("X"), ScheduleEntry("Y")])
  x, y = r.entries
  assert x.scheduled_tokens == 48
  assert y.hit.hit_tokens == 48 and y.scheduled_tokens == 0
  assert y.reason == "allocate_slots_failed" and y.num_computed_tokens == 0
  r = m.schedule([ScheduleEntry("X"), ScheduleEntry("Y")])
  y = r.entries[1]
  assert y.admission and y.hit.hit_tokens == 48 and y.scheduled_tokens == 3


# ---------------------------------------------------------------------------------------------
# S21–S26, S28 retention
# ---------------------------------------------------------------------------------------------

S21 = [
  (None, [], set(range(16))),
  (16, [], set(range(16))),
  (64, [], {3, 7, 11, 14, 15}),
  (0, [], {14}),
  (0, [96], {5, 14}),
  (0, [100], {5, 14}),
  (64, [96], {3, 5, 7, 11, 14, 15}),
  (None, [96], set(range(16))),
  (0, [512], {14}),
  (0, [0], {14}),
]


@pytest.mark.parametrize("r,extra,expected", S21)
def test_s21_mamba_masks(r, extra, expected):
  got = {
    i
    for i in range(16)
    if rules.mamba_cacheable(
      i, block_size=16, alignment_tokens=16, retention_interval=r, boundaries=[255, *extra]
    )
  }
  assert got == expected


S22 = [
  (16, 0, 96, {5, 14}),
  (48, 0, 96, {3, 4, 5, 12, 13, 14}),
  (16, 64, 96, {3, 5, 7, 11, 14, 15}),
  (16, None, 96, set(range(16))),
  (16, 0, 0, {14}),
]


@pytest.mark.parametrize("window,r,b,expected", S22)
def test_s22_swa_masks(window, r, b, expected):
  need = rules.swa_need(window, 16, False)
  got = {
    i
    for i in range(16)
    if rules.swa_cacheable(
      i,
      block_size=16,
      need=need,
      alignment_tokens=16,
      eagle=False,
      retention_interval=r,
      boundaries=[255, b],
    )
  }
  assert got == expected


SWA8 = GroupSpec("swa", block_size=8, window=8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_s23_swa_retention_interval(backend):
  m = make(backend, groups=(FA32, SWA8), num_blocks=60, retention_interval=64)
  toks = list(range(128))
  run(m, "R", toks)
  assert m.pool_stats().cached_blocks_per_group == (4, 3)
  if backend == "reference":
    assert m.cached_positions(toks, 1) == {7, 11, 15}


@pytest.mark.parametrize("backend", BACKENDS)
def test_s24_retention_zero_replay(backend):
  m = make(backend, groups=(FA32, SWA8), num_blocks=60, retention_interval=0)
  toks = list(range(128))
  run(m, "R", toks)
  assert m.pool_stats().cached_blocks_per_group == (4, 1)
  if backend == "reference":
    assert m.cached_positions(toks, 1) == {11}
  m.free("R")
  assert m.pool_stats().num_free_cached_blocks == 5
  h = m.lookup(toks)
  assert h.hit_tokens == 96 and h.hit_blocks_per_group == (3, 1)
  assert m.lookup(toks[:96]).hit_tokens == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_s25_retention_zero_mtp_swa(backend):
  m = make(
    backend,
    groups=(FA32, GroupSpec("swa", block_size=8, window=8, eagle=True)),
    num_blocks=60,
    retention_interval=0,
    use_eagle=True,
    num_speculative_tokens=1,
  )
  toks = list(range(127))
  run(m, "R", toks)
  assert m.pool_stats().cached_blocks_per_group == (3, 2)
  if backend == "reference":
    assert m.cached_positions(toks, 1) == {11, 12}
  m.free("R")
  h = m.lookup(toks)
  assert h.hit_tokens == 96 and h.hit_blocks_per_group == (3, 1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_boundary", [False, True])
def test_s26_shared_prefix_pin_keeps_mamba_state(backend, with_boundary):
  m = make(
    backend,
    groups=(FULL, GroupSpec("mamba", mode="all")),
    block_size=16,
    num_blocks=80,
    retention_interval=0,
  )
  toks = list(range(256))
  if with_boundary:
    run(m, "P0", toks[:96] + list(range(1000, 1040)))  # FA caches the 96-token prefix
    m.free("P0")
  before = m.pool_stats().cached_blocks_per_group[1]
  e = run(m, "R", toks)
  assert e.hit.shared_prefix_boundary == (96 if with_boundary else 0)
  assert m.pool_stats().cached_blocks_per_group[1] - before == (2 if with_boundary else 1)
  if backend == "reference":
    assert m.cached_positions(toks, 1) == ({5, 14} if with_boundary else {14})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("retention,junction,hit", [(None, True, 64), (0, False, 0), (0, True, 64)])
def test_s28_swa_marconi_reuse(backend, retention, junction, hit):
  m = make(
    backend,
    groups=(FULL, SWA32),
    block_size=16,
    num_blocks=60,
    retention_interval=retention,
    marconi_junction=junction,
  )
  shared = [7] * 64
  prefill(m, "A", shared + [100] * 20)
  m.free("A")
  prefill(m, "B", shared + [200] * 20)
  m.free("B")
  assert m.lookup(shared + [300] * 20).hit_tokens == hit


# ---------------------------------------------------------------------------------------------
# S30, S32–S34 pure rules
# ---------------------------------------------------------------------------------------------

S30 = [
  ((60, 5, 2, 3), 3, (4, 3, 1), 1),
  ((30, 3, 0, 2), 1, None, 2),
  ((45, 8, 3, 4), 3, None, 4),
  ((10, 6, 0, 2), 0, None, 1),
  ((30, 3, 0, 1), 1, None, 1),
]


@pytest.mark.parametrize("args,src,copy,accepted", S30)
def test_s30_post_forward_copy(args, src, copy, accepted):
  c, s, d, a = args
  got = rules.post_forward_copy(
    num_computed=c, num_scheduled=s, num_draft=d, num_accepted=a, block_size=16, src_col=src
  )
  assert got == (copy, accepted)


def test_s30_pre_forward_copy_examples():
  assert rules.pre_forward_copy(None, 48, 7, 16) == ((2, 3), 3)
  assert rules.pre_forward_copy(None, 0, 32, 16) == (None, 1)
  assert rules.pre_forward_copy(1, 32, 32, 16) == ((1, 3), 3)
  assert rules.pre_forward_copy(3, 60, 1, 16) == (None, 3)


def test_s32_admission_counts_evictable_hits():
  ref = {7: 0}.get
  kw = dict(block_size=2, row_len=0, running=False, hit_ref_cnt=lambda b: ref(b, 1))
  skipped = rules.num_skipped_tokens("swa", 2, 4)
  assert rules.generic_blocks_needed(num_tokens=4, hits=[7], skipped_tokens=skipped, **kw) == 2
  zero = lambda b: 0  # noqa: E731
  kw["hit_ref_cnt"] = zero
  assert (
    rules.generic_blocks_needed(num_tokens=40, hits=list(range(1, 11)), skipped_tokens=0, **kw)
    == 20
  )
  hits = [0] * 5 + list(range(1, 6))
  assert rules.generic_blocks_needed(num_tokens=40, hits=hits, skipped_tokens=0, **kw) == 15


def test_s33_align_allocation_with_shrinking_drafts():
  s = 16
  kw = dict(block_size=16, num_spec_blocks=s)
  row, last = rules.mamba_align_layout(
    [], num_tokens_main=55, already_allocated=False, came_with_hit=False, **kw
  )
  assert row == [0, 0, 0] + [rules.FRESH] * (1 + s) and last is None
  row = list(range(1, len(row) + 1))
  row2, last = rules.mamba_align_layout(
    row, num_tokens_main=56 + 16, already_allocated=True, came_with_hit=False, **kw
  )
  assert len(row2) == len(row) + 1 and row2[-1] == rules.FRESH and last == 3
  row2 = [b if b != rules.FRESH else 99 for b in row2]
  row3, last = rules.mamba_align_layout(
    row2, num_tokens_main=57 + 1 + 1, already_allocated=True, came_with_hit=False, **kw
  )
  assert row3 == row2 and last is None
  n = rules.mamba_align_blocks_needed(
    num_tokens_main=59, row_len=len(row2), already_allocated=True, hits=[], hit_ref_cnt=None, **kw
  )
  assert n == 0


def test_s34_align_without_split_caches_no_state():
  row, _ = rules.mamba_align_layout(
    [],
    num_tokens_main=55,
    block_size=16,
    num_spec_blocks=0,
    already_allocated=False,
    came_with_hit=False,
  )
  assert row == [0, 0, 0, rules.FRESH]
  # caching covers indices < floor(55,16)/16 = 3, all null: no state key
  assert all(b == 0 for b in row[: rules.floor_to(55, 16) // 16])


@pytest.mark.parametrize("backend", BACKENDS)
def test_s34_align_with_split_caches_state(backend):
  m = make(backend, groups=(FULL, MAMBA), block_size=16, num_blocks=30)
  steps = prefill(m, "R", list(range(55)))
  assert [e.scheduled_tokens for e in steps] == [48, 7]
  m.free("R")
  assert m.lookup(list(range(48)) + [999]).hit_tokens == 48


# ---------------------------------------------------------------------------------------------
# S35–S38 extra keys, duplicates, reset, LCM trap
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_s35_extra_keys(backend):
  m = make(backend, groups=(FULL,), block_size=4, num_blocks=20)
  toks = list(range(13))
  m.add_request("A", toks, RequestExtras(cache_salt="s1", lora_name="L1"))
  run(m, "A")
  m.free("A")
  assert m.lookup(toks, RequestExtras(cache_salt="s1", lora_name="L1")).hit_tokens == 12
  assert m.lookup(toks, RequestExtras(cache_salt="s2", lora_name="L1")).hit_tokens == 0
  assert m.lookup(toks, RequestExtras(cache_salt="s1", lora_name="L2")).hit_tokens == 0
  assert m.lookup(toks).hit_tokens == 0
  a = hashing.block_hashes(toks, 4, RequestExtras(mm_items=(MultiModalItem("img", 3, 2),)))
  b = hashing.block_hashes(toks, 4, RequestExtras(mm_items=(MultiModalItem("img", 5, 2),)))
  assert (a[0] != b[0]).any()


def test_s36_duplicates_first_inserted_and_survivor():
  m = PythonCacheManager(CacheConfig(groups=(FULL, MAMBA), block_size=4, num_blocks=64))
  p = list(range(16))
  prefill(m, "A", p + [100] * 6)
  a_blocks = m.request_view("A").block_ids[0][:4]
  steps = prefill(m, "B", p + [200] * 10)
  assert steps[0].hit.hit_tokens == 0 and steps[0].hit.shared_prefix_boundary == 16
  b_blocks = m.request_view("B").block_ids[0][:4]
  assert set(a_blocks).isdisjoint(b_blocks)
  m.free("A")
  m.free("B")
  e = run(m, "C", p + [300] * 5)
  assert e.hit.hit_tokens == 16
  assert m.request_view("C").block_ids[0][:4] == a_blocks  # first inserted wins
  m.free("C")
  m.evict_blocks(a_blocks)
  e = run(m, "D", p + [400] * 5)
  assert e.hit.hit_tokens == 16
  assert m.request_view("D").block_ids[0][:4] == b_blocks


@pytest.mark.parametrize("backend", BACKENDS)
def test_s37_reset(backend):
  m = make(backend, groups=(FULL, MAMBA), block_size=4, num_blocks=30)
  toks = list(range(10))
  prefill(m, "A", toks)
  assert m.reset_prefix_cache() is False
  assert m.lookup(toks).hit_tokens == 8
  m.free("A")
  assert m.reset_prefix_cache() is True
  st = m.pool_stats()
  assert st.cached_blocks_per_group == (0, 0) and st.num_free_cached_blocks == 0
  assert m.lookup(toks).hit_tokens == 0


def test_s38_large_lcm_trap():
  groups = tuple(GroupSpec("full", block_size=b) for b in (128, 4096, 32, 2, 8))
  m = make_manager(CacheConfig(groups=groups, num_blocks=3000, max_model_len=8192), "reference")
  assert m.config.scheduler_block_size == 4096
  toks = list(range(4096))
  prefill(m, "A", toks)
  m.free("A")
  assert m.lookup(toks).hit_tokens == 0
  assert m.lookup(toks[:4000]).hit_tokens == 0
  assert m.lookup(toks + [1]).hit_tokens == 4096
