"""`compiled_replay` makes `UnitCache`'s decisions bit for bit: the compiled and the plain-Python
backends of `sweep_checkpoint` give the same triples and summaries on random traces, for every
placement rule, eviction weighting, model kind and capacity (tight ones included); retirement
of superseded checkpoints is also compared in `retirement_test.py`."""

import dataclasses

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from hybrid_cache.sim import checkpoint_policies as cp
from hybrid_cache.sim import checkpoint_sweep
from hybrid_cache.sim import compiled_replay
from hybrid_cache.sim import eviction_weightings as weightings
from hybrid_cache.sim.synthetic import agentic
from hybrid_cache.sim.synthetic import chat
from hybrid_cache.sim.testing import TINY
from hybrid_cache.sim.testing import small_chat

ATTN_ONLY = dataclasses.replace(TINY, name="tiny_attn", n_recurrent=0)
# sliding-window layers only: a checkpoint is one window of SWA KV (no recurrent state)
SWA_ONLY = dataclasses.replace(TINY, name="tiny_swa", n_recurrent=0, n_swa=1, swa_window=24)
# (policy, alpha, prior, frequency, length_classes)
SETTINGS = [
  ("adaptive", None, "hits", True, False),
  ("adaptive", None, "hits", True, True),
  ("adaptive", 1.0, "reach", True, False),
  ("adaptive", 0.0, "hits", False, False),
  ("adaptive", 2.5, "none", True, True),
  ("ckpt_branch", None, "hits", True, False),
  ("ckpt_dense", None, "hits", True, False),
  ("ckpt_sparse:3", None, "hits", True, False),
]


def _without_wall(extra: dict) -> dict:
  return {k: v for k, v in extra.items() if k != "wall_s"}


def _both(trace, model, caps, setting, unit, block):
  policy, alpha, prior, frequency, lc = setting
  kw = dict(alpha=alpha, prior=prior, frequency=frequency, length_classes=lc)
  out = []
  for backend in cp.BACKENDS:
    got = cp.sweep_checkpoint(trace, model, caps, policy, unit, block, backend=backend, **kw)
    out.append([(t, _without_wall(x)) for t, x in got])
  return out


