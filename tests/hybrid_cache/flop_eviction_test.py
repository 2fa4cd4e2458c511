"""FLOP-aware eviction (SPEC B2): jitted `eviction.prepare` vs hand-computed orders and vs the
plain-Python twin (`hybrid_cache.twin.eviction`), alpha = 0 == LRU, invariants,
cost table, alpha tuner and config validation."""

from __future__ import annotations

import glob
import json
import os

import hypothesis.strategies as st
import jax
import numpy as np
import pytest
from hypothesis import Phase
from hypothesis import settings
from hypothesis.stateful import initialize
from hypothesis.stateful import rule

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.core import alpha_tuning
from hybrid_cache.core import block_index
from hybrid_cache.core import eviction
from hybrid_cache.core.eviction_costs import block_flops
from hybrid_cache.core.eviction_costs import efficiency_table
from hybrid_cache.core.fresh_state import init_state
from hybrid_cache.core.invariants import check_invariants
from hybrid_cache.core.layout import layout
from hybrid_cache.core.policies import flop_aware
from hybrid_cache.core.state import BIG
from hybrid_cache.core.state import BlockAux
from hybrid_cache.core.state import Counters
from hybrid_cache.core.state import QueueKeys
from hybrid_cache.core.state import QueueOrder
from hybrid_cache.factory import make_manager
from hybrid_cache.manager import JaxCacheManager
from hybrid_cache.replay import replay as replay_lib
from hybrid_cache.replay import scenario as scenario_lib
from hybrid_cache.twin.eviction import EvictionOrder
from hybrid_cache.twin.eviction import dead_states
from hybrid_cache.twin.python_manager import PythonCacheManager
from hybrid_cache.types import ScheduleEntry
from tests.hybrid_cache.paired_rules import eviction_rules

SCENARIOS = os.path.join(os.path.dirname(__file__), "scenarios")


# The plain-Python twin with the FLOP-aware hook (python_manager.PythonCacheManager has it).
FlopReference = PythonCacheManager


def _jax_free_queue(state) -> list[int]:
  qk = np.asarray(jax.device_get(state.free_key))
  ids = np.nonzero(qk < BIG)[0]
  return [int(b) for b in ids[np.argsort(qk[ids], kind="stable")]]


# ---------------------------------------------------------------------------------------------
# hand-computed orders on a tiny pool

TINY = CacheConfig(
  groups=(GroupSpec("full"), GroupSpec("mamba")),
  block_size=4,
  num_blocks=8,
  max_model_len=32,
  max_requests=2,
  eviction="flop_aware",
)


def _tiny_state():
  """Blocks 1..7 free: 1 key-less at the head, 7 key-less among the keyed ones (its key was
  dropped while free), keyed 2 (full, end 16), 3 (mamba, end 16), 4 (full, end 4),
  5 (mamba, end 4), 6 (full, end 8), least recently freed first. Each state shares the hash
  of the full block with the same end (same prefix), and every key is indexed."""
  s = init_state(TINY)
  blocks = {2: (0, 16), 3: (1, 16), 4: (0, 4), 5: (1, 4), 6: (0, 8)}
  ids = np.array(list(blocks), np.int32)
  hashes = np.array([[blocks[b][1], 7] for b in blocks], np.uint32)
  grps = np.array([blocks[b][0] for b in blocks], np.int32)
  s = block_index.insert(
    s, jax.numpy.asarray(ids), jax.numpy.asarray(hashes), jax.numpy.asarray(grps)
  )
  w_end = 100  # any base above the head keys
  free = np.full(8, BIG, np.int32)
  keys = {1: 1, 2: w_end + 10, 3: w_end + 11, 7: w_end + 12, 4: w_end + 13, 5: w_end + 14}
  keys[6] = w_end + 15
  for b, k in keys.items():
    free[b] = k
  qk = QueueKeys.stack(free=jax.numpy.asarray(free), pinned=jax.numpy.full(8, BIG, np.int32))
  ends = np.array([blocks[b][1] for b in blocks], np.int32)
  aux = BlockAux(s.block_aux)[jax.numpy.asarray(ids)].set(key_end=jax.numpy.asarray(ends))
  # as frees would leave them: each block's recency is its free-queue key
  order = QueueOrder(s.queue_order).set(recency=QueueKeys(qk).free)
  return s.replace(
    queue_key=qk,
    block_aux=aux,
    counters=Counters(s.counters).set(tail_key=w_end + 16),
    queue_order=order,
  )


