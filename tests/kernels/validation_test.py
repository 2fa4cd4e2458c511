"""Shared argument checks (kernels/pallas/validation.py) and the decode slot-hazard rule of every
op's api (GDN, SSD, conv1d): bad input raises ValueError naming the argument."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.pallas import validation
from kernels.pallas.conv1d import api as conv_api
from kernels.pallas.gdn import api as gdn_api
from kernels.pallas.ssd import api as ssd_api


def test_decode_slots_rule():
  ok = validation.check_decode_slots
  ok(np.array([0, 1, 2]), np.array([0, 1, 2]))  # in place per sequence
  ok(np.array([0, 1]), np.array([2, 3]))
  ok(np.array([0, 0]), np.array([1, 2]))  # two sequences may read the same cached slot
  with pytest.raises(ValueError, match=r"write_indices: slot 2 is a destination more than once"):
    ok(np.array([0, 1]), np.array([2, 2]))
  with pytest.raises(ValueError, match=r"write_indices\[0\]=1 is read by sequence 1"):
    ok(np.array([0, 1]), np.array([1, 3]))


def test_decode_slots_rule_skips_traced_indices():
  @jax.jit
  def f(r, w):
    validation.check_decode_slots(r, w)
    return w

  np.testing.assert_array_equal(f(jnp.array([0, 1]), jnp.array([1, 1])), [1, 1])


def test_slot_indices_shape_dtype_range():
  check = validation.check_slot_indices
  check("read_indices", np.array([0, 3], np.int32), 2, 4)
  with pytest.raises(ValueError, match=r"read_indices has shape \(3,\); expected \(2,\)"):
    check("read_indices", np.array([0, 1, 2]), 2, 4)
  with pytest.raises(ValueError, match="read_indices must be an integer array"):
    check("read_indices", np.array([0.0, 1.0]), 2, 4)
  with pytest.raises(
    ValueError, match=r"read_indices has values in \[0, 4\]; allowed range \[0, 3\]"
  ):
    check("read_indices", np.array([0, 4]), 2, 4)


def test_dtype_and_pow2_checks():
  validation.check_float("x", jnp.zeros(2, jnp.bfloat16))
  validation.check_float("bias", None)
  with pytest.raises(ValueError, match="x has dtype int32"):
    validation.check_float("x", jnp.zeros(2, jnp.int32))
  with pytest.raises(ValueError, match="initial_state has dtype bfloat16; expected float32"):
    validation.check_dtype("initial_state", jnp.zeros(2, jnp.bfloat16), jnp.float32)
  assert [v for v in range(70) if validation.is_pow2(v)] == [1, 2, 4, 8, 16, 32, 64]
  assert not validation.is_pow2(8, 16) and validation.is_pow2(16, 16)
  validation.check_pow2("block", 64)
  with pytest.raises(ValueError, match="block=48 must be a power of two >= 16"):
    validation.check_pow2("block", 48)


def _gdn_step(n=2, h=2, d=16):
  z = jnp.zeros
  return (z((n, 1, d)), z((n, 1, d)), z((n, h, d)), z((n, h)), z((n, h))), z((4, h, d, d))


def _ssd_step(n=2, h=2, p=16, g=1, s=16):
  z = jnp.zeros
  return (z((n, h, p)), z((n, h)), -jnp.ones((h,)), z((n, g, s)), z((n, g, s))), z((4, h, p, s))


def _conv_step(n=2, d=8, k=4):
  return (jnp.zeros((n, d)), jnp.ones((d, k))), jnp.zeros((4, d, k - 1))


def _decode(op, read, write, pool=None, args=None):
  read, write = jnp.asarray(read, jnp.int32), jnp.asarray(write, jnp.int32)
  if op == "gdn":
    a, p = _gdn_step()
    f = gdn_api.fused_recurrent_gated_delta_rule_decode
  elif op == "ssd":
    a, p = _ssd_step()
    f = ssd_api.ssd_decode
  else:
    a, p = _conv_step()
    f = conv_api.causal_conv1d_update
  a = args or a
  return f(*a, state_pool=p if pool is None else pool, read_indices=read, write_indices=write,
           implementation="xla")  # fmt: skip


@pytest.mark.parametrize("op", ["gdn", "ssd", "conv1d"])
@pytest.mark.parametrize(
  "read, write, match",
  [
    ([0, 1], [2, 2], "write_indices: slot 2 is a destination more than once"),
    ([0, 1], [1, 2], r"write_indices\[0\]=1 is read by sequence 1"),
    ([0, 1], [2, 4], r"write_indices has values in \[2, 4\]; allowed range \[0, 3\]"),
    ([-1, 1], [2, 3], r"read_indices has values in \[-1, 1\]"),
    ([0, 1, 2], [2, 3], r"read_indices has shape \(3,\); expected \(2,\)"),
  ],
)
def test_decode_bad_slots_raise(op, read, write, match):
  with pytest.raises(ValueError, match=match):
    _decode(op, read, write)


@pytest.mark.parametrize("op", ["gdn", "ssd", "conv1d"])
def test_decode_in_place_and_shared_reads_are_allowed(op):
  for read, write in (([0, 1], [0, 1]), ([0, 0], [1, 2])):  # in place; two forks of slot 0
    out, pool = _decode(op, read, write)
    assert pool.shape[0] == 4 and out.shape[0] == 2
  with pytest.raises(ValueError, match=r"write_indices\[0\]=0 is read by sequence 1"):
    _decode(op, [0, 0], [0, 3])  # sequence 1 would read the slot sequence 0 overwrites


@pytest.mark.parametrize("op", ["gdn", "ssd", "conv1d"])
def test_decode_bad_pool_dtype_raises(op):
  _, pool = {"gdn": _gdn_step, "ssd": _ssd_step, "conv1d": _conv_step}[op]()
  bad = pool.astype(jnp.int32 if op == "conv1d" else jnp.bfloat16)
  with pytest.raises(ValueError, match="state_pool has dtype"):
    _decode(op, [0, 1], [2, 3], pool=bad)
