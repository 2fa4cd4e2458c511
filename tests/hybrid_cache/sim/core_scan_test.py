"""The scan replay (`core_scan.py`) against the protocol path, its prefix hashes, counters,
capacity errors and the state invariants after every request."""

import dataclasses
import os

import numpy as np
import pytest

from hybrid_cache import hashing
from hybrid_cache.core import invariants
from hybrid_cache.sim import core_scan
from hybrid_cache.sim import core_sim
from hybrid_cache.sim import synthetic
from hybrid_cache.sim import trace as T
from hybrid_cache.sim.testing import TINY
from hybrid_cache.sim.testing import small_chat

MOONCAKE = os.path.join(
  os.path.dirname(__file__), "../../../experiments/traces/mooncake_conversation_trace.jsonl"
)
CHUNK = 16  # one compile per config for every test trace


def _agent(n, seed=1):
  return synthetic.agent(
    seed=seed,
    num_sessions=max(1, n // 3),
    min_turns=3,
    max_turns=8,
    obs_mean=8.0,
    out_mean=6.0,
    sys_prompt_len=12,
    keep_last=2,
    stub_len=2,
    max_context=100,
    vocab=40,
  ).head(n)


def _mooncake(n):
  rows = T.read_mooncake_rows(MOONCAKE, limit=400, max_input=2048)
  return T.mooncake_trace(rows[:n])


# ---- prefix hashes


def _classes(h):
  """Equality pattern of hash rows: index of the first equal row for each row."""
  keys = hashing.as_u64(h)
  first = {}
  return [first.setdefault(int(k), i) for i, k in enumerate(keys)]


def test_prefix_hashes_identify_the_same_prefixes_as_blake2b():
  tr = small_chat(30, seed=4)
  ends = np.array([r.num_tokens for r in tr.requests], np.int64)
  got, nblk = core_scan._prefix_hashes(tr, 4, ends)
  ref = np.concatenate(
    [hashing.block_hashes(core_sim.request_tokens(r).tolist(), 4) for r in tr.requests]
  )
  assert got.shape == ref.shape == (int(nblk.sum()), 2)
  assert _classes(got) == _classes(ref)
  assert len(set(_classes(got))) < len(got)  # the trace really shares prefixes


def test_prefix_hashes_of_mooncake_symbols_equal_the_token_level_form():
  tr = _mooncake(40)
  tok = T.tokens_trace(tr)
  ends = np.array([r.num_tokens for r in tr.requests], np.int64)
  a, na = core_scan._prefix_hashes(tr, 64, ends)
  b, nb = core_scan._prefix_hashes(tok, 64, ends)
  np.testing.assert_array_equal(na, nb)
  np.testing.assert_array_equal(a, b)
  # a shorter end (the prompt) gives a prefix of the same rows
  n_in = np.array([r.num_input_tokens for r in tr.requests], np.int64)
  c, nc = core_scan._prefix_hashes(tr, 64, n_in)
  off_a = np.concatenate([[0], np.cumsum(na)[:-1]])
  off_c = np.concatenate([[0], np.cumsum(nc)[:-1]])
  for i in range(len(tr)):
    np.testing.assert_array_equal(c[off_c[i] : off_c[i] + nc[i]], a[off_a[i] : off_a[i] + nc[i]])


# ---- scan == protocol


def _reused(tri):
  return [r for _, _, r in tri]


@pytest.mark.parametrize(
  "policy, make, cap",
  [
    ("vllm_default", lambda: small_chat(48), 34 * 60),
    ("all_dense_no_junction", lambda: small_chat(48, seed=2), 34 * 70),
    ("vllm_align_dense", lambda: _agent(36), 34 * 90),
    ("align_dense_no_junction", lambda: _agent(36, seed=3), 34 * 90),
  ],
)
def test_scan_matches_protocol_on_synthetic_traces(policy, make, cap):
  tr = make()
  cfg, _ = core_sim.build_config(tr, TINY, cap, policy, 4)
  a, ca = core_sim.run_core(tr, cfg, "reference")
  b, cb = core_scan.run_scan(tr, cfg, chunk=CHUNK)
  assert _reused(a) == _reused(b)
  assert a == b
  assert ca["final_cached_blocks_per_group"] == cb["final_cached_blocks_per_group"]
  assert ca["recurrent_blocks_held_at_finish"] == cb["recurrent_blocks_held_at_finish"]
  assert sum(_reused(b)) > 0


def test_scan_matches_both_protocol_backends_on_a_mooncake_excerpt():
  tr = _mooncake(24)
  # 64-token blocks divide Mooncake's 512-token hash blocks; capacity forces evictions
  cfg, _ = core_sim.build_config(tr, TINY, 256 * 100, "vllm_default", 64)
  told = {"reference": [], "scan": []}
  a, _ = core_sim.run_core(tr, cfg, "reference", progress=told["reference"].append)
  j, cj = core_sim.run_core(tr, cfg, "jax")
  b, cb = core_scan.run_scan(tr, cfg, chunk=CHUNK, progress=told["scan"].append)
  assert _reused(a) == _reused(j) == _reused(b)
  # progress: the requests replayed so far, after each request (protocol) or chunk (scan)
  assert told["reference"] == list(range(1, len(tr) + 1))
  assert told["scan"] == [min(e, len(tr)) for e in range(CHUNK, len(tr) + CHUNK, CHUNK)]
  assert cj["final_cached_blocks_per_group"] == cb["final_cached_blocks_per_group"]
  assert sum(_reused(b)) > 0


def test_replay_routes_backends(monkeypatch):
  monkeypatch.setattr(core_scan, "DEFAULT_CHUNK", CHUNK)
  tr = small_chat(48)  # same config and shapes as the lru case above: no new compile
  cfg, _ = core_sim.build_config(tr, TINY, 34 * 60, "vllm_default", 4)
  a, ca = core_sim.replay(tr, cfg, "jax")
  b, cb = core_sim.replay(tr, cfg, "reference")
  assert a == b and ca["backend"] == "jax_scan" and cb["backend"] == "reference"
  with pytest.raises(ValueError, match="backend must be one of"):
    core_sim.replay(tr, cfg, "tpu")


# ---- counters, errors, invariants


def test_states_admitted_and_evicted_match_the_protocol_core():
  tr = small_chat(48)
  cfg, _ = core_sim.build_config(tr, TINY, 34 * 60, "vllm_default", 4)
  _, cp = core_sim.run_core(tr, cfg, "jax")
  _, cs = core_scan.run_scan(tr, cfg, chunk=CHUNK)
  assert cs["states_admitted"] == cp["states_admitted"] > 0
  assert cs["states_evicted"] == cp["states_evicted"]
  assert 0 <= cs["states_evicted"] <= cs["states_admitted"]
  cfg0, _ = core_sim.build_config(tr, TINY, 34 * 60, "vllm_none", 4)
  _, c0 = core_scan.run_scan(tr, cfg0, chunk=CHUNK)
  assert c0["states_admitted"] == 0 and c0["states_evicted"] == 0


def test_request_that_cannot_progress_raises():
  tr = small_chat(8)
  cfg, _ = core_sim.build_config(tr, TINY, 34 * 60, "vllm_default", 4)
  small = dataclasses.replace(cfg, num_blocks=4)
  with pytest.raises(ValueError, match="request 0 made no progress"):
    core_scan.run_scan(tr, small, chunk=CHUNK)
  with pytest.raises(ValueError, match="chunk must be"):
    core_scan.run_scan(tr, cfg, chunk=0)


def _soak(n, chunk):
  tr = small_chat(n, seed=7)
  cfg, _ = core_sim.build_config(tr, TINY, 34 * 70, "vllm_default", 4)
  bad = []

  def check(i, state):
    errs = invariants.check_invariants(cfg, state)
    if errs:
      bad.append((i, errs))

  tri, counters = core_scan.run_scan(tr, cfg, chunk=chunk, on_chunk=check)
  assert bad == []
  assert len(tri) == n and sum(r for _, _, r in tri) > 0
  assert counters["final_cached_blocks_per_group"][1] > 0


def test_invariants_after_every_request_100():
  _soak(100, 1)


def test_invariants_after_every_request_10k():
  _soak(10_000, 1)


# ---- FLOP-aware eviction


def _flop_config(tr, cap):
  cfg, _ = core_sim.build_config(tr, TINY, cap, "flop_aware", 4)
  return cfg


def test_flop_aware_scan_matches_protocol_and_alpha_zero_is_lru():
  tr = small_chat(48)
  cfg = _flop_config(tr, 34 * 60)
  assert len(cfg.eviction_flops_linear) == 2 and cfg.eviction_block_bytes == (34.0, 34.0)
  lru, _ = core_scan.run_scan(
    tr, core_sim.build_config(tr, TINY, 34 * 60, "vllm_default", 4)[0], chunk=CHUNK
  )
  zero, _ = core_scan.run_scan(tr, cfg, chunk=CHUNK, alpha=0.0)
  assert zero == lru
  s, cs = core_scan.run_scan(tr, cfg, chunk=CHUNK, alpha=5.0)
  p, cp = core_sim.run_core(tr, cfg, "jax", alpha=5.0)
  assert s == p and s != lru  # alpha 5 changes the victims here
  assert cs.get("states_evicted") == cp.get("states_evicted")
  ref, _ = core_sim.run_core(tr, cfg, "reference", alpha=5.0)  # the plain-Python twin
  assert ref == s


def test_scan_matches_protocol_with_swa_and_pinning():
  # full + sliding window (8 tokens) + recurrent groups, the pinned tier on, under pressure
  model = dataclasses.replace(TINY, name="tiny_swa", n_swa=1, swa_window=8)
  tr = small_chat(40, seed=6)
  cfg, sizing = core_sim.build_config(tr, model, 34 * 90, "vllm_default", 4, pinning=True)
  assert sizing["groups"] == ["full", "swa", "mamba"] and cfg.pinning
  a, ca = core_sim.run_core(tr, cfg, "reference")
  b, cb = core_scan.run_scan(tr, cfg, chunk=CHUNK)
  assert a == b and sum(_reused(b)) > 0
  assert ca["final_pinned_blocks"] == cb["final_pinned_blocks"]
  assert ca["final_cached_blocks_per_group"] == cb["final_cached_blocks_per_group"]


def test_tuned_alpha_follows_marconis_schedule_on_the_protocol_path():
  from hybrid_cache.core.policies import flop_aware

  pytest.importorskip("hybrid_cache.core.alpha_tuning")
  from hybrid_cache.sim.metrics import flops_saved

  tr = small_chat(48)
  cfg = _flop_config(tr, 34 * 60)
  grid = (0.5, 1.0)  # no 0: the tuned alpha is never LRU here
  opts = {"multiplier": 2, "grid": grid}
  tri, c = core_scan.run_scan(tr, cfg, chunk=CHUNK, alpha="tuned", tune_model=TINY, tune_opts=opts)
  t = c["alpha_tuning"]
  e, w, a = t["first_eviction"], t["window"], t["alpha"]
  assert e is not None and w == 2 * (e + 1) < len(tr) and a in grid
  # scores: FLOPs saved over the last 500 of the first W requests, each alpha from empty
  for g, score in t["scores"]:
    p, _ = core_sim.run_core(tr.head(w), cfg, "jax", alpha=g)
    assert score == float(flops_saved(TINY, np.array(_reused(p))[-500:]))
  assert a == max(t["scores"], key=lambda x: x[1])[0]

  # the live run: alpha 0 for requests [0, W), then the tuned alpha (switched on the protocol
  # path right after request W - 1 is freed)
  def switch(i, m):
    if i == w - 1:
      m.state = flop_aware.set_alpha(m.state, a)

  ref, _ = core_sim.run_core(tr, cfg, "jax", on_request=switch, alpha=0.0)
  assert tri == ref


def test_tuned_eviction_takes_the_weighting_of_its_best_shadow(monkeypatch):
  """Eviction `tuned` (`core_scan._replay_shadowed`), re-tuned every 8 requests: its shadows
  are the fixed-weighting replays, so the switches follow from their per-request FLOPs (the
  unit cache's decayed score); the live run equals the twin's protocol run (the reference
  backend) switched after the same requests."""
  from hybrid_cache.core.policies.tuned import WEIGHTINGS

  monkeypatch.setattr(core_scan, "RETUNE_EVERY", 8)
  tr = small_chat(48)  # at this capacity LRU-2 leads from request 16 to 40, then GreedyDual
  cfg, _ = core_sim.build_config(tr, TINY, 34 * 40, "tuned", 4, retirement="superseded")
  told = []
  tri, c = core_scan.run_scan(tr, cfg, chunk=8, tune_model=TINY, progress=told.append)
  assert told == list(range(8, len(tr) + 1, 8))  # after each re-tuning interval (48 = 6 x 8)
  t = c["weighting_tuning"]
  fixed = {w: _reused(core_scan.run_scan(tr, cfg, chunk=8, weighting=w)[0]) for w in WEIGHTINGS}
  decay = 0.5 ** (1.0 / core_scan.RETUNE_HALF_LIFE)
  score, cur, want = [0.0, 0.0], 0, []
  for i in range(len(tr)):
    for k, w in enumerate(WEIGHTINGS):
      r = fixed[w][i]
      score[k] = score[k] * decay + (TINY.prefill_flops(r) if r else 0)
    if (i + 1) % 8 == 0:
      best = max(range(2), key=lambda k: (score[k], -k))
      if best != cur:
        want.append((i + 1, WEIGHTINGS[best]))
        cur = best
  assert len(want) == 2 and t["switches"] == want
  assert t["weighting"] == WEIGHTINGS[cur]
  assert sum(t["requests_per_weighting"].values()) == len(tr)
  assert _reused(tri)[:8] == fixed["greedy_dual"][:8]  # GreedyDual until the first switch

  def switch(i, m):
    for e, w in t["switches"]:
      if i == e - 1:
        m.set_eviction_weighting(w)

  ref, _ = core_sim.run_core(tr, cfg, "reference", on_request=switch)
  assert tri == ref


def test_tuned_eviction_needs_the_scan_and_a_cost_model():
  tr = small_chat(8)
  cfg, _ = core_sim.build_config(tr, TINY, 34 * 60, "tuned", 4)
  with pytest.raises(ValueError, match="needs backend 'jax'"):
    core_sim.replay(tr, cfg, "reference")
  with pytest.raises(ValueError, match="needs tune_model"):
    core_scan.run_scan(tr, cfg, chunk=8)
  lru, _ = core_sim.build_config(tr, TINY, 34 * 60, "vllm_default", 4)
  with pytest.raises(ValueError, match="a weighting needs eviction 'tuned'"):
    core_scan.run_scan(tr, lru, chunk=8, weighting="lru2")
