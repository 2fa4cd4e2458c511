"""marconi_compat_vllm (vLLM+): hand-checked traces, and the compressed tree against a literal
one-node-per-block transcription of Marconi's vLLM+ rules (marconi_and_peers.md §1.2, §1.7)."""

import heapq
import pathlib

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given

from hybrid_cache.sim import trace as T
from hybrid_cache.sim.oracle import oracle_reused
from hybrid_cache.sim.testing import M7B
from hybrid_cache.sim.testing import TINY
from hybrid_cache.sim.testing import trace_of
from hybrid_cache.sim.vllm_plus import request_tokens
from hybrid_cache.sim.vllm_plus import run_vllm_plus

MOONCAKE = str(
  pathlib.Path(__file__).resolve().parents[3]
  / "experiments"
  / "traces"
  / "mooncake_conversation_trace.jsonl"
)
# d = N = 1: one state = 34 bytes, KV = 4 bytes/token; a full 4-token block = 50 bytes.


# ---- a literal block tree: one node per block, written straight from the rules ----
class _LNode:
  def __init__(self, key, parent, ts):
    self.key, self.parent, self.children, self.ts = key, parent, {}, ts

  def __lt__(self, other):
    return self.ts < other.ts


def _lcp(a, b):
  i = 0
  for x, y in zip(a, b):
    if x != y:
      break
    i += 1
  return i


class _Literal:
  def __init__(self, model, cap, B):
    self.m, self.cap, self.B, self.now = model, cap, B, 0
    self.root = _LNode(None, None, 0)
    self.hist = []

  def _nodes(self):
    """Non-root nodes in DFS (child insertion) order."""
    stack = list(reversed(self.root.children.values()))
    while stack:
      n = stack.pop()
      yield n
      stack.extend(reversed(n.children.values()))

  def size(self):
    nodes = list(self._nodes())
    return len(nodes) * self.m.state_bytes + self.m.kv_bytes(sum(len(n.key) for n in nodes))

  def match(self, key):
    """(reused tokens, nodes accessed incl. the root); refreshes the root + full blocks."""
    self.now += 1
    node, acc, reused = self.root, 1, 0
    while True:
      node.ts = self.now
      if not node.children:
        break
      stats = [(_lcp(k, key), len(k)) for k in node.children]
      mx = max(s[0] for s in stats)
      kids = list(node.children.values())
      if mx == self.B:
        node = kids[[s[0] for s in stats].index(mx)]
        acc, reused, key = acc + 1, reused + self.B, key[self.B :]
        continue
      if mx:
        for pl, kl in stats:
          if pl == kl:
            acc, reused = acc + 1, reused + kl
            break
      break
    return reused, acc

  def step(self, inp, seq):
    reused, _ = self.match(inp)
    self.hist.append((reused > 0, len(inp), reused))
    self.now += 1
    _, acc = self.match(seq)
    extra = len(seq) - self.B * acc
    m = self.m
    need = extra / self.B * m.n_recurrent * m.state_bytes_per_layer + m.kv_bytes(extra)
    if self.size() + need > self.cap:
      self.evict(self.size() + need - self.cap)
    self._insert(self.root, seq)

  def _insert(self, node, key):
    while True:
      node.ts = self.now
      if node.children:
        mx = max(_lcp(k, key) for k in node.children)
        nxt = [(c, len(k)) for k, c in node.children.items() if _lcp(k, key) == len(k) == mx]
        if nxt:
          node, key = nxt[0][0], key[nxt[0][1] :]
          continue
      if not key:
        return
      if node is self.root or len(node.key) == self.B:
        c = _LNode(key[: self.B], node, self.now)
        node.children[c.key] = c
        node, key = c, key[self.B :]
        continue
      vac = self.B - len(node.key)
      del node.parent.children[node.key]
      node.key = node.key + key[:vac]
      node.parent.children[node.key] = node
      key = key[vac:]

  def evict(self, target):
    self.now += 1
    leaves = [n for n in self._nodes() if not n.children] or [self.root]
    heapq.heapify(leaves)
    done = 0
    while done < target and leaves:
      x = heapq.heappop(leaves)
      if x is self.root:
        break
      done += self.m.state_bytes + self.m.kv_bytes(len(x.key))
      del x.parent.children[x.key]
      if not x.parent.children:
        heapq.heappush(leaves, x.parent)