# Unit costs (lin 1, quad 0, 1 byte): a full block saves 4 FLOPs, a mamba state at end E saves E.
# Candidates by recency r = 0..4: 2, 3, 4, 5, 6 -> rn = r * 4096. Efficiency: block 3 is the max
# (en = 16384), all others the min (en = 0). Utility = 1000 rn + alpha_milli en:
#   alpha 0.2: 3 -> 4.096e6 + 3.2768e6 = 7.37e6 < 4's 8.192e6: order 2 3 4 5 6
#   alpha 0.3: 3 -> 4.096e6 + 4.9152e6 = 9.01e6 in (8.192e6, 12.288e6): order 2 4 3 5 6
#   alpha 1.0: 3 -> 2.048e7 > 6's 1.6384e7: order 2 4 5 6 3 (the deep state is kept longest)
# and key-less blocks first (1, then 7). alpha 0: untouched, LRU: 1 2 3 7 4 5 6.
@pytest.mark.parametrize(
  "alpha, expected",
  [
    (0.0, [1, 2, 3, 7, 4, 5, 6]),
    (0.2, [1, 7, 2, 3, 4, 5, 6]),
    (0.3, [1, 7, 2, 4, 3, 5, 6]),
    (1.0, [1, 7, 2, 4, 5, 6, 3]),
  ],
)
def test_prepare_hand_computed_order(alpha, expected):
  lay = layout(TINY)
  s = flop_aware.set_alpha(_tiny_state(), alpha)
  out = eviction.prepare(lay, s)
  assert _jax_free_queue(out) == expected
  # a second prepare with nothing in between keeps the order (recency survived re-keying)
  again = eviction.prepare(lay, out)
  assert _jax_free_queue(again) == expected
  qk = np.asarray(again.free_key)
  assert len(set(qk[qk < BIG].tolist())) == 7  # keys stay unique (no index here: no invariants)
  # the twin on the same list gives the same order
  fe = EvictionOrder(TINY, alpha)
  groups = [None, None, 0, 1, 0, 1, 0, None]
  ends = [-1, -1, 16, 16, 4, 4, 8, -1]
  assert list(fe.reorder([1, 2, 3, 7, 4, 5, 6], groups, ends)) == expected


def test_dead_state_goes_right_after_key_less_blocks():
  """Block 4 (full, end 4) loses its key while free, so state 5 (end 4) can never be hit.
  alpha 1: key-less 1, strays 7 and 4 (key order), dead 5, then candidates 2, 3, 6 with
  rn 0, 8192, 16384 and en 0, 16384, 0: utilities 0, 2.4576e7, 1.6384e7 -> 2, 6, 3."""
  lay = layout(TINY)
  s = _tiny_state()
  s = block_index.evict(s, jax.numpy.arange(8) == 4)
  assert np.asarray(eviction.dead_states(lay, s)).nonzero()[0].tolist() == [5]
  out = eviction.prepare(lay, flop_aware.set_alpha(s, 1.0))
  assert _jax_free_queue(out) == [1, 7, 4, 5, 2, 6, 3]
  assert _jax_free_queue(eviction.prepare(lay, s)) == [1, 2, 3, 7, 4, 5, 6]  # alpha 0
  fe = EvictionOrder(TINY, 1.0)
  groups = [None, None, 0, 1, None, 1, 0, None]
  ends = [-1, -1, 16, 16, 4, 4, 8, -1]
  keys = [None, None, (16, 0), (16, 1), None, (4, 1), (8, 0), None]
  index = {(16, 0), (16, 1), (4, 1), (8, 0)}
  dead = dead_states(TINY, keys, ends, index)
  assert dead == {5}
  assert list(fe.reorder([1, 2, 3, 7, 4, 5, 6], groups, ends, dead)) == [1, 7, 4, 5, 2, 6, 3]


