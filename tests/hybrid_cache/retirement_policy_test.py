"""The retirement seam (`hybrid_cache.policies`, `core/release.retire`) and its policy
`superseded` (`core/policies/superseded.py`, twin `twin/policies/superseded.py`): hand-derived
two-turn sessions, the twins' statistics on random calls, and the differential machine."""

from __future__ import annotations

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import settings
from hypothesis.stateful import initialize
from hypothesis.stateful import invariant

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.core.layout import layout
from hybrid_cache.core.policies import superseded as core
from hybrid_cache.factory import make_manager
from hybrid_cache.twin.policies import superseded as twin
from hybrid_cache.types import ScheduleEntry
from tests.hybrid_cache.paired_rules import eviction_rules
from tests.hybrid_cache.paired_rules import free_queue
from tests.hybrid_cache.policies_test import _ADAPTIVE
from tests.hybrid_cache.policies_test import _COMMON
from tests.hybrid_cache.policies_test import _PHASES
from tests.hybrid_cache.policies_test import CONFIGS
from tests.hybrid_cache.policies_test import key_families
from tests.hybrid_cache.policies_test import placement_request
from tests.hybrid_cache.policies_test import prompts

# full attention + a recurrent group keeping a state at every block end (block 4)
_ALL = dict(
  groups=(GroupSpec("full"), GroupSpec("mamba", mode="all")),
  block_size=4,
  num_blocks=40,
  **_COMMON,
)


def _run(m, name):
  for _ in range(8):
    v = m.request_view(name)
    if v.num_computed_tokens >= v.num_tokens:
      break
    m.schedule([ScheduleEntry(name)])


def _serve(m, name, tokens):
  m.add_request(name, tokens)
  _run(m, name)
  m.free(name)


def _session(k):
  """Turn 1 (9 tokens) and turn 2 (turn 1's first 8 + 9 fresh: 17 tokens) of session k."""
  t1 = [1000 * k + i for i in range(9)]
  return t1, t1[:8] + [1000 * k + 100 + i for i in range(9)]


def _counts(m):
  """[SUP, USED] of the recurrent group (group 1) on either backend."""
  if hasattr(m, "state"):
    return np.asarray(jax.device_get(m.state.policy_state))[0, :2].tolist()
  return m._state.retirement.counts.get(1, [0, 0])


def test_retirement_is_registered_and_validated():
  from hybrid_cache import policies

  assert policies.RETIREMENT_POLICIES[0] == "none"
  assert policies.core_policy("retirement", "none") is None
  assert callable(policies.core_policy("retirement", "superseded").pick)
  assert callable(policies.twin_policy("retirement", "superseded").Retirement)
  from hybrid_cache.core.compile_cache import compile_key

  # a static field: each policy compiles its own programs
  keys = [compile_key(CacheConfig(**_ALL, retirement=r)) for r in ("none", "superseded")]
  assert keys[0] != keys[1] and keys[1].retirement == "superseded"
  with pytest.raises(ValueError, match="retirement must be one of .*got 'nope'"):
    CacheConfig(**_ALL, retirement="nope")
  with pytest.raises(ValueError, match="retirement='superseded' needs prefix caching"):
    CacheConfig(groups=(GroupSpec("full"),), num_blocks=8, retirement="superseded")
  with pytest.raises(ValueError, match="retirement='superseded' needs prefix caching"):
    CacheConfig(**_ALL, enable_prefix_caching=False, retirement="superseded")


