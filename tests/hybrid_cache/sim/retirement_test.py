"""Retiring superseded checkpoints (`UnitCache._retire`, `SupersessionStats`) and LRU-2 as a
shadow eligible only while `adaptive` retires."""

import numpy as np
import pytest

from hybrid_cache.sim import adaptive_stats
from hybrid_cache.sim import checkpoint_placement as placement
from hybrid_cache.sim import checkpoint_policies as cp
from hybrid_cache.sim import eviction_weightings as weightings
from hybrid_cache.sim.checkpoint_cache import UnitCache
from hybrid_cache.sim.checkpoint_costs import CacheSizes
from hybrid_cache.sim.metrics import flops_saved
from hybrid_cache.sim.offline_bound import offline_bound
from hybrid_cache.sim.oracle import oracle_reused
from hybrid_cache.sim.seen_trie import NEVER_REUSED
from hybrid_cache.sim.seen_trie import SeenTrie
from hybrid_cache.sim.synthetic import agentic
from hybrid_cache.sim.synthetic import chat
from hybrid_cache.sim.testing import TINY
from hybrid_cache.sim.testing import trace_of

LEAF, BRANCH = placement.KIND_SEQ_END, placement.KIND_BRANCH


def _linear_chat(seed: int, sessions: int = 8):
  """Chat sessions whose turns re-send the whole history (no truncation): each turn continues
  at the previous turn's end."""
  return chat(
    seed=seed, num_sessions=sessions, min_turns=6, max_turns=12, user_mean=12.0, out_mean=10.0,
    vocab=50, max_context=4096,
  )  # fmt: skip


def _leaf_only(path):
  return lambda d: [(len(path), LEAF)] if len(path) > d else []


def _session(cache, trie, turns, retire):
  """Serves `turns` (requests) in order with a checkpoint at each one's last unit."""
  hits = []
  for r, req in enumerate(turns.requests):
    path, _ = trie.walk(req)
    n_comp = req.num_input_tokens + req.num_output_tokens - 1
    cap = (req.num_input_tokens - 1) // trie.unit
    hits.append(cache.serve(r, path, cap, n_comp, _leaf_only(path), retire=retire))
  return hits


T1 = list(range(1, 17))  # turn 1: 16 input tokens, output 17 -> 4 units computed (U = 4)
T2 = T1 + list(range(17, 25))  # turn 2 re-sends turn 1 and its answer: 6 units computed


@pytest.mark.parametrize("retire", [False, True])
def test_superseded_state_dropped_kv_kept(retire):
  trie = SeenTrie(4)
  c = UnitCache(trie, CacheSizes.of(TINY, 100_000, 4, 4), TINY, None)
  turns = trace_of((T1, [17]), (T2, [25]), (T1 + [90, 91, 92, 93], [94]))
  hits = _session(c, trie, turns, retire)
  # turn 2 hits turn 1's state at 16 tokens; turn 3 branches off at 16: with the superseded
  # state retired it recomputes, without it it hits 16
  assert hits == [0, 16, 0 if retire else 16]
  assert c.retired_ckpts == (1 if retire else 0) and c.evicted_ckpts == 0
  # KV is the same either way: 6 units of the session + turn 3's 5 units from depth 4
  assert c.pages == 7
  assert c.nckpt == (2 if retire else 3)