def test_prepare_is_identity_for_lru():
  cfg = TINY.replace(eviction="lru")
  s = flop_aware.set_alpha(_tiny_state(), 1.0)
  out = eviction.prepare(layout(cfg), s)
  for a, b in zip(jax.tree.leaves(s), jax.tree.leaves(out)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _serve(m, name, tokens):
  m.add_request(name, tokens)
  for _ in range(8):
    v = m.request_view(name)
    if v.num_computed_tokens >= v.num_tokens:
      break
    m.schedule([ScheduleEntry(name)])
  m.free(name)


@pytest.mark.parametrize("backend", ["jax", "reference"])
def test_long_recurrent_prefix_survives_where_lru_evicts_it(backend):
  """One recurrent group, 4 usable blocks. A (17 tokens) leaves a state at 16, then B and C
  leave states at 4; D needs one cached block back. LRU evicts A's (oldest) state; with
  alpha = 2 the utilities are A 0 + 2*1 = 2, B 0.5 + 0 = 0.5, C 1 + 0 = 1, so B's goes."""
  hits = {}
  for ev in ("lru", "flop_aware"):
    cfg = CacheConfig(
      groups=(GroupSpec("mamba"),),
      block_size=4,
      num_blocks=5,
      max_model_len=32,
      max_requests=2,
      eviction=ev,
    )
    m = make_manager(cfg, "jax") if backend == "jax" else FlopReference(cfg)
    if ev == "flop_aware":
      m.set_eviction_alpha(2.0)
    _serve(m, "A", list(range(17)))
    _serve(m, "B", list(range(100, 105)))
    _serve(m, "C", list(range(200, 205)))
    _serve(m, "D", list(range(300, 305)))
    hits[ev] = [m.lookup(t).hit_tokens for t in (range(17), range(100, 105), range(200, 205))]
    if backend == "jax":
      assert check_invariants(cfg, m.state) == []
  assert hits["lru"] == [0, 4, 4]
  assert hits["flop_aware"] == [16, 0, 4]


# ---------------------------------------------------------------------------------------------
# alpha = 0 is LRU exactly: the example scenarios replayed with eviction flop_aware


def _scenarios():
  return sorted(
    p for p in glob.glob(os.path.join(SCENARIOS, "*.json")) if not p.endswith(".expected.json")
  )


@pytest.mark.parametrize("backend", ["jax", "reference"])
@pytest.mark.parametrize("path", _scenarios(), ids=os.path.basename)
def test_alpha_zero_replays_scenarios_like_lru(path, backend):
  sc = dict(scenario_lib.load(path))
  sc["config"] = dict(sc["config"], eviction="flop_aware")
  factory = JaxCacheManager if backend == "jax" else FlopReference
  actual = replay_lib.replay(sc, backend=backend, factory=factory)
  with open(path.replace(".json", ".expected.json")) as f:
    expected = json.load(f)
  assert replay_lib.first_difference(expected, actual) is None


# ---------------------------------------------------------------------------------------------
# jitted == twin on random operations (alpha in a small grid, changed mid-run)

_COMMON = dict(max_model_len=64, max_requests=5, max_num_batched_tokens=24, eviction="flop_aware")
CONFIGS = (
  CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("mamba")),
    block_size=4,
    num_blocks=14,
    eviction_flops_linear=(1.0, 30.0),
    eviction_flops_quadratic=(0.5, 0.0),
    **_COMMON,
  ),
  CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("swa", window=8), GroupSpec("mamba", mode="all")),
    block_size=4,
    num_blocks=36,
    pinning=True,
    eviction_block_bytes=(4.0, 4.0, 64.0),
    **_COMMON,
  ),
  CacheConfig(
    groups=(GroupSpec("full"),),
    block_size=4,
    num_blocks=16,
    eviction_flops_quadratic=(1.0,),
    **_COMMON,
  ),
)
FAMILIES = (tuple(range(100, 116)), tuple(range(200, 212)), (7,) * 10)
prompts = st.builds(
  lambda fam, cut, suffix: list(FAMILIES[fam][:cut]) + suffix,
  st.integers(0, len(FAMILIES) - 1),
  st.integers(0, 16),
  st.lists(st.integers(0, 5), min_size=1, max_size=10),
)
ALPHAS = (0.0, 0.5, 1.0, 2.0, 10.0)
_PHASES = tuple(p for p in Phase if os.environ.get("HC_SHRINK") or p != Phase.shrink)