@pytest.mark.parametrize("backend", ["jax", "reference"])
@pytest.mark.parametrize("retirement", ["none", "superseded"])
def test_two_turn_session_retires_the_superseded_states(backend, retirement):
  """Block 4, a state at every block end (mode all). Session k: turn 1 = 9 tokens keeps
  states 4 and 8 (positions 0, 1); turn 2 = turn 1's first 8 tokens + 9 fresh hits 8 and keeps
  12 and 16 (positions 2, 3).

  Statistics (module doc of `core.policies.superseded`): turn 1 keeps 2 new points, e = 2: the
  point at 4 is superseded (1); turn 2's admission finds 8 (position 1, a point, not open: no
  use), and 8 has no `CHILD` mark (turn 1 computed nothing past it: no branch); its new points
  12, 16 give e = 4: 8 and 12 are superseded (2). So SUP grows by 3 * SCALE per session,
  decayed by x // 200 at each admission: 1024, 3067, 4076, 6104, ..., 15035 after 5 sessions,
  15984 at session 5's turn 2 (< 16 * 1024 = 16384: no retirement), 17953 after it; USED
  stays 0. Session 6 is the first to retire (both turns decided at their admission, SUP >=
  16384 and 10 * 0 + 8 * 1024 < SUP): turn 1 retires its state at 4 (above its deepest new
  one, 8) and turn 2 those at 8 and 12 (above 16), in position order to the free queue's head
  (turn 2 held 8, its hit, until its finish). Under `none` all four stay; the attention KV
  stays under both (a 17-token prefix still hits 16)."""
  m = make_manager(CacheConfig(**_ALL, retirement=retirement), backend)
  for k in range(6):
    t1, t2 = _session(k)
    _serve(m, "a", t1)
    _serve(m, "b", t2)
  if retirement == "superseded":
    assert _counts(m) == [17953, 0]
  assert m.lookup(t1[:8] + [7]).hit_tokens == 8  # session 5: nothing retired yet
  t1, t2 = _session(6)
  _serve(m, "a", t1)
  m.add_request("b", t2)
  _run(m, "b")
  ids = m.request_view("b").block_ids[1]
  cached = m.pool_stats().cached_blocks_per_group[1]
  m.free("b")
  retired = retirement == "superseded"
  assert m.lookup(t1[:4] + [7]).hit_tokens == (0 if retired else 4)
  assert m.lookup(t1[:8] + [7]).hit_tokens == (0 if retired else 8)
  assert m.lookup(t2[:12] + [7]).hit_tokens == (0 if retired else 12)
  assert m.lookup(t2[:16] + [7]).hit_tokens == 16
  stats = m.pool_stats()
  # turn 2's recurrent row at its finish: null, the hit 8 (held), 12, 16, the running state
  assert ids[0] == 0 and 0 not in ids[1:5]
  if hasattr(m, "state"):  # the core's counter: 4 at turn 1's finish, 8 and 12 at turn 2's
    assert int(m.state.states_retired) == (3 if retired else 0)
  if retired:
    assert stats.cached_blocks_per_group[1] == cached - 2
    # freeing puts the unkeyed running state at the head; retiring puts 8, 12 in front of it
    assert free_queue(m)[:3] == [ids[1], ids[2], ids[4]]
  else:
    assert stats.cached_blocks_per_group[1] == cached
    assert free_queue(m)[0] == ids[4]
  assert stats.num_used_blocks == 0


@pytest.mark.parametrize("backend", ["jax", "reference"])
def test_a_reused_superseded_state_is_kept_from_then_on(backend):
  """After the 6 sessions above (retirement on), requests C_j = a shared 8-token prefix S + 9
  fresh tokens (17 tokens; the simulator's shared system prompt). C_0 keeps 4, 8, 12, 16 and
  retires 4, 8 (S's end state) and 12: nothing is known to reuse S yet (3 retired). C_1's
  admission finds S's state 8 a point and open (superseded by C_0): a use (USED 1024) and
  `KEEP`; it also branches there (seen = 2: the attention holds S, and C_0 computed the block
  after 8: `CHILD`). C_1 recomputes 4 and 8 (no state hit), keeps 12', 16' (new: e = 4) and
  retires 4 and 12' but not 8 (5 retired; 8 re-opened: superseded again). C_2 hits 8, a use
  again (USED 1024 - 5 + 1024 = 2043), retires only 12'' (6)."""
  m = make_manager(CacheConfig(**_ALL, retirement="superseded"), backend)
  for k in range(6):
    t1, t2 = _session(k)
    _serve(m, "a", t1)
    _serve(m, "b", t2)
  prefix = [500 + i for i in range(8)]
  hits, kept, used, retired = [], [], [], []
  for j in range(3):
    c = prefix + [600 + 10 * j + i for i in range(9)]
    hits.append(m.lookup(c[:16]).hit_tokens)
    _serve(m, "c", c)
    kept.append(m.lookup(prefix + [1]).hit_tokens)
    used.append(_counts(m)[1])
    if hasattr(m, "state"):
      retired.append(int(m.state.states_retired))
  assert hits == [0, 0, 8] and kept == [0, 8, 8] and used == [0, 1024, 2043]
  assert retired in ([], [3, 5, 6])


# fine keys: attention pages of 8 tokens, recurrent states every 4 (mode all)
_FINE = dict(
  groups=(GroupSpec("full", block_size=8), GroupSpec("mamba", mode="all", block_size=4)),
  block_size=8,
  hash_block_size=4,
  fine_keys=True,
  num_blocks=60,
  **_COMMON,
)