def test_a_branch_point_is_not_superseded():
  # turn B places a state at depth 4, where it diverges from turn A: that node has two present
  # children, so B's deeper leaf does not retire it, and turn C branching there hits it
  trie = SeenTrie(4)
  c = UnitCache(trie, CacheSizes.of(TINY, 100_000, 4, 4), TINY, None)
  turns = trace_of((T1 + [90, 91, 92, 93], [94]), (T2, [25]), (T1 + [70, 71, 72, 73], [74]))
  hits = []
  for r, req in enumerate(turns.requests):
    path, _ = trie.walk(req)
    n_comp = req.num_input_tokens + req.num_output_tokens - 1
    place = (lambda d: [(4, BRANCH), (6, LEAF)]) if r == 1 else _leaf_only(path)
    hits.append(c.serve(r, path, (req.num_input_tokens - 1) // 4, n_comp, place, retire=True))
  assert hits == [0, 0, 16]
  assert c.retired_ckpts == 0 and c.nckpt == 4


def test_retirement_hands_the_access_history_to_the_deeper_state():
  # LRU-2: turn 1's state is evicted, turn 2 misses and places the branch point again (a ghost
  # with its last access) and its leaf (no history): the leaf takes the retired point's access
  trie = SeenTrie(4)
  c = UnitCache(trie, CacheSizes.of(TINY, 100_000, 4, 4), TINY, None, penultimate=True)
  turns = trace_of((T1, [17]), (T2, [25]))
  p1, _ = trie.walk(turns.requests[0])
  c.serve(0, p1, 3, 16, _leaf_only(p1))
  assert c.fit(0) and c.nckpt == 0  # everything evicted; depth 4 keeps its last access
  p2, _ = trie.walk(turns.requests[1])
  place = lambda d: [(4, BRANCH), (6, LEAF)]  # noqa: E731
  assert c.serve(1, p2, 5, 24, place, retire=True) == 0
  assert c.retired_ckpts == 1 and c.nckpt == 1
  # the ghost's last access was lookup 1 (turn 1); the leaf would otherwise have none (< 0)
  assert c.penult[p2[5]] == 1


class _Trie:
  """What `SupersessionStats.observe` reads of a `SeenTrie`: its size and `reused_from`."""

  def __init__(self, nodes: int):
    self.reused_from = np.full(nodes, NEVER_REUSED, np.int64)

  def __len__(self) -> int:
    return len(self.reused_from)


def test_supersession_counts():
  s = adaptive_stats.SupersessionStats()
  trie = _Trie(8)
  pa = np.arange(8, dtype=np.int64)
  s.observe(trie, 0, pa[:4], 0, [(2, LEAF)])  # request 0 places depth 2: nothing superseded
  assert (s.superseded, s.used) == (0.0, 0.0)
  s.observe(trie, 1, pa[:6], 4, [(6, LEAF)])  # passes depth 2, places 6: depth 2 superseded
  assert (s.superseded, s.used) == (1.0, 0.0)
  assert (trie.reused_from == NEVER_REUSED).all()
  branch = np.array([0, 1, 7], np.int64)
  s.observe(trie, 2, branch, 2, [(3, LEAF)])  # served by depth 2 (used), then superseded again
  assert s.used == 1.0 and s.superseded == pytest.approx(0.995 + 1.0)
  assert trie.reused_from[1] == 2 and (np.delete(trie.reused_from, 1) == NEVER_REUSED).all()
  assert not s.retire()  # too few supersessions
  for r in range(3, 43):  # a linear session: each turn supersedes the last, nothing is used
    s.observe(trie, r, pa[:6], 6, [])
  assert s.share() > adaptive_stats.RETIRE_SHARE and not s.retire()


def test_a_state_seen_reused_is_kept():
  # a system prompt's state (depth 4) that the trie saw reused by request 1 is not retired when
  # request 2 extends it alone; request 0's superseded state would be
  trie = SeenTrie(4)
  c = UnitCache(trie, CacheSizes.of(TINY, 100_000, 4, 4), TINY, None)
  turns = trace_of((T1, [17]), (T2, [25]), (T2 + [25, 26, 27, 28], [29]))
  paths = [trie.walk(q)[0] for q in turns.requests]
  trie.reused_from[paths[0][3]] = 1
  for r, (q, path) in enumerate(zip(turns.requests, paths)):
    n_comp = q.num_input_tokens + q.num_output_tokens - 1
    c.serve(r, path, (q.num_input_tokens - 1) // 4, n_comp, _leaf_only(path), retire=True)
  # request 1 (r = 1 >= reused_from) keeps depth 4; request 2 retires request 1's depth 6
  assert c.ckpt[paths[0][3]] and not c.ckpt[paths[1][5]] and c.retired_ckpts == 1


@pytest.mark.parametrize("seed", [0, 1])
def test_learned_on_linear_chat_not_on_agentic(seed):
  longest = 4096
  cap = TINY.state_bytes + 4 * longest
  _, lin = cp.run_checkpoint(_linear_chat(seed, 16), TINY, cap, "adaptive", 16, 48)
  assert lin["learned_retirement"] and lin["superseded_used_share"] < adaptive_stats.RETIRE_SHARE
  assert lin["states_retired"] > 0
  trace = agentic(seed=seed, num_sessions=16)  # shares 0.21, 0.22 (retire below 0.1)
  _, ag = cp.run_checkpoint(trace, TINY, cap, "adaptive", 16, 48)
  assert not ag["learned_retirement"] and ag["superseded_used_share"] > adaptive_stats.RETIRE_SHARE
  _, branch = cp.run_checkpoint(_linear_chat(seed, 16), TINY, cap, "ckpt_branch", 16, 48)
  assert branch["states_retired"] == 0 and branch["superseded_used_share"] is None


def test_lru2_shadow_eligible_only_while_retiring():
  w = weightings.SHADOW_WEIGHTINGS
  lru2 = [i for i, x in enumerate(w) if x.penultimate]
  assert lru2 == [len(w) - 1] and w[-1] == weightings.LRU2
  score = [1.0] * len(w)
  score[-1] = 5.0
  assert weightings._best_shadow(score, w, retire=True) == len(w) - 1
  assert weightings._best_shadow(score, w, retire=False) == 0  # ties: the first
  trace = agentic(seed=2, num_sessions=16)
  cap = TINY.state_bytes + 4 * 600
  _, ag = cp.run_checkpoint(trace, TINY, cap, "adaptive", 16, 48)
  assert "lru2" not in ag["alpha_requests"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_retirement_compiled_equals_python(seed, monkeypatch):
  # linear sessions: the tuned cache (LRU-2 eligible), LRU-2, GreedyDual and LRU all retire
  monkeypatch.setattr(weightings, "RETUNE_EVERY", 8)
  trace = _linear_chat(seed)
  longest = max(r.num_tokens for r in trace.requests)
  floor = TINY.state_bytes + 4 * (longest + 48) + 64
  caps = [floor + 50, floor + 400, floor + 2000]
  hits1 = weightings.Weighting("hits/1", 1.0, "hits", True)
  settings = [None, weightings.LRU2, hits1, weightings.PLAIN_LRU]
  got = []
  for backend in cp.BACKENDS:
    grid = cp.sweep_settings(trace, TINY, caps, "adaptive", settings, 16, 48, backend=backend)
    strip = lambda x: {k: v for k, v in x.items() if k != "wall_s"}  # noqa: E731
    got.append([[(t, strip(x)) for t, x in row] for row in grid])
  assert got[0] == got[1]
  assert all(x["states_retired"] > 0 for row in got[0] for _, x in row)
  assert any("lru2" in x["alpha_requests"] for _, x in got[0][0])


@pytest.mark.parametrize("seed", [0, 1])
def test_retiring_adaptive_stays_below_offline_bound(seed):
  trace = _linear_chat(seed)
  longest = max(r.num_tokens for r in trace.requests)
  for cap in (TINY.state_bytes + 4 * longest + 64, 1_500, 6_000):
    bound = offline_bound(trace, TINY, cap, 4, iterations=60)
    for setting in (None, weightings.LRU2):
      (((triples, extra),),) = cp.sweep_settings(trace, TINY, [cap], "adaptive", [setting], 4, 8)
      assert extra["states_retired"] > 0
      reused = np.array([t[2] for t in triples])
      assert flops_saved(TINY, reused) <= bound.bound_flops


@pytest.mark.parametrize("replay", cp.REPLAYS)
def test_retirement_is_online(replay):
  # the decision reads requests 0..r-1 only: a cut trace replays as the prefix of the full one
  trace = _linear_chat(3)
  cap = TINY.state_bytes + 4 * 400
  full, extra = cp.run_checkpoint(trace, TINY, cap, "adaptive", 16, 48, replay=replay)
  assert extra["states_retired"] > 0
  for n in (23, 41):
    cut, _ = cp.run_checkpoint(trace.head(n), TINY, cap, "adaptive", 16, 48, replay=replay)
    assert cut == full[:n]


def test_concurrent_replay_retires_within_capacity():
  trace = _linear_chat(4)
  cap = TINY.state_bytes + 4 * 500
  triples, extra = cp.run_checkpoint(trace, TINY, cap, "adaptive", 16, 48, replay="concurrent")
  oracle = oracle_reused(trace, 1)
  assert extra["states_retired"] > 0 and extra["final_cache_bytes"] <= cap
  assert all(t[2] <= o for t, o in zip(triples, oracle.tolist()))