def _literal(trace, model, cap, B):
  lit = _Literal(model, cap, B)
  for r in trace.requests:
    seq = tuple(request_tokens(r).tolist())
    lit.step(seq[: r.num_input_tokens], seq)
  return lit


# ---- hand-checked ----
def test_hand_checked_blocks_partial_fill_and_lru():
  # B = 4, capacity 200 bytes = 4 full blocks.
  # R0 [1..8] -> blocks A=[1-4] A2=[5-8]; R1 [11..18] -> B1 B2 (tree 200 B).
  # R2 = R0 -> 8 reused (A, A2 refreshed). R3 [21..25]: need 0.25*34 + 4 = 12.5 B over ->
  #   evict the LRU leaf B2 (50 B); insert C1=[21-24] C2=[25] (partial): tree 238 B.
  # R4 = R1 -> only B1 (4); need 0 but tree is 38 over -> evict LRU leaf A2; re-add B2.
  # R5 [1..4] -> A (4). R6 [21..26] -> C1 + the partial C2 as a prefix (5).
  tr = trace_of(
    (list(range(1, 9)), []),
    (list(range(11, 19)), []),
    (list(range(1, 9)), []),
    (list(range(21, 26)), []),
    (list(range(11, 19)), []),
    ([1, 2, 3, 4], []),
    ([21, 22, 23, 24, 25, 26], []),
  )
  hist, tree = run_vllm_plus(tr, TINY, 200, block_size=4)
  assert [r for _, _, r in hist] == [0, 0, 8, 0, 4, 4, 5]
  assert tree.states_evicted == 2
  assert tree.num_blocks == 5 and tree.num_tokens == 18  # A B1 B2 C1 and C2 filled to [25, 26]
  assert _literal(tr, TINY, 200, 4).hist == hist


def test_hand_checked_partial_leaf_fill_and_reuse():
  # Chat-like: R1 extends R0's whole sequence; R0's partial tail [9, 10] is filled by R1's
  # insert. R2 shares [1..8] and the filled block, diverges after.
  tr = trace_of(
    (list(range(1, 9)), [9, 10]),  # blocks [1-4] [5-8] [9,10]
    (list(range(1, 13)), [13]),  # match 8 + partial [9,10] (prefix) = 10; fill -> [9-12], [13]
    (list(range(1, 13)) + [50], []),  # 12 full-block tokens
  )
  hist, tree = run_vllm_plus(tr, M7B, 1e12, block_size=4)
  assert [r for _, _, r in hist] == [0, 10, 12]
  assert tree.states_evicted == 0
  assert tree.num_blocks == 5  # [1-4] [5-8] [9-12] [13] [50]


def test_partial_fill_then_prefix_shorter_than_block():
  # R1 fills R0's partial [5, 6] to [5-8] and adds [9, 10]; R2's [5, 6, 7] is not a full
  # block of [5-8] and no partial child is its prefix -> only [1-4].
  tr = trace_of(
    ([1, 2, 3, 4, 5, 6], []),
    ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], []),
    ([1, 2, 3, 4, 5, 6, 7], []),
  )
  hist, _ = run_vllm_plus(tr, M7B, 1e12, block_size=4)
  assert [r for _, _, r in hist] == [0, 6, 4]
  assert _literal(tr, M7B, 1e12, 4).hist == hist