@pytest.mark.parametrize("backend", ["jax", "reference"])
def test_only_states_above_a_hittable_one_are_retired(backend):
  """A state supersedes only if a lookup can reach it. Fine keys, attention block 8, a state
  every 4 tokens: request k = a 9-token prompt + 4 output tokens keeps new states at 4, 8 and
  12 (e = 3), but the attention keys only its full page [0, 8) (with its fine entry at 4; the
  prompt tail floor(8 / 4) * 4 = 8 is page-aligned), so 12 cannot be hit: a lookup of the
  request's own tokens hits 8. From request 9 on (the statistics of the sessions above: 2
  supersessions per request reach MIN_OBS) the finish retires 4 only, not 8, which stays the
  deepest hittable state of the chain (before this bound both went and nothing was left)."""
  m = make_manager(CacheConfig(**_FINE, retirement="superseded"), backend)
  after = []
  for k in range(11):
    t = [1000 * k + i for i in range(13)]
    m.add_request("a", t[:9])
    _run(m, "a")
    m.append_tokens("a", t[9:])
    _run(m, "a")
    assert [m.lookup(t[:n] + [7]).hit_tokens for n in (4, 8, 12)] == [4, 8, 8]
    m.free("a")
    after.append([m.lookup(t[:n] + [7]).hit_tokens for n in (4, 8, 12)])
  assert after == [[4, 8, 8]] * 9 + [[0, 8, 8]] * 2
  if hasattr(m, "state"):
    assert int(m.state.states_retired) == 2


@pytest.mark.parametrize("backend", ["jax", "reference"])
def test_a_pinned_superseded_state_is_unpinned_and_retired(backend):
  """As above with the pinned tier (SPEC B1): each turn's finish pins its keyed full-attention
  blocks and its deepest state, so turn 1's end state 8 is pinned-free when turn 2 hits it,
  and back in the tier after turn 2's free. From session 6 on (the same statistics as above)
  turn 2 retires it all the same: it loses its key and its pin, and 8, 12 go to the normal
  queue's head in front of turn 2's unkeyed running state."""
  m = make_manager(CacheConfig(**_ALL, pinning=True, retirement="superseded"), backend)
  for k in range(6):
    t1, t2 = _session(k)
    _serve(m, "a", t1)
    _serve(m, "b", t2)
  assert m.lookup(t1[:8] + [7]).hit_tokens == 8
  t1, t2 = _session(6)
  _serve(m, "a", t1)
  m.add_request("b", t2)
  _run(m, "b")
  ids = m.request_view("b").block_ids[1]
  m.free("b")
  assert m.lookup(t1[:8] + [7]).hit_tokens == 0
  assert m.lookup(t2[:16] + [7]).hit_tokens == 16
  assert free_queue(m)[:3] == [ids[1], ids[2], ids[4]]


