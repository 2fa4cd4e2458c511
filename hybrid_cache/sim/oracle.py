"""Infinite-cache bound: every block and every boundary state of every past request is kept.

For request r the reusable prefix is the longest common prefix (in tokens) of its input with the
full sequence (input + output) of any earlier request, floored to a multiple of `block_size`
(1 = token-exact, as Marconi). No policy that only reuses true prefixes of earlier sequences
can reuse more, so a policy's hit rate divided by this one is its fraction of the oracle.
Computed with an uncompressed-state radix tree over the trace's symbols (see `trace.py`).

Own granularity (`own_oracle_reused`): a policy whose hits are multiples of G tokens and, as
vLLM and the core, capped at input - 1 tokens (the last prompt token is always computed) is
bounded by the infinite cache with the same two rules: floor(min(lcp, input - 1) / G) * G. Its
fraction of that oracle (`fraction_of_oracle_own`) separates what the policy's eviction and
placement lose from what its granularity loses (the token-level oracle charges both).
"""

from __future__ import annotations

import numpy as np

from hybrid_cache.sim.trace import Trace


class _ONode:
  __slots__ = ("children", "sym")

  def __init__(self, sym):
    self.children: dict[int, _ONode] = {}
    self.sym = sym


def _lcp_syms(root: _ONode, key: np.ndarray) -> tuple[int, _ONode | None, int, _ONode]:
  """Walks `key`; returns (symbols matched, partially matched child or None, its m, parent)."""
  node, pos, n = root, 0, len(key)
  while pos < n:
    child = node.children.get(int(key[pos]))
    if child is None:
      return pos, None, 0, node
    k = min(len(child.sym), n - pos)
    d = child.sym[:k] != key[pos : pos + k]
    m = int(d.argmax()) if d.any() else k
    pos += m
    if m < len(child.sym):
      return pos, child, m, node
    node = child
  return pos, None, 0, node


def oracle_reused(trace: Trace, block_size: int = 1) -> np.ndarray:
  """int64[n]: reusable input tokens per request under an infinite cache (see module doc)."""
  if block_size < 1:
    raise ValueError(f"block_size must be >= 1, got {block_size}")
  return (oracle_matched(trace) // block_size) * block_size


def own_oracle_reused(
  matched: np.ndarray, trace: Trace, granularity: int, full_hit: bool
) -> np.ndarray:
  """int64[n]: the infinite cache at a policy's own hit granularity (module doc).

  `matched`: `oracle_matched(trace)`; `full_hit`: the policy may reuse the whole input (Marconi's
  tree), else hits are capped at input - 1 tokens.
  """
  if granularity < 1:
    raise ValueError(f"granularity must be >= 1, got {granularity}")
  m = np.asarray(matched, np.int64)
  if not full_hit:
    n_in = np.array([r.num_input_tokens for r in trace.requests], np.int64)
    m = np.minimum(m, n_in - 1)
  return (m // granularity) * granularity


def oracle_matched(trace: Trace) -> np.ndarray:
  """int64[n]: longest common prefix (tokens) of each input with any earlier full sequence."""
  root = _ONode(None)
  out = np.zeros(len(trace.requests), np.int64)
  for i, r in enumerate(trace.requests):
    n_in = r.num_input_symbols
    matched, _, _, _ = _lcp_syms(root, r.seq[:n_in])
    out[i] = int(r.cum[matched])
    # insert the full sequence
    key = r.seq
    pos, child, m, parent = _lcp_syms(root, key)
    if child is not None:
      mid = _ONode(child.sym[:m])
      parent.children[int(child.sym[0])] = mid
      child.sym = child.sym[m:]
      mid.children[int(child.sym[0])] = child
      parent = mid
    if pos < len(key):
      parent.children[int(key[pos])] = _ONode(key[pos:])
  return out
