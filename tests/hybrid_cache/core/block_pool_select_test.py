"""Sort-free selection helpers of the block pool against NumPy references (hypothesis).

`pop_many` must return the `count` smallest normal-queue keys in key order, then (demotion) the
smallest pinned keys, whichever internal path (key window or rank) it takes; `evict_ids` must
equal `evict` (`xla_cpu_test.py` checks the prefix count and compaction).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.core import block_index
from hybrid_cache.core import block_pool
from hybrid_cache.core.fresh_state import init_state
from hybrid_cache.core.state import BIG

NB = 150  # not a multiple of the 64-wide prefix tile
CFG = CacheConfig(groups=(GroupSpec("full"),), block_size=4, num_blocks=NB, max_model_len=64)
KMAX = 16


@jax.jit
def _pop(state, count):
  return block_pool.pop_many(state, count, KMAX)


def _keys(draw, n_free, spread):
  """Unique int32 keys for n_free blocks: dense (spread 0) or with gaps up to `spread`."""
  gaps = draw(st.lists(st.integers(1, 1 + spread), min_size=n_free, max_size=n_free))
  start = draw(st.integers(-(1 << 29), 1 << 29))
  return start + np.cumsum(gaps)


@st.composite
def pools(draw):
  rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
  ids = rng.permutation(np.arange(1, NB))
  n_norm = draw(st.integers(0, NB - 1))
  n_pin = draw(st.integers(0, min(KMAX, NB - 1 - n_norm)))
  spread = draw(st.sampled_from([0, 2, 50, 100_000]))
  qk = np.full((2, NB), BIG, np.int32)
  qk[0, ids[:n_norm]] = rng.permutation(_keys(draw, n_norm, spread))
  qk[1, ids[n_norm : n_norm + n_pin]] = rng.permutation(np.arange(n_pin) * 3 + 7)
  count = draw(st.integers(0, min(KMAX, n_norm + n_pin)))
  return qk, count


@given(pools())
def test_pop_many_matches_sorted_queue(pool):
  qk, count = pool
  state = init_state(CFG, bucketed=False).replace(queue_key=jnp.asarray(qk))
  norm = np.nonzero(qk[0] < BIG)[0]
  pin = np.nonzero(qk[1] < BIG)[0]
  want = list(norm[np.argsort(qk[0, norm])]) + list(pin[np.argsort(qk[1, pin])])
  new, ids = _pop(state, jnp.int32(count))
  ids = np.asarray(ids)
  assert ids[:count].tolist() == [int(b) for b in want[:count]]
  assert not ids[count:].any()
  qk_new = np.asarray(new.queue_key)
  assert (qk_new[:, ids[:count]] == BIG).all()
  assert (np.asarray(new.ref_cnt)[ids[:count]] == 1).all()
  untouched = np.setdiff1d(np.arange(NB), ids[:count])
  assert (qk_new[:, untouched] == qk[:, untouched]).all()


@given(st.integers(0, 2**31 - 1))
def test_evict_ids_equals_evict(seed):
  rng = np.random.default_rng(seed)
  state = init_state(CFG, bucketed=False)
  ids = rng.permutation(np.arange(1, NB))[:40].astype(np.int32)
  keys = rng.integers(0, 2**32, size=(40, 2), dtype=np.uint32)
  keys[20:30] = keys[:10]  # duplicate keys in the same bucket
  state = block_index.insert(state, jnp.asarray(ids), jnp.asarray(keys), jnp.zeros(40, jnp.int32))
  victims = np.where(rng.random(16) < 0.5, rng.integers(0, NB, size=16), 0)
  victims = np.unique(victims)  # unique; 0 = skip
  victims = np.concatenate([victims, np.zeros(16 - len(victims), np.int64)]).astype(np.int32)
  mask = np.zeros(NB, bool)
  mask[victims[victims > 0]] = True
  a = block_index.evict(state, jnp.asarray(mask))
  b = block_index.evict_ids(state, jnp.asarray(victims))
  for name in ("index_entry", "block_group", "block_aux"):
    assert np.array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name))), name
