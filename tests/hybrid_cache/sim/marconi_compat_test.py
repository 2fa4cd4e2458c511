"""Marconi-compat semantics on hand-checked traces (expected values derived by hand from
Marconi's rules, marconi_and_peers.md §1.1-1.4 and §6.3), plus consistency properties."""

import pathlib

import pytest

from hybrid_cache.sim import trace as T
from hybrid_cache.sim.marconi_compat import TUNER_ALPHAS
from hybrid_cache.sim.marconi_compat import run_marconi
from hybrid_cache.sim.oracle import oracle_reused
from hybrid_cache.sim.testing import M7B
from hybrid_cache.sim.testing import TINY
from hybrid_cache.sim.testing import trace_of

MOONCAKE = str(
  pathlib.Path(__file__).resolve().parents[3]
  / "experiments"
  / "traces"
  / "mooncake_conversation_trace.jsonl"
)
# d = N = 1: one state = 1*1*2 + (2 + 2)*4*2 = 34 bytes, KV = 1 layer * 2*1*2 = 4 bytes/token.


def test_tiny_model_bytes():
  assert TINY.state_bytes == 34 and TINY.kv_bytes_per_token == 4


@pytest.mark.parametrize("version", [1, 2, 3])
def test_admission_leaf_and_branch(version):
  # R1 extends R0's whole sequence (leaf state); R2 diverges inside R0's edge -> no reuse, but
  # its insert splits the edge (branch state); R3 reuses the branch (3rd occurrence of [1, 2]).
  tr = trace_of(([1, 2, 3], [4]), ([1, 2, 3, 4, 5], [6]), ([1, 2, 9], []), ([1, 2, 7], []))
  hist, tree = run_marconi(tr, M7B, 1e12, version)
  assert hist == [(False, 3, 0), (True, 5, 4), (False, 3, 0), (True, 3, 2)]
  assert tree.num_nodes == 5 and tree.total_tokens == 8  # [1,2] [3,4] [5,6] [9] [7]


def test_match_continues_after_partial_edge():
  # Marconi's match keeps walking into a partially matched child's children: the key [1,2,4,5,8]
  # diverges inside [1,2,3] but then fully matches its child [4,5] -> 2 "reusable" tokens.
  tr = trace_of(([1, 2, 3], []), ([1, 2, 3, 4, 5], []), ([1, 2, 4, 5, 8], []))
  hist, _ = run_marconi(tr, M7B, 1e12, 1)
  assert hist == [(False, 3, 0), (True, 5, 3), (True, 5, 2)]


def test_v1_lru_refreshes_path():
  # capacity 108 = 2 states + 10 tokens. R2 hits R0 (refreshing it), then needs 38 bytes:
  # 30 over -> LRU leaf is R1 (older access), so R3 = R1's sequence misses.
  tr = trace_of(([1, 2, 3], [4]), ([5, 6, 7], [8]), ([1, 2, 3, 4, 9], []), ([5, 6, 7, 8], []))
  hist, tree = run_marconi(tr, TINY, 108, 1)
  assert hist == [(False, 3, 0), (False, 3, 0), (True, 5, 4), (False, 4, 0)]
  assert tree.tree_bytes <= 108


@pytest.mark.parametrize("alpha, r3_reused", [(0.0, 0), (2.0, 1000)])
def test_static_alpha_flop_aware_choice(alpha, r3_reused):
  # One eviction of >= 1 state is needed at R2. alpha=0 (LRU): the older long R0 goes.
  # alpha=2: R0's FLOPs/byte (normalised 1, x2) outweighs R1's recency (normalised 1): R1 goes.
  long, short = list(range(1000, 2000)), list(range(5000, 5010))
  tr = trace_of((long, []), (short, []), (list(range(6000, 6010)), []), (long, []))
  cap = 2 * M7B.state_bytes + M7B.kv_bytes(1020)
  hist, _ = run_marconi(tr, M7B, cap, 3, alpha)
  assert hist[3] == (r3_reused > 0, 1000, r3_reused)


def test_leaf_eviction_counts_last_candidate_bytes():
  # Capacity 472 = R0 (34 + 400) + R1 (34 + 4). R2 needs 46 bytes, all over budget. Victim R0
  # (LRU) is counted with the KV of the last candidate in DFS order (R1, 1 token): 38 < 46, so
  # R1 is evicted too (R0's real 434 bytes would have sufficed); R3 = R1's sequence misses.
  tr = trace_of((list(range(1, 101)), []), ([200], []), ([300, 301, 302], []), ([200], []))
  hist, tree = run_marconi(tr, TINY, 472, 3, 0.0)
  assert hist[3] == (False, 1, 0)
  assert tree.states_evicted == 2


def test_v2_tunes_once_at_bootstrap_window():
  tr = T.load_mooncake(MOONCAKE, limit=120)
  cap = 1e10
  v2, tree = run_marconi(tr, M7B, cap, 2)
  w = tree.bootstrap_window
  assert w == 5 * tree.num_reqs_before_eviction and w < len(tr)
  v3, _ = run_marconi(tr, M7B, cap, 3, 0.0)
  assert v2[:w] == v3[:w]  # alpha = 0 until the tuning at request #w
  # the tuned alpha maximises V3's FLOPs saved over the first w requests (ties: smallest)
  head = tr.head(w)
  flops = []
  for a in TUNER_ALPHAS:
    h, _ = run_marconi(head, M7B, cap, 3, a)
    flops.append(sum(M7B.prefill_flops(r) for _, _, r in h[-500:] if r))
  assert tree.tuned_alpha == TUNER_ALPHAS[flops.index(max(flops))]


def test_mooncake_excerpt_hand_checked():
  # Rows 0-7 all start with hash id 0, then unique ids. Row 1 splits row 0's edge after block 0
  # (branch state), so rows 2-7 reuse exactly that 512-token block.
  tr = T.load_mooncake(MOONCAKE, limit=8)
  for v in (1, 2, 3):
    hist, _ = run_marconi(tr, M7B, 1e13, v)
    assert [r for _, _, r in hist] == [0, 0] + [512] * 6


@pytest.mark.parametrize("version, alpha", [(1, 0.0), (3, 0.0), (3, 1.0), (2, 0.0)])
def test_symbols_equal_tokens_on_mooncake(version, alpha):
  sym = T.load_mooncake(MOONCAKE, limit=40)
  tok = T.tokens_trace(sym)
  cap = 1.2e10  # forces evictions
  a, ta = run_marconi(sym, M7B, cap, version, alpha)
  b, tb = run_marconi(tok, M7B, cap, version, alpha)
  assert a == b and ta.states_evicted == tb.states_evicted > 0


def test_oracle_bounds_every_policy():
  tr = T.load_mooncake(MOONCAKE, limit=300)
  o = oracle_reused(tr).tolist()
  for v, a in ((1, 0.0), (2, 0.0), (3, 0.5)):
    hist, _ = run_marconi(tr, M7B, 2e10, v, a)
    assert all(r <= b for (_, _, r), b in zip(hist, o))
  big, _ = run_marconi(tr, M7B, 1e15, 1)  # no eviction: V1 misses only branch-creating hits
  assert sum(r for _, _, r in big) <= sum(o)


def test_bad_arguments():
  tr = trace_of(([1], []))
  with pytest.raises(ValueError, match="version"):
    run_marconi(tr, M7B, 1e9, 4)
  with pytest.raises(ValueError, match="capacity_bytes"):
    run_marconi(tr, M7B, 0, 1)
