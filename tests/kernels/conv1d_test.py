"""Causal conv1d kernels vs the token-scan oracle (xla and Pallas-interpret paths)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.pallas.conv1d import api
from kernels.pallas.conv1d import pallas_gpu
from kernels.pallas.conv1d import reference


def _inputs(seed, t, d, k, n_seq, dtype=jnp.float32, with_bias=True):
  rng = np.random.default_rng(seed)
  return dict(
    x=jnp.asarray(rng.standard_normal((t, d)), dtype),
    weight=jnp.asarray(rng.standard_normal((d, k)) / k, dtype),
    bias=jnp.asarray(rng.standard_normal((d,)), dtype) if with_bias else None,
    conv_state=jnp.asarray(rng.standard_normal((n_seq, d, k - 1)), dtype),
  )


@functools.cache
def _jitted(impl, static):
  def f(inp, cu):
    i = dict(inp)
    x, w, b = i.pop("x"), i.pop("weight"), i.pop("bias")
    return api.causal_conv1d(x, w, b, cu_seqlens=cu, implementation=impl, **i, **dict(static))

  return jax.jit(f)


def _run(inp, impl, cu_seqlens=None, **kw):
  cu = None if cu_seqlens is None else jnp.asarray(cu_seqlens, jnp.int32)
  return _jitted(impl, tuple(sorted(kw.items())))(inp, cu)


def _oracle(inp, **kw):
  f32 = {k: None if v is None else v.astype(jnp.float32) for k, v in inp.items()}
  return reference.conv_oracle(f32.pop("x"), f32.pop("weight"), f32.pop("bias"), **f32, **kw)


def _close(a, b, dtype):
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  if dtype == jnp.float32:
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  else:  # output rounded to bf16 once
    np.testing.assert_allclose(a, b, rtol=1e-2, atol=1e-2)


# (T, D, K, cu_seqlens, checkpoint_every, activation)
CASES = {
  "packed_silu": (90, 48, 4, [0, 2, 2, 40, 90], 16, "silu"),
  "single_none_act": (33, 16, 4, None, 8, None),
  "k2_wide": (20, 200, 2, [0, 7, 20], 5, "silu"),
}


@pytest.mark.parametrize("impl", ["xla", "interpret"])
@pytest.mark.parametrize(
  "case, dtype",
  [(c, jnp.float32) for c in CASES] + [("packed_silu", jnp.bfloat16)],
)
def test_conv_matches_oracle(case, impl, dtype):
  t, d, k, cu, every, act = CASES[case]
  n_seq = 1 if cu is None else len(cu) - 1
  inp = _inputs(0, t, d, k, n_seq, dtype)
  y, final, (ck, counts) = _run(inp, impl, cu_seqlens=cu, checkpoint_every=every, activation=act)
  yo, fo, (cko, co) = _oracle(inp, cu_seqlens=cu, checkpoint_every=every, activation=act)
  assert y.dtype == dtype and final.dtype == dtype and ck.dtype == dtype
  _close(y, yo, dtype)
  # States are copies of inputs: exact in any dtype.
  np.testing.assert_array_equal(np.asarray(final, np.float32), np.asarray(fo, np.float32))
  cko = jnp.pad(cko, [(0, 0), (0, ck.shape[1] - cko.shape[1]), (0, 0), (0, 0)])
  np.testing.assert_array_equal(np.asarray(ck, np.float32), np.asarray(cko, np.float32))
  np.testing.assert_array_equal(counts, co)


def _assert_fp32_contract(got, want):
  """SPEC C / D: two differently compiled fp32 programs agree within 1e-5 relative (not bit for
  bit: XLA may fuse or reassociate them differently; a fresh clone once saw 6e-8)."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  scale = max(float(np.max(np.abs(want))), 1e-30)
  assert float(np.max(np.abs(got - want))) / scale <= 1e-5


def test_no_state_means_zero_state():
  inp = _inputs(1, 12, 16, 4, 1)
  zero = dict(inp, conv_state=jnp.zeros_like(inp["conv_state"]))
  none = dict(inp)
  none.pop("conv_state")
  _assert_fp32_contract(_run(zero, "xla")[0], _run(none, "xla")[0])


@pytest.mark.parametrize("impl", ["xla", "interpret"])
@pytest.mark.parametrize("split", [2, 17])
def test_state_continuity_split_equals_whole(impl, split):
  t, d, k = 30, 32, 4
  inp = _inputs(2, t, d, k, 1)
  y, final, _ = _run(inp, impl)
  first = dict(inp, x=inp["x"][:split])
  y1, f1, _ = _run(first, impl)
  rest = dict(inp, x=inp["x"][split:], conv_state=f1)
  y2, f2, _ = _run(rest, impl)
  # A split off the kernels' chunk grid: the contract is fp32 1e-5, not bit equality.
  _assert_fp32_contract(jnp.concatenate([y1, y2]), y)
  _assert_fp32_contract(f2, final)


