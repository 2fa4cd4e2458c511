"""Tests for kernels.pallas.state_copy: XLA and Pallas (interpret) vs a numpy loop oracle."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels.pallas.state_copy import api
from kernels.pallas.state_copy import pallas_gpu

IMPLS = ("xla", "interpret")


def _oracle(pool, src, dst, layers=None, shift=None):
  """Numpy loop: every entry reads the pre-batch pool (batches are hazard free anyway)."""
  old = np.asarray(pool.astype(jnp.float32) if pool.dtype == jnp.bfloat16 else pool)
  new = old.copy()
  for i, (s, d) in enumerate(zip(src, dst)):
    if s == -1 and d == -1:
      continue
    lays = range(old.shape[0]) if layers is None else [layers[i]]
    a = 0 if shift is None else int(np.broadcast_to(shift, np.shape(src))[i])
    for lay in lays:
      rows = old.shape[2] if old.ndim > 2 else 1
      if a == 0:
        new[lay, d] = old[lay, s]
      else:
        new[lay, d, : rows - a] = old[lay, s, a:]
  return new


def _as_np(x):
  return np.asarray(x.astype(jnp.float32) if x.dtype == jnp.bfloat16 else x)


def _pool(key, shape, dtype):
  return jax.random.normal(jax.random.key(key), shape, jnp.float32).astype(dtype)


def _random_batch(rng, num_slots, n, pad):
  """Disjoint src/dst slot sets, distinct destinations, ``pad`` trailing padding entries."""
  perm = rng.permutation(num_slots)
  src = rng.choice(perm[: num_slots // 2], size=n)  # sources may repeat
  dst = perm[num_slots // 2 :][:n]
  src = np.concatenate([src, -np.ones(pad, np.int64)]).astype(np.int32)
  dst = np.concatenate([dst, -np.ones(pad, np.int64)]).astype(np.int32)
  return src, dst


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("state_shape", [(4, 8, 8), (3, 5), (7,)])
def test_matches_oracle_all_layers(impl, dtype, state_shape):
  rng = np.random.default_rng(0)
  pool = _pool(1, (3, 10, *state_shape), dtype)
  src, dst = _random_batch(rng, 10, 4, pad=2)
  out = api.copy_state_slots(pool, src, dst, implementation=impl)
  assert out.shape == pool.shape and out.dtype == pool.dtype
  np.testing.assert_array_equal(_as_np(out), _oracle(pool, src, dst))


@pytest.mark.parametrize("impl", IMPLS)
def test_matches_oracle_with_layers(impl):
  rng = np.random.default_rng(1)
  pool = _pool(2, (4, 8, 2, 16), jnp.float32)
  src = np.array([0, 1, 0, 5, -1], np.int32)
  dst = np.array([2, 2, 5, 0, -1], np.int32)  # slot 5 / 0 reused at different layers
  layers = np.array([0, 1, 2, 3, 0], np.int32)
  del rng
  out = api.copy_state_slots(pool, src, dst, layers=layers, implementation=impl)
  np.testing.assert_array_equal(_as_np(out), _oracle(pool, src, dst, layers))


@pytest.mark.parametrize("impl", IMPLS)
def test_untouched_slots_and_padding(impl):
  pool = _pool(3, (2, 6, 4, 4), jnp.float32)
  src = np.array([1, -1, -1], np.int32)
  dst = np.array([4, -1, -1], np.int32)
  out = np.asarray(api.copy_state_slots(pool, src, dst, implementation=impl))
  ref = np.asarray(pool)
  for slot in (0, 1, 2, 3, 5):
    np.testing.assert_array_equal(out[:, slot], ref[:, slot])
  np.testing.assert_array_equal(out[:, 4], ref[:, 1])
  # An all-padding batch is the identity.
  out = api.copy_state_slots(pool, np.full(3, -1, np.int32), np.full(3, -1, np.int32))
  np.testing.assert_array_equal(np.asarray(out), ref)


@pytest.mark.parametrize("impl", IMPLS)
def test_pytree_pools_share_indexing(impl):
  ssm = _pool(4, (3, 8, 4, 8, 8), jnp.float32)
  conv = _pool(5, (3, 8, 3, 24), jnp.bfloat16)
  src = np.array([1, 2, -1], np.int32)
  dst = np.array([6, 7, -1], np.int32)
  out = api.copy_state_slots({"ssm": ssm, "conv": conv}, src, dst, implementation=impl)
  assert set(out) == {"ssm", "conv"}
  assert out["conv"].dtype == jnp.bfloat16
  np.testing.assert_array_equal(_as_np(out["ssm"]), _oracle(ssm, src, dst))
  np.testing.assert_array_equal(_as_np(out["conv"]), _oracle(conv, src, dst))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("layers", [None, np.array([0, 2, 1], np.int32)])
def test_conv_shift(impl, layers):
  conv = _pool(6, (3, 8, 5, 6), jnp.bfloat16)  # R = 5 rows (K-1 + num_spec)
  src = np.array([0, 1, 2], np.int32)
  dst = np.array([5, 6, 7], np.int32)
  shift = np.array([0, 2, 4], np.int32)
  out = api.copy_state_slots(conv, src, dst, layers=layers, conv_shift=shift, implementation=impl)
  np.testing.assert_array_equal(_as_np(out), _oracle(conv, src, dst, layers, shift))
  # Explicit check of the vLLM rule for entry 1 (a = 2): rows [2:] -> rows [0:3], rest unchanged.
  lay = 2 if layers is not None else 0
  o, c = _as_np(out), _as_np(conv)
  np.testing.assert_array_equal(o[lay, 6, :3], c[lay, 1, 2:])
  np.testing.assert_array_equal(o[lay, 6, 3:], c[lay, 6, 3:])


@pytest.mark.parametrize("impl", IMPLS)
def test_conv_shift_only_on_selected_pool(impl):
  ssm = _pool(7, (2, 6, 4, 4), jnp.float32)
  conv = _pool(8, (2, 6, 3, 8), jnp.float32)
  src = np.array([0, 1], np.int32)
  dst = np.array([3, 4], np.int32)
  shift = np.array([1, 2], np.int32)
  out = api.copy_state_slots((ssm, conv), src, dst, conv_shift=(None, shift), implementation=impl)
  np.testing.assert_array_equal(_as_np(out[0]), _oracle(ssm, src, dst))
  np.testing.assert_array_equal(_as_np(out[1]), _oracle(conv, src, dst, shift=shift))


@pytest.mark.parametrize("impl", IMPLS)
def test_traced_indices_under_jit_with_donation(impl):
  pool = _pool(9, (2, 8, 4, 4), jnp.float32)
  expect = _oracle(pool, [1, 2, -1], [5, 6, -1])

  @jax.jit
  def step(p, s, d):
    return api.copy_state_slots(p, s, d, implementation=impl)

  donating = jax.jit(step, donate_argnums=0)
  out = donating(pool + 0, jnp.array([1, 2, -1], jnp.int32), jnp.array([5, 6, -1], jnp.int32))
  np.testing.assert_array_equal(np.asarray(out), expect)


@pytest.mark.parametrize("impl", IMPLS)
def test_traced_out_of_range_entries_are_skipped(impl):
  pool = _pool(10, (2, 4, 8), jnp.float32)
  f = jax.jit(lambda p, s, d: api.copy_state_slots(p, s, d, implementation=impl))
  out = f(pool, jnp.array([0, 9, -1], jnp.int32), jnp.array([1, 2, 3], jnp.int32))
  np.testing.assert_array_equal(np.asarray(out), _oracle(pool, [0], [1]))


def test_xla_traced_overlap_has_snapshot_semantics():
  pool = _pool(11, (1, 4, 8), jnp.float32)
  f = jax.jit(lambda p, s, d: api.copy_state_slots(p, s, d, implementation="xla"))
  out = np.asarray(f(pool, jnp.array([0, 1], jnp.int32), jnp.array([1, 2], jnp.int32)))
  np.testing.assert_array_equal(out[0, 1], np.asarray(pool)[0, 0])
  np.testing.assert_array_equal(out[0, 2], np.asarray(pool)[0, 1])  # pre-batch value of slot 1


@given(
  n=st.integers(1, 6),
  pad=st.integers(0, 3),
  flat=st.sampled_from([1, 37, 300]),
  with_layers=st.booleans(),
  seed=st.integers(0, 2**16),
)
def test_random_batches_interpret_matches_xla_and_oracle(n, pad, flat, with_layers, seed):
  rng = np.random.default_rng(seed)
  num_slots = 12
  src, dst = _random_batch(rng, num_slots, n, pad)
  # Pad every batch to 9 entries so few shapes get compiled.
  src = np.concatenate([src, -np.ones(9 - len(src), np.int32)])
  dst = np.concatenate([dst, -np.ones(9 - len(dst), np.int32)])
  pool = jnp.asarray(rng.standard_normal((2, num_slots, flat)), jnp.float32)
  layers = rng.integers(0, 2, size=src.shape).astype(np.int32) if with_layers else None
  expect = _oracle(pool, src, dst, layers)
  for impl in IMPLS:
    out = api.copy_state_slots(pool, src, dst, layers=layers, implementation=impl, max_tile=128)
    np.testing.assert_array_equal(np.asarray(out), expect)


@pytest.mark.parametrize(
  ("kwargs", "pattern"),
  [
    (dict(src=[0, 9], dst=[1, 2]), r"src\[1\]=9 .*\[0, 8\)"),
    (dict(src=[0, 1], dst=[8, 2]), r"dst\[0\]=8 .*\[0, 8\)"),
    (dict(src=[0, -1], dst=[1, 2]), r"src\[1\]=-1"),
    (dict(src=[0, 1], dst=[1, 2]), r"src/dst: slot 1 is both a source and a destination"),
    (dict(src=[0, 3], dst=[1, 1]), r"dst: slot 1 is a destination more than once"),
    (dict(src=[0, 1], dst=[2, 3], layers=[0, 4]), r"layers\[1\]=4 .*\[0, 2\)"),
    (dict(src=[0, 1], dst=[2, 3], conv_shift=[0, 3]), r"conv_shift \(pool 0\)\[1\]=3 .*\[0, 3\)"),
    (dict(src=[0, 1], dst=[2]), r"dst must have shape \[2\]"),
    (dict(src=[[0, 1]], dst=[2]), r"src must have shape \[n\]"),
    (dict(src=np.array([0.0]), dst=[2]), r"src must be an integer array"),
    (dict(src=[0], dst=[1], implementation="cuda"), r"implementation='cuda'"),
  ],
)
def test_bad_inputs_raise(kwargs, pattern):
  pool = jnp.zeros((2, 8, 3, 4), jnp.float32)
  kwargs = dict(kwargs)
  for k in ("src", "dst", "layers", "conv_shift"):
    if k in kwargs and isinstance(kwargs[k], list):
      kwargs[k] = np.asarray(kwargs[k], np.int32)
  with pytest.raises(ValueError, match=pattern):
    api.copy_state_slots(pool, **kwargs)


def test_layers_allow_same_slot_on_different_layers():
  pool = _pool(12, (2, 4, 3), jnp.float32)
  src = np.array([0, 1], np.int32)
  dst = np.array([1, 2], np.int32)
  layers = np.array([0, 1], np.int32)  # slot 1 is a dst on layer 0 and a src on layer 1: fine
  out = api.copy_state_slots(pool, src, dst, layers=layers, implementation="xla")
  np.testing.assert_array_equal(np.asarray(out), _oracle(pool, src, dst, layers))
  with pytest.raises(ValueError, match=re.escape("(layer, slot) (0, 1)")):
    api.copy_state_slots(pool, src, dst, layers=np.array([0, 0], np.int32))


def test_bad_pools_raise():
  with pytest.raises(ValueError, match="pool leaf 1 has leading dims"):
    api.copy_state_slots((jnp.zeros((2, 4, 3)), jnp.zeros((2, 5, 3))), [0], [1])
  with pytest.raises(ValueError, match="pool leaf 0 must have shape"):
    api.copy_state_slots(jnp.zeros((4,)), [0], [1])


def test_plan_tiles_balances_pools():
  tiles, num_tiles = pallas_gpu.plan_tiles((16 * 128 * 128, 3 * 6144), max_tile=4096)
  assert tiles == (4096, 512)
  assert num_tiles == 64
  for t in tiles:
    assert t & (t - 1) == 0
  with pytest.raises(ValueError, match="max_tile=3000"):
    pallas_gpu.plan_tiles((100,), max_tile=3000)


@pytest.mark.parametrize("layers_given", [False, True])
def test_pallas_kernel_lowers_for_cuda(layers_given):
  """Cross-lowers the Triton kernel on CPU (catches unsupported ops and block sizes)."""
  ssm = jax.ShapeDtypeStruct((18, 9, 16, 128, 128), jnp.float32)
  conv = jax.ShapeDtypeStruct((18, 9, 3, 6144), jnp.bfloat16)
  idx = jax.ShapeDtypeStruct((8,), jnp.int32)

  def f(ssm, conv, src, dst, layers, shift):
    return api.copy_state_slots(
      (ssm, conv),
      src,
      dst,
      layers=layers if layers_given else None,
      conv_shift=(None, shift),
      implementation="pallas",
    )

  lowered = jax.jit(f, donate_argnums=(0, 1)).trace(ssm, conv, idx, idx, idx, idx)
  text = lowered.lower(lowering_platforms=("cuda",)).as_text()
  assert "xla.gpu.triton" in text


def test_donated_pool_is_updated_in_place():
  """XLA: the donated pool aliases the output; Pallas: the kernel output aliases its operand."""
  pool = jax.ShapeDtypeStruct((2, 8, 64), jnp.float32)
  idx = jax.ShapeDtypeStruct((3,), jnp.int32)

  def step(impl):
    return jax.jit(
      lambda p, s, d: api.copy_state_slots(p, s, d, implementation=impl), donate_argnums=0
    )

  hlo = step("xla").trace(pool, idx, idx).lower().compile().as_text()
  assert "input_output_alias={ {}: (0, {}" in hlo
  text = step("pallas").trace(pool, idx, idx).lower(lowering_platforms=("cuda",)).as_text()
  assert "tf.aliasing_output = 0" in text
  assert "output_operand_aliases" in text


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gpu_pallas_matches_oracle(dtype):
  rng = np.random.default_rng(3)
  ssm = _pool(13, (4, 16, 4, 32, 32), dtype)
  conv = _pool(14, (4, 16, 3, 96), jnp.bfloat16)
  src, dst = _random_batch(rng, 16, 6, pad=2)
  shift = rng.integers(0, 3, size=src.shape).astype(np.int32)
  expect_ssm = _oracle(ssm, src, dst)
  expect_conv = _oracle(conv, src, dst, shift=shift)
  f = jax.jit(
    lambda p, s, d, a: api.copy_state_slots(p, s, d, conv_shift=(None, a), implementation="pallas"),
    donate_argnums=0,
  )
  out = f((ssm, conv), src, dst, shift)
  np.testing.assert_array_equal(_as_np(out[0]), expect_ssm)
  np.testing.assert_array_equal(_as_np(out[1]), expect_conv)
