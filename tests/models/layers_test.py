"""Norms, RoPE and the block-indexed state pool helpers."""

import jax
import jax.numpy as jnp
import numpy as np

from models import layers
from models import state_pool


def test_rms_norm_matches_numpy():
  x = np.random.default_rng(0).normal(size=(5, 8)).astype(np.float32)
  w = np.linspace(0.5, 1.5, 8).astype(np.float32)
  want = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w
  np.testing.assert_allclose(layers.rms_norm(jnp.asarray(x), jnp.asarray(w), 1e-6), want, rtol=1e-5)


def test_gated_rms_norm_is_per_group():
  x = np.random.default_rng(1).normal(size=(3, 8)).astype(np.float32)
  z = np.random.default_rng(2).normal(size=(3, 8)).astype(np.float32)
  norm = layers.GatedRMSNorm(dim=4, groups=2, eps=1e-6, dtype=jnp.float32)
  xg = x.reshape(3, 2, 4)
  want = (xg / np.sqrt(np.mean(xg**2, -1, keepdims=True) + 1e-6)).reshape(3, 8)
  want = want * (z / (1 + np.exp(-z)))
  np.testing.assert_allclose(norm(jnp.asarray(x), jnp.asarray(z)), want, rtol=1e-5, atol=1e-6)


def test_rope_scores_depend_only_on_relative_position():
  key = jax.random.key(0)
  q = jax.random.normal(key, (1, 1, 16))
  k = jax.random.normal(jax.random.key(1), (1, 1, 16))

  def score(pq, pk):
    rq = layers.apply_rope(q, jnp.array([pq]), 10000.0)
    rk = layers.apply_rope(k, jnp.array([pk]), 10000.0)
    return float(jnp.sum(rq * rk))

  np.testing.assert_allclose(score(7, 3), score(104, 100), rtol=1e-4)
  assert abs(score(7, 3) - score(7, 5)) > 1e-4
  # Position 0 is the identity.
  np.testing.assert_allclose(layers.apply_rope(q, jnp.array([0]), 10000.0), q)


def test_read_states_zero_for_missing():
  pool = jnp.arange(4 * 2, dtype=jnp.float32).reshape(4, 2) + 1
  got = state_pool.read_states(pool, jnp.array([2, -1, 0]))
  np.testing.assert_array_equal(got, [[5, 6], [0, 0], [1, 2]])


def test_write_states_checkpoints_then_final_and_drops():
  pool = jnp.zeros((6, 1), jnp.float32)
  final = jnp.array([[10.0], [20.0]])
  ckpts = jnp.array([[[1.0], [2.0], [3.0]], [[4.0], [5.0], [6.0]]])
  ids = jnp.array([[1, 2], [3, -1]])
  counts = jnp.array([1, 3])  # seq 0 produced one checkpoint: column 1 must not be written.
  out = state_pool.write_states(pool, jnp.array([5, -1]), final, ids, ckpts, counts)
  np.testing.assert_array_equal(out[:, 0], [0, 1, 0, 4, 0, 10])
  # A final state wins over a checkpoint on the same block.
  out = state_pool.write_states(pool, jnp.array([1, -1]), final, ids, ckpts, counts)
  np.testing.assert_array_equal(out[:, 0], [0, 10, 0, 4, 0, 0])


def test_stacked_pools_read_and_write_one_layer():
  """`layer=l` on a stacked [L, NB, ...] pool == the same call on pool[l], other layers kept."""
  stacked = jnp.arange(3 * 6, dtype=jnp.float32).reshape(3, 6, 1) + 1
  ids = jnp.array([4, -1, 0])
  np.testing.assert_array_equal(
    state_pool.read_states(stacked, ids, 1), state_pool.read_states(stacked[1], ids)
  )
  final = jnp.array([[10.0], [20.0]])
  ckpts = jnp.array([[[1.0], [2.0]], [[4.0], [5.0]]])
  ck_ids, counts = jnp.array([[1, 2], [3, -1]]), jnp.array([2, 1])
  out = state_pool.write_states(stacked, jnp.array([5, -1]), final, ck_ids, ckpts, counts, layer=2)
  want = state_pool.write_states(stacked[2], jnp.array([5, -1]), final, ck_ids, ckpts, counts)
  np.testing.assert_array_equal(out[2], want)
  np.testing.assert_array_equal(out[:2], stacked[:2])