@pytest.mark.parametrize("impl", ["xla", "interpret"])
def test_update_after_prefill_matches_oracle(impl):
  t, d, k, prefill = 20, 24, 4, 13
  inp = _inputs(3, t, d, k, 2)
  inp2 = _inputs(4, t, d, k, 2)
  both = dict(inp, x=jnp.concatenate([inp["x"], inp2["x"]]))
  cu = np.array([0, t, 2 * t], np.int32)
  yo, fo, _ = _oracle(both, cu_seqlens=cu)
  pre = dict(inp, x=jnp.concatenate([inp["x"][:prefill], inp2["x"][:prefill]]))
  _, final, _ = _run(pre, impl, cu_seqlens=[0, prefill, 2 * prefill])
  pool = jnp.zeros((4, d, k - 1)).at[jnp.array([2, 0])].set(final)
  read, write = jnp.array([2, 0]), jnp.array([1, 3])
  step = jax.jit(
    functools.partial(api.causal_conv1d_update, implementation=impl),
    donate_argnames="state_pool",
  )
  ys = []
  for i in range(prefill, t):
    xt = jnp.stack([inp["x"][i], inp2["x"][i]])
    y, pool = step(
      xt, inp["weight"], inp["bias"], state_pool=pool, read_indices=read, write_indices=write
    )
    ys.append(y)
    read, write = write, read
  yo2 = np.asarray(yo).reshape(2, t, d)[:, prefill:]
  np.testing.assert_allclose(np.stack(ys, 1), yo2, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(pool[read]), np.asarray(fo))


@pytest.mark.parametrize(
  "change, match",
  [
    (dict(weight=jnp.zeros((15, 4))), "weight"),
    (dict(bias=jnp.zeros((3,))), "bias"),
    (dict(conv_state=jnp.zeros((1, 16, 4))), "conv_state"),
    (dict(activation="relu"), "activation"),
    (dict(cu_seqlens=np.array([0, 5], np.int32)), "cu_seqlens"),
    (dict(checkpoint_every=-1), "checkpoint_every"),
    (dict(checkpoint_every=4, max_checkpoints=-2), "max_checkpoints"),
    (dict(implementation="triton"), "implementation"),
    (dict(x=jnp.zeros((12, 16), jnp.int32)), "x has dtype int32"),
    (dict(conv_state=jnp.zeros((1, 16, 3), jnp.int32)), "conv_state has dtype int32"),
    (dict(cu_seqlens=np.array([0, 8, 4, 12], np.int32)), "cu_seqlens"),
  ],
)
def test_bad_inputs_raise(change, match):
  inp = _inputs(5, 12, 16, 4, 1)
  kw = dict(implementation="xla")
  for key in list(change):
    if key in inp:
      inp[key] = change.pop(key)
  kw.update(change)
  with pytest.raises(ValueError, match=match):
    api.causal_conv1d(inp.pop("x"), inp.pop("weight"), inp.pop("bias"), **inp, **kw)


def test_update_bad_indices_raise():
  inp = _inputs(6, 2, 16, 4, 1)
  pool = jnp.zeros((2, 16, 3))
  with pytest.raises(ValueError, match="read_indices"):
    api.causal_conv1d_update(
      inp["x"],
      inp["weight"],
      inp["bias"],
      state_pool=pool,
      read_indices=jnp.array([0, 2]),
      write_indices=jnp.array([0, 1]),
      implementation="xla",
    )


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_pallas_kernels_lower_for_cuda(dtype):
  inp = _inputs(7, 300, 200, 4, 3, dtype)
  cu = jnp.array([0, 10, 100, 300], jnp.int32)

  def prefill(inp, cu):
    return pallas_gpu.causal_conv1d(
      inp["x"],
      inp["weight"],
      inp["bias"],
      conv_state=inp["conv_state"],
      cu_seqlens=cu,
      checkpoint_every=64,
      max_checkpoints=4,
    )

  text = jax.jit(prefill).trace(inp, cu).lower(lowering_platforms=("cuda",)).as_text()
  assert "causal_conv1d" in text
  pool = jnp.zeros((5, 200, 3), dtype)
  idx = jnp.array([0, 3, 4], jnp.int32)

  def update(pool):
    return pallas_gpu.causal_conv1d_update(
      inp["x"][:3],
      inp["weight"],
      inp["bias"],
      state_pool=pool,
      read_indices=idx,
      write_indices=idx,
    )

  jax.jit(update).trace(pool).lower(lowering_platforms=("cuda",))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_gpu_conv_matches_xla(dtype):
  t, d, k = 5000, 1280, 4
  cu = np.array([0, 1, 3000, 5000], np.int32)
  inp = _inputs(8, t, d, k, 3, dtype)
  out_p = _run(inp, "pallas", cu_seqlens=cu, checkpoint_every=256)
  out_x = _run(inp, "xla", cu_seqlens=cu, checkpoint_every=256)
  _close(out_p[0], out_x[0], dtype)
  np.testing.assert_array_equal(np.asarray(out_p[1]), np.asarray(out_x[1]))
  pool = jnp.asarray(np.random.default_rng(9).standard_normal((6, d, k - 1)), dtype)
  r, w = jnp.array([5, 0, 2], jnp.int32), jnp.array([5, 1, 3], jnp.int32)
  args = (inp["x"][:3], inp["weight"], inp["bias"])
  yp, pp = api.causal_conv1d_update(
    *args, state_pool=pool, read_indices=r, write_indices=w, implementation="pallas"
  )
  yx, px = api.causal_conv1d_update(
    *args, state_pool=pool, read_indices=r, write_indices=w, implementation="xla"
  )
  _close(yp, yx, dtype)
  np.testing.assert_array_equal(np.asarray(pp), np.asarray(px))