class FlopMachine(eviction_rules(prompts)):
  """Drives JaxCacheManager and FlopReference with the same calls; compares everything."""

  @initialize(ci=st.integers(0, len(CONFIGS) - 1), alpha=st.sampled_from(ALPHAS))
  def setup(self, ci, alpha):
    self.config = CONFIGS[ci]
    self.jax = make_manager(self.config, "jax")
    self.ref = FlopReference(self.config)
    self._alpha(alpha)

  def _alpha(self, alpha):
    self.jax.state = flop_aware.set_alpha(self.jax.state, alpha)
    self.ref.set_eviction_alpha(alpha)

  @rule(alpha=st.sampled_from(ALPHAS))
  def set_alpha(self, alpha):
    self._alpha(alpha)


TestFlopMachine = FlopMachine.TestCase
TestFlopMachine.settings = settings(
  max_examples=15, stateful_step_count=30, phases=_PHASES, deadline=None
)


# ---------------------------------------------------------------------------------------------
# cost table, alpha plumbing, tuner, validation


def test_block_flops_hand_computed():
  cfg = CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("swa", window=6), GroupSpec("mamba")),
    block_size=4,
    num_blocks=8,
    max_model_len=12,
    eviction_flops_linear=(2.0, 3.0, 5.0),
    eviction_flops_quadratic=(1.0, 1.0, 0.0),
    eviction_block_bytes=(8.0, 8.0, 100.0),
  )
  f = block_flops(cfg)
  # full: F(L) = 2L + L^2 -> blocks [0,4) [4,8) [8,12): 24, 64-24=40... F(8)=80, F(12)=168
  np.testing.assert_allclose(f[0, 1:4], [24, 56, 88])
  # swa W=6: F(L) = 3L + L*min(L,6): F(4)=28, F(8)=72, F(12)=108
  np.testing.assert_allclose(f[1, 1:4], [28, 44, 36])
  # mamba: the whole prefix, 5E
  np.testing.assert_allclose(f[2, 1:4], [20, 40, 60])
  q = efficiency_table(cfg)
  # efficiency: full 3, 7, 11; swa 3.5, 5.5, 4.5; mamba 0.2, 0.4, 0.6 -> max 11 = 2^30
  assert q[0, 3] == 1 << 30
  assert q[1, 2] == round(5.5 / 11 * 2**30)
  assert q[2, 1] == round(0.2 / 11 * 2**30)
  assert not q.flags.writeable


def test_set_alpha_roundtrip_and_bad_values():
  s = init_state(TINY)
  assert flop_aware.get_alpha(flop_aware.set_alpha(s, 1.25)) == 1.25
  for bad in (-0.1, 100.5, float("nan"), "1", True, None):
    with pytest.raises(ValueError, match="alpha"):
      flop_aware.set_alpha(s, bad)
    with pytest.raises(ValueError, match="alpha"):
      EvictionOrder(TINY, bad)


@pytest.mark.parametrize(
  "changes, field",
  [
    (dict(eviction_flops_linear=(1.0,)), "eviction_flops_linear"),
    (dict(eviction_flops_linear=(1.0, -1.0)), r"eviction_flops_linear\[1\]"),
    (dict(eviction_flops_linear=(1.0, float("inf"))), r"eviction_flops_linear\[1\]"),
    (dict(eviction_flops_linear="12"), "eviction_flops_linear"),
    (dict(eviction_flops_quadratic=(1.0, 2.0)), r"eviction_flops_quadratic\[1\]"),
    (dict(eviction_flops_quadratic=(True, 0.0)), r"eviction_flops_quadratic\[0\]"),
    (dict(eviction_block_bytes=(1.0, 0.0)), r"eviction_block_bytes\[1\]"),
    (dict(eviction_block_bytes=(1.0, 2.0, 3.0)), "eviction_block_bytes"),
  ],
)
def test_bad_cost_fields_raise(changes, field):
  with pytest.raises(ValueError, match=field):
    TINY.replace(**changes)


