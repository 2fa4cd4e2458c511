"""The simulator's hash values stay fixed: one splitmix64 finaliser (`hashing.mix64`) serves both
`core_scan._prefix_hashes` and `seen_trie.unit_hashes`; the values are the ones each module's own
copy gave before they shared it (so dumps and tries replay identically)."""

import numpy as np

from hybrid_cache import hashing
from hybrid_cache.sim import core_scan
from hybrid_cache.sim.seen_trie import SeenTrie
from hybrid_cache.sim.seen_trie import unit_hashes
from hybrid_cache.sim.testing import small_chat


def _splitmix64_finaliser(x: int) -> int:
  m = (1 << 64) - 1
  x ^= x >> 30
  x = (x * 0xBF58476D1CE4E5B9) & m
  x ^= x >> 27
  x = (x * 0x94D049BB133111EB) & m
  return x ^ (x >> 31)


def test_mix64_is_splitmix64s_finaliser():
  xs = [0, 1, 2**63, 2**64 - 1, 0x0123456789ABCDEF]
  got = hashing.mix64(np.array(xs, np.uint64)).tolist()
  assert got == [_splitmix64_finaliser(x) for x in xs]
  assert got == [0, 6238072747940578789, 2720858781877447050, 13029008266876403067,
                 12880392674509918508]  # fmt: skip


def test_unit_hashes_keep_their_values():
  weights = SeenTrie(4).weights
  assert unit_hashes(np.arange(10), 4, weights) == [3280919740001965720, 13050332569812844083]
  got = unit_hashes(np.array([7, 7, 7, 7, 3, 2**31 - 1, 0, 5]), 4, weights)
  assert got == [18297811658904401960, 17966096006873443426]


def test_prefix_hashes_keep_their_values():
  trace = small_chat(3, seed=0)
  ends = np.array([int(q.cum[-1]) for q in trace.requests])
  h, nblk = core_scan._prefix_hashes(trace, 4, ends)
  assert nblk.tolist() == [10, 13, 15] and len(h) == 38
  assert h[:3].tolist() == [[1172642747, 401975602], [2507507473, 297698768],
                            [3814427991, 3613640578]]  # fmt: skip
  assert h[-2:].tolist() == [[1285535752, 3884645360], [1646462168, 3977821836]]
