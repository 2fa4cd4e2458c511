"""Checkpoint unit U decoupled from the KV page B: exact bytes, hits, placements, `adaptive`."""

import json

import numpy as np
import pytest

from hybrid_cache.sim import adaptive_stats
from hybrid_cache.sim import checkpoint_placement as placement
from hybrid_cache.sim import checkpoint_policies as cp
from hybrid_cache.sim import checkpoint_replay
from hybrid_cache.sim import eviction_weightings as weightings
from hybrid_cache.sim.checkpoint_cache import UnitCache
from hybrid_cache.sim.checkpoint_costs import CacheSizes
from hybrid_cache.sim.cli import main
from hybrid_cache.sim.cost_model import get_model
from hybrid_cache.sim.metrics import flops_saved
from hybrid_cache.sim.offline_bound import offline_bound
from hybrid_cache.sim.oracle import oracle_reused
from hybrid_cache.sim.policies import UNIT_ADAPTIVE
from hybrid_cache.sim.seen_trie import SeenTrie
from hybrid_cache.sim.simulate import simulate
from hybrid_cache.sim.synthetic import agentic
from hybrid_cache.sim.testing import TINY
from hybrid_cache.sim.testing import small_chat
from hybrid_cache.sim.testing import trace_of
from hybrid_cache.sim.trace import write_marconi

POLICIES = ("adaptive", "ckpt_dense", "ckpt_sparse:3", "ckpt_branch")


def _pages_from_scratch(c: UnitCache) -> int:
  """KV pages of the present nodes, recounted: pages ending in a node + leaves ending mid-page."""
  u, b = c.sizes.unit, c.sizes.block_size
  total = 0
  kids = [0] * len(c.present)
  for n, on in enumerate(c.present):
    p = c.trie.parent[n]
    if on and p >= 0:
      assert c.present[p], "present nodes are prefix-closed"
      kids[p] += 1
  for n, on in enumerate(c.present):
    if on:
      end = c.trie.depth[n] * u
      total += end // b - (end - u) // b + (1 if kids[n] == 0 and end % b else 0)
  assert kids == c.nchild
  return total


def _replay_checked(trace, cap, policy, unit, block, alpha=None):
  """Replays like `run_checkpoint`, checking the byte invariants after every request."""
  rule, k = placement.parse_placement(policy)
  sizes = CacheSizes.of(TINY, cap, unit, block)
  trie = SeenTrie(unit)
  stats = adaptive_stats.DivergenceStats()
  c = UnitCache(trie, sizes, TINY, alpha)
  hits = []
  for r, req in enumerate(trace.requests):
    path, seen = trie.walk(req)
    n_in = req.num_input_tokens
    n_comp = n_in + max(req.num_output_tokens - 1, 0)
    cap_u = (n_in - 1) // unit
    cands = []
    if rule in ("ckpt_branch", "adaptive"):
      cands = placement.candidates(rule, stats, len(path), n_in // unit, seen)
    h = c.serve(r, path, cap_u, n_comp, placement._placer(rule, k, len(path), cands))
    hits.append(h)
    assert c.pages == _pages_from_scratch(c)
    assert c.nckpt == sum(c.ckpt)
    assert c.used == c.pages * block * TINY.kv_bytes_per_token + c.nckpt * sizes.ckpt_bytes
    assert c.used <= cap
    assert h % unit == 0 and h <= n_in - 1
    if 0 < seen < cap_u:
      stats.observe(seen, trie.out[path[seen - 1]])
  return hits


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("unit", "block"), [(4, 4), (4, 12), (4, 6), (8, 1), (3, 64)])
def test_bytes_exact_and_within_capacity(policy, unit, block):
  trace = small_chat(40, seed=2)
  longest = max(r.num_tokens for r in trace.requests)
  for cap in (TINY.state_bytes + 4 * (longest + 2 * block), 2_000, 20_000):
    hits = _replay_checked(trace, cap, policy, unit, block, 1.0 if policy == "adaptive" else None)
    oracle = oracle_reused(trace, 1)
    assert all(h <= o for h, o in zip(hits, oracle.tolist()))


def test_state_never_padded_to_a_page():
  # one request of 24 input + 1 output token, U = 4, B = 16: KV pages 2 (tokens 0..23 kept up to
  # the deepest checkpoint, unit 6 ends at token 24, inside page 1), states 34 B each, unpadded
  trace = trace_of((list(range(1, 25)), [99]))
  trie = SeenTrie(4)
  sizes = CacheSizes.of(TINY, 10_000, 4, 16)
  c = UnitCache(trie, sizes, TINY, None)
  path, _ = trie.walk(trace.requests[0])
  c.serve(0, path, 5, 24, lambda d: [(q, 0) for q in range(d + 1, len(path) + 1)])
  assert sizes.ckpt_bytes == TINY.state_bytes == 34
  assert c.nckpt == 6 and c.pages == 2
  assert c.used == 2 * 16 * 4 + 6 * 34


