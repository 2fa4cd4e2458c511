"""Every XLA:CPU trick equals its plain `jnp` twin (`hybrid_cache/core/xla_cpu.py`).

The tricks only change speed: each is compared, on random and edge-case inputs, with the plain
code it replaces (the twin `HYBRID_CACHE_PLAIN_XLA` swaps in) and with NumPy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from hybrid_cache.core import xla_cpu

_prefix = jax.jit(xla_cpu.prefix_count, static_argnums=1)
_compact = jax.jit(xla_cpu.compact, static_argnums=1)


@settings(deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=300), st.integers(1, 40))
def test_prefix_count_and_compact_match_numpy(bits, size):
  mask = np.asarray(bits)
  for width in (2, 4, 32, 64):  # 2 and 4: offsets of > width rows recurse (`_prefix_sum`)
    assert np.asarray(_prefix(jnp.asarray(mask), width)).tolist() == np.cumsum(mask).tolist()
  want = np.nonzero(mask)[0][:size]
  want = np.concatenate([want, np.zeros(size - len(want), np.int64)])
  assert np.asarray(_compact(jnp.asarray(mask), size)).tolist() == want.tolist()


def test_prefix_count_of_a_pool_sized_mask_matches_numpy():
  # 2^16 + 3 entries: 2,049 rows of 32, their offsets by a second level of 65 rows, then a third
  mask = np.random.default_rng(0).random((1 << 16) + 3) < 0.7
  assert np.array_equal(np.asarray(_prefix(jnp.asarray(mask), 32)), np.cumsum(mask))


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (8, 64), (2, 300), (5, 1895)])
def test_row_counts_match_numpy(shape):
  mask = np.random.default_rng(shape[1]).random(shape) < 0.4
  np.testing.assert_array_equal(np.asarray(xla_cpu.row_count(jnp.asarray(mask))), mask.sum(1))
  np.testing.assert_array_equal(
    np.asarray(xla_cpu.row_prefix_counts(jnp.asarray(mask))), np.cumsum(mask, axis=1)
  )


@pytest.mark.parametrize("n", [1, 2, 299, 1025])
def test_stable_argsort_matches_numpy_with_ties_and_extremes(n):
  rng = np.random.default_rng(n)
  pool = np.array([-(2**31), -5, -1, 0, 1, 7, 2**16, 2**16 + 1, 2**31 - 1], np.int64)
  x = np.where(rng.random(n) < 0.5, rng.choice(pool, n), rng.integers(-(2**31), 2**31, n))
  x = x.astype(np.int32)
  got = np.asarray(jax.jit(xla_cpu.stable_argsort)(jnp.asarray(x)))
  np.testing.assert_array_equal(got, np.argsort(x, kind="stable"))


def test_identity_tricks_return_their_input():
  x = jnp.asarray(np.arange(-3, 9, dtype=np.int32))
  np.testing.assert_array_equal(np.asarray(jax.jit(xla_cpu.materialise)(x)), np.asarray(x))
  dep = jnp.int32(5)
  np.testing.assert_array_equal(np.asarray(xla_cpu.ordered_after(x, dep)), np.asarray(x))


def test_unknown_trick_name_is_one_clear_error(monkeypatch):
  monkeypatch.setenv("HYBRID_CACHE_PLAIN_XLA", "prefix_count,radix")
  with pytest.raises(ValueError, match=r"unknown trick\(s\) \['radix'\]; allowed: prefix_count"):
    xla_cpu._plain_from_env()
  monkeypatch.setenv("HYBRID_CACHE_PLAIN_XLA", " prefix_count , row_count")
  assert xla_cpu._plain_from_env() == {"prefix_count", "row_count"}
  with pytest.raises(ValueError, match="unknown trick 'nope'"):
    xla_cpu.enabled("nope")