@settings(
  max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(
  seed=st.integers(0, 10_000),
  kind=st.sampled_from(["agentic", "chat", "linear_chat"]),
  model=st.sampled_from([TINY, TINY, ATTN_ONLY, SWA_ONLY]),
  setting=st.sampled_from(SETTINGS),
  unit=st.sampled_from([4, 16]),
  pages=st.sampled_from([1, 3]),
  slack=st.lists(st.integers(0, 3000), min_size=1, max_size=3),
)
def test_compiled_equals_python(seed, kind, model, setting, unit, pages, slack, monkeypatch_retune):
  if kind == "agentic":
    trace = agentic(seed=seed, num_sessions=6, sys_prompt_len=96, min_turns=2, max_turns=6)
  elif kind == "linear_chat":  # no truncation: `adaptive` learns to retire superseded states
    trace = chat(
      seed=seed, num_sessions=6, min_turns=6, max_turns=12, user_mean=12.0, out_mean=10.0,
      vocab=50, max_context=4096,
    )  # fmt: skip
  else:
    trace = small_chat(40, seed=seed)
  longest = max(r.num_tokens for r in trace.requests)
  block = unit * pages
  floor = model.state_bytes + 4 * (longest + block) + 64
  caps = [floor + s for s in slack]  # tight (recompute fallbacks, evictions) to roomy
  compiled, python = _both(trace, model, caps, setting, unit, block)
  assert compiled == python


@pytest.fixture(name="monkeypatch_retune", scope="module")
def _retune_often():
  """`adaptive` re-tunes every 8 requests (switches and re-weighting happen on small traces)."""
  mp = pytest.MonkeyPatch()
  mp.setattr(weightings, "RETUNE_EVERY", 8)
  yield
  mp.undo()


def test_compiled_switches_weighting_and_evicts(monkeypatch):
  # the differential above is only as strong as what it exercises: here the live cache of a
  # tight point re-tunes to another weighting (re-weighting its heap) and evicts
  monkeypatch.setattr(weightings, "RETUNE_EVERY", 8)
  trace = agentic(seed=4, num_sessions=8, sys_prompt_len=256, min_turns=3, max_turns=8)
  longest = max(r.num_tokens for r in trace.requests)
  cap = TINY.state_bytes + 4 * longest + 64
  compiled, python = _both(trace, TINY, [cap], SETTINGS[0], 16, 48)
  assert compiled == python
  ((_, extra),) = compiled
  assert extra["states_evicted"] > 0
  assert len(extra["alpha_requests"]) > 1, extra["alpha_requests"]


def test_backend_is_checked():
  trace = small_chat(4)
  with pytest.raises(ValueError, match="backend must be one of"):
    cp.sweep_checkpoint(trace, TINY, [1e6], "adaptive", backend="numba")


def test_flops_beyond_int64_fall_back_to_python(monkeypatch):
  # a FLOPs value the compiled bank cannot hold: the sweep runs on `UnitCache` instead
  calls = []
  real = compiled_replay.CompiledBank.start
  monkeypatch.setattr(compiled_replay.CompiledBank, "start", lambda s: calls.append(1) or real(s))
  huge = dataclasses.replace(TINY, name="huge", d_model=2**40)
  trace = small_chat(12)
  cap = [huge.state_bytes + huge.kv_bytes_per_token * 200]
  got = cp.sweep_checkpoint(trace, huge, cap, "ckpt_branch", 4, 4)
  assert not calls
  reference = cp.sweep_checkpoint(trace, huge, cap, "ckpt_branch", 4, 4, backend="python")
  assert got[0][0] == reference[0][0]


@pytest.mark.parametrize("backend", cp.BACKENDS)
def test_settings_grid_points_equal_their_own_runs(backend, monkeypatch):
  # capacity x eviction setting in one replay (one walk, one bank): each point is the replay
  # of its own `run_checkpoint`
  monkeypatch.setattr(weightings, "RETUNE_EVERY", 8)
  trace = agentic(seed=7, num_sessions=8, sys_prompt_len=128, min_turns=2, max_turns=6)
  longest = max(r.num_tokens for r in trace.requests)
  floor = TINY.state_bytes + 4 * (longest + 48) + 64
  caps = [floor + 200, floor + 1500]
  settings = [
    None,
    weightings.Weighting("hits/1", 1.0, "hits", True),
    weightings.PLAIN_LRU,
    weightings.Weighting("reach/0", 0.0, "reach", True),
  ]
  grid = cp.sweep_settings(trace, TINY, caps, "adaptive", settings, 16, 48, backend=backend)
  assert [len(row) for row in grid] == [len(caps)] * len(settings)
  for setting, row in zip(settings, grid):
    for cap, (triples, extra) in zip(caps, row):
      if setting is None:
        alone = cp.run_checkpoint(trace, TINY, cap, "adaptive", 16, 48)
      elif setting.alpha is None:  # plain LRU under adaptive's placement
        alone = cp.sweep_settings(trace, TINY, [cap], "adaptive", [setting], 16, 48)[0][0]
      else:
        alone = cp.run_checkpoint(
          trace, TINY, cap, "adaptive", 16, 48, setting.alpha, setting.prior, setting.frequency
        )
      assert triples == alone[0]
      assert _without_wall(extra) == _without_wall(alone[1])
  lru_row, tuned_row = grid[2], grid[0]
  assert lru_row[0][1]["alpha"] is None and tuned_row[0][1]["weighting"] is not None


def test_settings_are_checked():
  trace = small_chat(4)
  with pytest.raises(ValueError, match="online re-tuning"):
    cp.sweep_settings(trace, TINY, [1e6], "ckpt_branch", [None])
  with pytest.raises(ValueError, match="alpha must be None or in"):
    cp.sweep_settings(
      trace, TINY, [1e6], "ckpt_branch", [weightings.Weighting("hits/1", 1.0, "hits", True)]
    )
  with pytest.raises(ValueError, match="prior must be one of"):
    cp.sweep_settings(
      trace, TINY, [1e6], "adaptive", [weightings.Weighting("x", 1.0, "often", True)]
    )
  with pytest.raises(ValueError, match="a setting must be None or"):
    cp.sweep_settings(trace, TINY, [1e6], "adaptive", [1.0])
  with pytest.raises(ValueError, match="a setting must be None or"):
    cp.sweep_settings(trace, TINY, [1e6], "adaptive", [(1.0, "hits", True)])  # a tuple is not one
  with pytest.raises(ValueError, match="penultimate"):
    cp.sweep_settings(trace, TINY, [1e6], "ckpt_branch", [weightings.LRU2])
  with pytest.raises(ValueError, match="settings must hold at least one"):
    cp.sweep_settings(trace, TINY, [1e6], "adaptive", [])


def test_threads_give_the_same_replay(monkeypatch):
  # the compiled bank deals its caches to one thread per CPU: any count gives the same points
  monkeypatch.setattr(weightings, "RETUNE_EVERY", 8)
  trace = agentic(seed=3, num_sessions=8, sys_prompt_len=128, min_turns=2, max_turns=6)
  longest = max(r.num_tokens for r in trace.requests)
  caps = [TINY.state_bytes + 4 * (longest + 48) + s for s in (100, 900, 4000)]
  got = []
  for threads in (1, 3, 8):
    monkeypatch.setattr(checkpoint_sweep, "_cpus", lambda n=threads: n)
    out = cp.sweep_checkpoint(trace, TINY, caps, "adaptive", 16, 48)
    got.append([(t, _without_wall(x)) for t, x in out])
  assert got[0] == got[1] == got[2]


@pytest.mark.parametrize(
  ("model", "seed"), [(TINY, 0), (TINY, 1), (ATTN_ONLY, 2), (SWA_ONLY, 3), (TINY, 4)]
)
def test_lru2_compiled_equals_python(model, seed):
  # LRU-2 on chains (penultimate access times) and GreedyDual side by side, fixed settings
  trace = small_chat(60, seed=seed) if seed % 2 else agentic(seed=seed, num_sessions=8)
  longest = max(r.num_tokens for r in trace.requests)
  floor = model.state_bytes + 4 * (longest + 48) + 64
  caps = [floor + 100, floor + 700, floor + 3000]
  settings = [weightings.LRU2, weightings.Weighting("hits/1", 1.0, "hits", True), None]
  got = [
    [[(t, _without_wall(x)) for t, x in row] for row in cp.sweep_settings(
      trace, model, caps, "adaptive", settings, 16, 48, backend=backend
    )]
    for backend in cp.BACKENDS
  ]  # fmt: skip
  assert got[0] == got[1]
  lru2 = got[0][0]
  assert any(x["states_evicted"] for _, x in lru2)


def test_run_checkpoint_penultimate_is_the_lru2_setting():
  trace = agentic(seed=6, num_sessions=6)
  longest = max(r.num_tokens for r in trace.requests)
  cap = TINY.state_bytes + 4 * (longest + 48) + 500
  alone = cp.run_checkpoint(trace, TINY, cap, "adaptive", 16, 48, penultimate=True)
  (grid,) = cp.sweep_settings(trace, TINY, [cap], "adaptive", [weightings.LRU2], 16, 48)
  assert alone[0] == grid[0][0] and alone[1]["alpha"] is None
  conc = cp.run_checkpoint(
    trace, TINY, cap, "adaptive", 16, 48, penultimate=True, replay="concurrent"
  )
  assert len(conc[0]) == len(trace)
  with pytest.raises(ValueError, match="penultimate"):
    cp.run_checkpoint(trace, TINY, cap, "adaptive", 16, 48, alpha=1.0, penultimate=True)
  with pytest.raises(ValueError, match="penultimate"):
    cp.run_checkpoint(trace, TINY, cap, "ckpt_branch", 16, 48, penultimate=True)