def test_recurrent_hit_needs_state_at_exactly_that_position():
  # U = 4: the first request keeps states at 8 (branch-free: its input end) only under
  # ckpt_sparse:2; a later request sharing 12 tokens hits 8, not 12 (no state at 12)
  a = list(range(1, 17))
  trace = trace_of((a, [50]), (a[:12] + [60, 61, 62, 63, 64], [70]))
  triples, _ = cp.run_checkpoint(trace, TINY, 10_000, "ckpt_sparse:2", unit=4, block_size=4)
  assert [t[2] for t in triples] == [0, 8]
  triples, _ = cp.run_checkpoint(trace, TINY, 10_000, "ckpt_dense", unit=4, block_size=4)
  assert [t[2] for t in triples] == [0, 12]


def test_branch_point_gets_a_state_on_second_sighting():
  sys_prompt = list(range(1, 13))
  trace = trace_of(
    (sys_prompt + [20, 21, 22, 23], [1]),
    (sys_prompt + [30, 31, 32, 33], [1]),
    (sys_prompt + [40, 41, 42, 43], [1]),
  )
  triples, _ = cp.run_checkpoint(trace, TINY, 10_000, "ckpt_branch", unit=4, block_size=4)
  assert [t[2] for t in triples] == [0, 0, 12]


@pytest.mark.parametrize("policy", POLICIES)
def test_online_prefix_of_a_cut_trace(policy, tmp_path, monkeypatch):
  monkeypatch.setattr(weightings, "RETUNE_EVERY", 4)  # adaptive re-tunes several times in the cut
  trace = agentic(seed=3, num_sessions=6, sys_prompt_len=300, min_turns=3, max_turns=6)
  trace = trace.head(60)
  path = tmp_path / "t.jsonl"
  write_marconi(trace, path)
  dumps = []
  for limit in (None, 37, 11):
    out = tmp_path / f"d{limit}.json"
    argv = [
      "--trace",
      str(path),
      "--format",
      "marconi",
      "--model",
      "marconi_7b",
      "--capacity-bytes",
      "3e9",
      "--policy",
      UNIT_ADAPTIVE if policy == "adaptive" else policy,  # the unit cache's name on the CLI
      "--checkpoint-unit",
      "64",
      "--block-size",
      "128",
      "--no-oracle",
      "--dump",
      str(out),
    ]
    if limit is not None:
      argv += ["--limit", str(limit)]
    assert main(argv) == 0
    dumps.append(json.loads(out.read_text()))
  full = dumps[0]
  assert any(t[2] for t in full)
  if policy == "adaptive":
    _, extra = simulate(trace, get_model("marconi_7b"), 3e9, UNIT_ADAPTIVE, 128, checkpoint_unit=64)
    assert len(extra["alpha_requests"]) > 1  # the weighting did change during the replay
  assert dumps[1] == full[:37]
  assert dumps[2] == full[:11]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nothing_exceeds_offline_bound(seed):
  trace = small_chat(30, seed=seed)
  longest = max(r.num_tokens for r in trace.requests)
  for cap in (TINY.state_bytes + 4 * longest + 64, 1_200, 4_000):
    for unit in (1, 4):
      bound = offline_bound(trace, TINY, cap, unit, iterations=60, objective="both")
      for policy in POLICIES:
        for block in (unit, 8):
          triples, _ = cp.run_checkpoint(trace, TINY, cap, policy, unit=unit, block_size=block)
          reused = np.array([t[2] for t in triples])
          assert flops_saved(TINY, reused) <= bound.bound_flops, (policy, cap, unit, block)
          assert int(reused.sum()) <= bound.bound_tokens
      for policy in ("vllm_default",):
        if cap < 1_000:
          continue  # the core needs pages for the longest request per group
        triples, _ = simulate(trace, TINY, cap, policy, 4, core={"backend": "reference"})
        reused = np.array([t[2] for t in triples])
        assert flops_saved(TINY, reused) <= bound.bound_flops


def test_divergence_stats_learn_alignment_and_output_reuse():
  s = adaptive_stats.DivergenceStats()
  assert s.alignment() == 1 and not s.output_reused()
  for d in range(1, 40):
    s.observe(8 * d, False)
  assert s.alignment() == 8 and not s.output_reused()
  t = adaptive_stats.DivergenceStats()
  for d in range(1, 40):
    t.observe(d, True)
  assert t.alignment() == 1 and t.output_reused()