def test_partial_children_first_prefix_in_order_wins():
  # Under [1-4]: R0 adds full [5,9,7,7]; R1 adds partial [5] (lcp 1 < len 4, no descent);
  # R2 [..5,9]: match takes [5] (the first partial prefix); insert cannot descend into [5]
  # (the full child shares 2 > 1 tokens) -> new partial [5, 9] after [5].
  # R3 [..5,9,1]: match still takes [5] (first in order) -> 5, not [5, 9] -> 6; insert fills
  # [5, 9] to [5, 9, 1] (longest prefix child with the max common prefix). R4 likewise 5.
  tr = trace_of(
    ([1, 2, 3, 4, 5, 9, 7, 7], []),
    ([1, 2, 3, 4, 5], []),
    ([1, 2, 3, 4, 5, 9], []),
    ([1, 2, 3, 4, 5, 9, 1], []),
    ([1, 2, 3, 4, 5, 9, 1, 3], []),
  )
  hist, tree = run_vllm_plus(tr, M7B, 1e12, block_size=4)
  assert [r for _, _, r in hist] == [0, 4, 5, 5, 5]
  assert tree.num_blocks == 4  # [1-4] [5,9,7,7] [5] [5,9,1,3] (R4 filled [5,9,1])
  assert _literal(tr, M7B, 1e12, 4).hist == hist


def test_mooncake_excerpt_hand_checked():
  # Rows 0-7 start with hash id 0 (512 tokens = 16 blocks of 32), then unique ids: every row
  # after the first reuses exactly those 16 full blocks (vLLM+ needs no branch state).
  tr = T.load_mooncake(MOONCAKE, limit=8)
  hist, _ = run_vllm_plus(tr, M7B, 1e13)
  assert [r for _, _, r in hist] == [0] + [512] * 7


# ---- against the literal tree ----
def _random_trace(seed, n_req, vocab):
  rng = np.random.default_rng(seed)
  reqs, ctxs = [], []
  for _ in range(n_req):
    kind = rng.integers(3)
    if kind == 0 or not ctxs:  # fresh (maybe sharing a random prefix of an old one)
      base = ctxs[rng.integers(len(ctxs))] if ctxs and rng.random() < 0.5 else []
      inp = (
        base[: rng.integers(len(base) + 1)] + rng.integers(1, vocab, rng.integers(1, 12)).tolist()
      )
    elif kind == 1:  # next chat turn
      inp = ctxs[-1] + rng.integers(1, vocab, rng.integers(1, 6)).tolist()
    else:  # repeat an old input, maybe truncated
      old = ctxs[rng.integers(len(ctxs))]
      inp = old[: max(1, rng.integers(len(old) + 1))]
    out = rng.integers(1, vocab, rng.integers(0, 6)).tolist()
    reqs.append((inp, out))
    ctxs.append(inp + out)
  return trace_of(*reqs)


@given(
  seed=st.integers(0, 2**31 - 1),
  B=st.sampled_from([1, 2, 3, 4]),
  cap_blocks=st.integers(2, 30),
  vocab=st.sampled_from([3, 50]),
)
def test_compressed_equals_literal(seed, B, cap_blocks, vocab):
  tr = _random_trace(seed, 30, vocab)
  cap = cap_blocks * (TINY.state_bytes + TINY.kv_bytes(B))
  hist, tree = run_vllm_plus(tr, TINY, cap, block_size=B)
  lit = _literal(tr, TINY, cap, B)
  assert hist == lit.hist
  assert tree.tree_bytes == lit.size()
  assert tree.now == lit.now


def test_mooncake_excerpt_equals_literal_with_evictions():
  tr = T.load_mooncake(MOONCAKE, limit=60)
  cap = 1.5e10  # ~520 blocks of 32 tokens: evicts on most requests
  hist, tree = run_vllm_plus(tr, M7B, cap)
  assert tree.states_evicted > 0
  assert _literal(tr, M7B, cap, 32).hist == hist


def test_oracle_bounds_vllm_plus():
  tr = T.load_mooncake(MOONCAKE, limit=300)
  o = oracle_reused(tr).tolist()
  hist, _ = run_vllm_plus(tr, M7B, 4e10)
  assert all(r <= b for (_, _, r), b in zip(hist, o))
  assert sum(r for _, _, r in hist) > 0


def test_bad_arguments():
  tr = trace_of(([1], []))
  with pytest.raises(ValueError, match="capacity_bytes"):
    run_vllm_plus(tr, M7B, 0)
  with pytest.raises(ValueError, match="block_size"):
    run_vllm_plus(tr, M7B, 1e9, block_size=0)