def test_superseded_twins_agree_on_random_calls():
  """The jitted `observe` against the twin's `Retirement.observe` on random registration calls
  (random slots, admissions, hits, kept and computed ranges; keys fresh per call for the first
  100 calls, then from three families whose table entries collide and whose tags partly
  agree): the same counts, marks, decisions and e after every call, and retirement decided at
  least once."""
  config = CacheConfig(**_ALL, retirement="superseded")
  lay = layout(config)
  g = lay.recurrent_groups[0]
  bs, mb = lay.groups[g].block_size, lay.max_blocks
  pos = jnp.arange(mb)
  from hybrid_cache.twin.cache_keys import PlacementRequest as TwinRequest

  assert (core.SCALE, core.SAT, core.DECAY_DIV, core.MIN_OBS, core.TABLE_BITS) == (
    twin.SCALE,
    twin.SAT,
    twin.DECAY_DIV,
    twin.MIN_OBS,
    twin.TABLE_BITS,
  )

  @jax.jit
  def call(table, r, req, kept):
    return core.observe(lay, r, g, pos, table, req, kept)

  rng = np.random.default_rng(1)
  fams = key_families(rng, mb, core.TABLE_BITS)
  table = jnp.zeros((1, core.state_size(lay)), jnp.int32)
  ref = twin.Retirement(config)
  decided = 0
  for i in range(300):
    r = int(rng.integers(0, lay.max_requests))
    # the first calls on fresh chains (supersessions, no reuse: retirement turns on), then
    # the colliding families
    fresh = rng.integers(0, 1 << 62, mb)
    keys = [int(k) for k in (fresh if i < 100 else fams[rng.integers(0, 3)])]
    tokens = int(rng.integers(1, mb * bs + 1))
    d = int(rng.integers(0, tokens // bs + 1)) * bs
    hit, spb = (d, 0) if rng.random() < 0.5 else (0, d)
    lo = int(rng.integers(0, mb))
    hi = int(rng.integers(lo, min(mb, tokens // bs) + 1)) if lo <= tokens // bs else lo
    admitted = bool(rng.random() < 0.4)
    computed = np.zeros(mb, bool)
    computed[lo:hi] = True
    kept = computed & (rng.random(mb) < 0.5)
    req = placement_request(admitted, hit, spb, tokens, tokens, computed, keys)
    table = call(table, jnp.int32(r), req, jnp.asarray(kept))
    treq = TwinRequest(f"s{r}", admitted, hit, spb, tokens, tokens, range(lo, hi), keys)
    ref.observe(g, treq, np.flatnonzero(kept).tolist())
    row = np.asarray(table[0])
    assert row[: core.MARKS].tolist() == ref.counts[g]
    marks = row[core.MARKS : core.DECISIONS]
    assert {int(i): int(marks[i]) for i in np.flatnonzero(marks)} == ref.marks.get(g, {})
    assert bool(row[core.DECISIONS + r]) == ref.decision.get((g, f"s{r}"), False)
    assert int(row[core.deepest_col(lay) + r]) == ref.deepest.get((g, f"s{r}"), 0)
    decided += bool(row[core.DECISIONS + r]) and admitted
  assert decided > 0


def test_the_simulator_scan_retires_as_the_twin_on_a_chat_trace():
  """The simulator's jitted scan (`core_scan.run_scan`, `release(preempt=False)` per request)
  against the twin (`run_core` "reference") under `superseded`, mode all with a state at every
  block (`all_dense_no_junction`) on a small synthetic chat trace whose capacity forces
  evictions: the same per-request hits and final cached blocks; states are retired, and the
  sessions' later turns reuse more tokens than under `none` (452 -> 552, 2026-11-29: turn N's
  superseded states no longer push other sessions' states out)."""
  from hybrid_cache.sim import core_scan
  from hybrid_cache.sim import core_sim
  from hybrid_cache.sim.testing import TINY
  from hybrid_cache.sim.testing import small_chat

  tr = small_chat(48, seed=2)
  cfgs = {
    r: core_sim.build_config(tr, TINY, 34 * 70, "all_dense_no_junction", 4, retirement=r)[0]
    for r in ("none", "superseded")
  }
  base, _ = core_sim.run_core(tr, cfgs["none"], "reference")
  ref, cref = core_sim.run_core(tr, cfgs["superseded"], "reference")
  scan, cscan = core_scan.run_scan(tr, cfgs["superseded"], chunk=16)
  assert scan == ref
  assert cscan["final_cached_blocks_per_group"] == cref["final_cached_blocks_per_group"]
  assert cscan["states_retired"] > 0
  assert sum(r for _, _, r in ref) > sum(r for _, _, r in base)


def test_the_simulator_cli_takes_a_registered_retirement_for_core_policies(capsys):
  """`--retirement` offers the registered names and applies to core policies only (the unit
  cache's `adaptive` retires by its own rule)."""
  from hybrid_cache.sim import cli

  args = ["--trace", "chat", "--format", "synthetic", "--model", "marconi_7b"]
  args += ["--capacity-bytes", "4e9"]
  assert cli.main([*args, "--policy", "ckpt_adaptive", "--retirement", "superseded"]) == 2
  assert "retirement applies to core policies only, got 'ckpt_adaptive'" in capsys.readouterr().err
  assert cli.main([*args, "--policy", "vllm_default", "--retirement", "nope"]) == 2
  assert "choose from 'none', 'superseded'" in capsys.readouterr().err


class RetirementMachine(eviction_rules(prompts)):
  """The differential machine under `superseded` (jitted core == twin after every operation:
  results, pool counters, free-queue order, invariants), on the machines' configs, the
  mode-all one and the `adaptive` fine-key one; also the same counts and marks. `warm` serves
  20 two-turn sessions first, so that retirement is on (>= 16 supersessions)."""

  @initialize(ci=st.integers(0, len(CONFIGS) + 1), warm=st.booleans())
  def setup(self, ci, warm):
    if ci == len(CONFIGS):
      self.config = CacheConfig(**_ALL, retirement="superseded")
    elif ci == len(CONFIGS) + 1:
      self.config = CacheConfig(**_ADAPTIVE, retirement="superseded")
    else:
      self.config = CacheConfig(retirement="superseded", **CONFIGS[ci], **_COMMON)
    self.jax = make_manager(self.config, "jax")
    self.ref = make_manager(self.config, "reference")
    if warm:
      for k in range(20):
        t1, t2 = _session(k)
        self.serve("e", t1, keep=False)
        self.serve("e", t2, keep=False)

  @invariant()
  def same_statistics(self):
    if not hasattr(self, "jax"):
      return
    table = np.asarray(jax.device_get(self.jax.state.policy_state))
    width = core.state_size(layout(self.config))
    ref = self.ref._state.retirement
    for row, g in enumerate(layout(self.config).recurrent_groups):
      t = table[row, table.shape[1] - width :]
      assert t[: core.MARKS].tolist() == ref.counts.get(g, [0, 0])
      marks = t[core.MARKS : core.DECISIONS]
      assert {int(i): int(marks[i]) for i in np.flatnonzero(marks)} == ref.marks.get(g, {})


TestRetirementMachine = RetirementMachine.TestCase
TestRetirementMachine.settings = settings(
  max_examples=8, stateful_step_count=30, phases=_PHASES, deadline=None
)