def test_adaptive_alpha_retuned_online_and_placements_counted():
  trace = agentic(seed=1, num_sessions=8, sys_prompt_len=256, min_turns=4, max_turns=8)
  longest = max(r.num_tokens for r in trace.requests)
  cap = TINY.state_bytes + 4 * longest + 4 * 600
  triples, extra = cp.run_checkpoint(trace, TINY, cap, "adaptive", unit=16, block_size=64)
  assert sum(extra["alpha_requests"].values()) == len(trace)
  assert extra["weighting"] in [w.name for w in weightings.SHADOW_WEIGHTINGS]
  assert extra["states_admitted"] >= extra["states_evicted"] > 0
  assert any(t[2] for t in triples)


def test_cli_contract_and_errors(tmp_path, capsys):
  trace = small_chat(20)
  path = tmp_path / "t.jsonl"
  write_marconi(trace, path)
  base = ["--trace", str(path), "--format", "marconi", "--model", "marconi_7b"]
  assert main(base + ["--capacity-bytes", "2e9", "--policy", UNIT_ADAPTIVE]) == 0
  out = json.loads(capsys.readouterr().out)
  assert out["checkpoint_unit"] == 64 and out["block_size"] == 64
  assert {"token_hit_rate", "flops_saved", "states_admitted"} <= set(out)
  argv = base + ["--capacity-bytes", "2e9", "--policy", "ckpt_sparse:0"]
  assert main(argv) == 2
  assert "ckpt_sparse's K must be an integer >= 1" in capsys.readouterr().err
  argv = base + ["--capacity-bytes", "2e9", "--policy", "ckpt_branch", "--alpha", "1"]
  assert main(argv) == 2
  assert "alpha applies to ckpt_adaptive only" in capsys.readouterr().err
  argv = base + ["--capacity-bytes", "2e9", "--policy", "adaptive", "--alpha", "1"]
  assert main(argv) == 2  # the core's adaptive re-tunes by itself: no silent --alpha
  assert "alpha applies to flop_aware and ckpt_adaptive only" in capsys.readouterr().err
  with pytest.raises(ValueError, match="unit must be an integer >= 1"):
    CacheSizes.of(TINY, 100.0, 0, 4)


def test_ttft_charges_checkpoint_and_restore_copies():
  a = list(range(1, 17))
  trace = trace_of((a, [50]), (a + [60, 61, 62, 63, 64], [70]))
  triples, extra = cp.run_checkpoint(trace, TINY, 10_000, "ckpt_sparse:2", unit=4, block_size=4)
  # request 0 writes states at 8 and 16 tokens; request 1 restores the one at 16 and writes
  # none (sparse:2's next point, 24 tokens, lies past its 5 whole computed units): 3 copies
  assert [t[2] for t in triples] == [0, 16]
  copies = (2 + 1) * TINY.state_bytes
  assert extra["checkpoint_copy_bytes"] == copies
  base = TINY.ttft_ms(np.array([16, 5])).mean()
  per_ms = checkpoint_replay.STATE_COPY_GB_PER_S * 1e6
  assert extra["ttft_mean_ms_with_copies"] == pytest.approx(base + copies / per_ms / 2)


def test_reweigh_puts_every_held_checkpoint_under_the_new_weighting():
  """After a re-tune switch (`eviction_weightings._retune`) the live cache's heap orders its
  units by the one weighting it now has: under hits/1 the weights differ from 1; switched to
  plain LRU and re-weighed, every valid heap entry is its stamp + 1 (nothing evicted)."""
  trace = agentic(seed=1, num_sessions=8, sys_prompt_len=256, min_turns=4, max_turns=8)
  stats = adaptive_stats.DivergenceStats()
  trie = SeenTrie(16)
  sizes = CacheSizes.of(TINY, 1e9, 16, 64)
  c = UnitCache(trie, sizes, TINY, 1.0, "hits", True, retuned=True)
  for r, req in enumerate(trace.requests):
    path, seen = trie.walk(req)
    cap_u = (req.num_input_tokens - 1) // 16
    cands = placement.candidates("adaptive", stats, len(path), req.num_input_tokens // 16, seen)
    n_comp = req.num_input_tokens + max(req.num_output_tokens - 1, 0)
    c.serve(r, path, cap_u, n_comp, placement._placer("adaptive", 1, len(path), cands))
    if 0 < seen < cap_u:
      stats.observe(seen, trie.out[path[seen - 1]])

  def weights():
    return {n: prio - c.stamp[n] for prio, seq, n in c.heap if c.entry.get(n) == seq}

  held = set(c.entry)
  assert len(held) > 3 and any(w != 1.0 for w in weights().values())
  c.retune(weightings.PLAIN_LRU)
  assert set(c.entry) == held and set(weights()) == held
  assert set(weights().values()) == {1.0}