def test_cost_fields_from_dict_become_tuples():
  d = {
    "groups": [{"type": "full"}, {"type": "mamba"}],
    "num_blocks": 8,
    "block_size": 4,
    "eviction": "flop_aware",
    "eviction_flops_linear": [1, 2],
    "eviction_block_bytes": [3, 4],
  }
  cfg = CacheConfig.from_dict(d)
  assert cfg.eviction_flops_linear == (1.0, 2.0)
  assert cfg.eviction_block_bytes == (3.0, 4.0)
  hash(cfg)


def test_tune_alpha_picks_best_first_on_ties():
  calls = []

  def replay(alpha, n):
    calls.append((alpha, n))
    return 1.0 if alpha in (0.7, 1.5) else 0.5

  res = alpha_tuning.tune_alpha(replay, 10)
  assert calls == [(a, 10) for a in alpha_tuning.ALPHA_GRID]
  # 0.7 and 1.5 tie for the best score: the earliest in grid order wins
  assert res.alpha == 0.7
  assert len(res.scores) == 21
  with pytest.raises(ValueError, match="num_requests"):
    alpha_tuning.tune_alpha(replay, 0)
  with pytest.raises(ValueError, match=r"grid\[1\]"):
    alpha_tuning.tune_alpha(replay, 3, grid=(0.0, -1.0))
  with pytest.raises(ValueError, match="finite"):
    alpha_tuning.tune_alpha(lambda a, n: float("nan"), 3)


def test_online_tuner_bootstrap_window():
  seen = []

  def replay(alpha, n):
    seen.append(n)
    return 1.0 if alpha == 0.3 else 0.0

  t = alpha_tuning.OnlineAlphaTuner(replay, multiplier=5, grid=(0.0, 0.3, 1.0))
  out = [t.observe(i, evicted=i >= 4) for i in range(1, 25)]
  # first eviction after request 4 -> window 20 -> one tuning round at request 20
  assert t.window == 20
  assert [i + 1 for i, a in enumerate(out) if a is not None] == [20]
  assert out[19] == 0.3 and t.alpha == 0.3
  assert seen == [20, 20, 20]
  t2 = alpha_tuning.OnlineAlphaTuner(replay, multiplier=2, grid=(0.0, 0.3), retune_every=3)
  out2 = [t2.observe(i, evicted=True) for i in range(1, 9)]
  assert [i + 1 for i, a in enumerate(out2) if a is not None] == [2, 5, 8]
  with pytest.raises(ValueError, match="multiplier"):
    alpha_tuning.OnlineAlphaTuner(replay, multiplier=0)


class _Model:
  """A cost model with Marconi's formulas (D = 2): attn 8LD^2 + 4L^2D, mlp 16LD^2, ssm 12LD^2."""

  n_attn, n_swa, n_recurrent, n_mlp = 2, 0, 4, 6
  kv_bytes_per_token = 10
  swa_kv_bytes_per_token = 0
  state_bytes = 1000

  def attn_flops(self, L):
    return 8 * L * 4 + 4 * L * L * 2

  def swa_flops(self, L):
    return self.attn_flops(L)

  def mlp_flops(self, L):
    return 16 * L * 4

  def recurrent_flops(self, L):
    return 12 * L * 4


def test_cost_fields_from_model():
  groups = (GroupSpec("full"), GroupSpec("mamba"))
  f = alpha_tuning.cost_fields(_Model(), groups, block_size=16)
  # full: 2 layers * 32 L + 6 MLP layers * 64 L = 448 L, quadratic 2 * 8 = 16; mamba 4 * 48 = 192
  assert f["eviction_flops_linear"] == (448.0, 192.0)
  assert f["eviction_flops_quadratic"] == (16.0, 0.0)
  # pages: full 10 B * 16 = 160, state 1000 -> page 1000 for both
  assert f["eviction_block_bytes"] == (1000.0, 1000.0)
  own = alpha_tuning.cost_fields(_Model(), groups, block_size=16, per_group_bytes=True)
  assert own["eviction_block_bytes"] == (160.0, 1000.0)
  cfg = CacheConfig(groups=groups, num_blocks=8, block_size=16, eviction="flop_aware", **f)
  assert cfg.eviction_flops_linear == (448.0, 192.0)
