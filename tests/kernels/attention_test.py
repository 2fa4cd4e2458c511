"""Tests for kernels.pallas.attention: XLA reference and Pallas (interpret) vs a float64 oracle."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from kernels.pallas.attention import api
from kernels.pallas.attention import pallas_gpu

IMPLS = ("xla", "interpret")


def _f64(x):
  return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def _oracle(q, k_pages, v_pages, block_tables, seq_lens, qsl, window=None, scale=None):
  """Per-sequence loop in float64 over explicitly assembled K/V."""
  q, kp, vp = _f64(q), _f64(k_pages), _f64(v_pages)
  num_tokens, hq, d = q.shape
  bs, hkv = kp.shape[1], kp.shape[2]
  g = hq // hkv
  scale = d**-0.5 if scale is None else scale
  out = np.zeros_like(q)
  for n, seq_len in enumerate(seq_lens):
    q_len = qsl[n + 1] - qsl[n]
    for i in range(q_len):
      t = qsl[n] + i
      p = seq_len - q_len + i
      lo = 0 if window is None else max(0, p - window + 1)
      keys = np.arange(lo, p + 1)
      blocks = block_tables[n][keys // bs]
      k = kp[blocks, keys % bs]  # [K, H_kv, D]
      v = vp[blocks, keys % bs]
      for h in range(hq):
        s = k[:, h // g] @ q[t, h] * scale
        w = np.exp(s - s.max())
        out[t, h] = (w / w.sum()) @ v[:, h // g]
  return out


def _batch(
  rng,
  q_lens,
  ctx_lens,
  hq,
  hkv,
  d,
  bs,
  dtype,
  extra_rows=2,
  null_fill=np.nan,
  window=None,
  max_blocks=None,
  num_rows=None,
):
  """Random pages and a block table; unattended table entries point at block 0 filled with NaN."""
  seq_lens = np.asarray(ctx_lens, np.int32) + np.asarray(q_lens, np.int32)
  n = len(q_lens)
  if max_blocks is None:
    max_blocks = int(-(-seq_lens.max() // bs)) + 1
  num_blocks = 1 + n * max_blocks
  kp = rng.standard_normal((num_blocks, bs, hkv, d)).astype(np.float32)
  vp = rng.standard_normal((num_blocks, bs, hkv, d)).astype(np.float32)
  kp[0] = vp[0] = null_fill
  bt = np.zeros((n, max_blocks), np.int32)
  ids = 1 + rng.permutation(num_blocks - 1)
  for i, sl in enumerate(seq_lens):
    used = -(-int(sl) // bs)
    bt[i, :used] = ids[i * max_blocks : i * max_blocks + used]
    # Stale data past the end of the last page.
    if sl % bs:
      kp[bt[i, used - 1], sl % bs :] = np.nan
      vp[bt[i, used - 1], sl % bs :] = np.nan
    if window is not None:
      first = max(0, int(sl) - int(q_lens[i]) - window + 1) // bs
      bt[i, :first] = 0  # released out-of-window blocks -> null block
  qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
  if num_rows is None:
    num_rows = int(qsl[-1]) + extra_rows
  q = rng.standard_normal((num_rows, hq, d)).astype(np.float32)
  cast = lambda x: jnp.asarray(x, dtype)
  return cast(q), cast(kp), cast(vp), bt, seq_lens, qsl


def _tol(dtype):
  return dict(atol=1e-5, rtol=1e-5) if dtype == jnp.float32 else dict(atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize(
  ("dtype", "hq", "hkv", "d", "bs", "window"),
  [
    (jnp.float32, 4, 2, 16, 8, None),
    (jnp.float32, 4, 2, 16, 8, 5),
    (jnp.float32, 8, 1, 32, 16, 19),
    (jnp.float32, 2, 2, 8, 4, 1),
    (jnp.bfloat16, 4, 2, 16, 8, 19),
    (jnp.bfloat16, 8, 1, 32, 16, None),
    (jnp.bfloat16, 2, 2, 8, 4, 5),
  ],
)
def test_ragged_mix_matches_oracle(dtype, hq, hkv, d, bs, window):
  rng = np.random.default_rng(hq * 100 + bs)
  # Prefill from scratch, prefill chunk with context, decodes, and an idle sequence (q_len 0).
  q_lens = [7, 5, 1, 0, 1, 3]
  ctx = [0, 21, 30, 4, 0, 2]
  q, kp, vp, bt, seq_lens, qsl = _batch(rng, q_lens, ctx, hq, hkv, d, bs, dtype, window=window)
  expect = _oracle(q, kp, vp, bt, seq_lens, qsl, window)
  for impl in IMPLS:
    out = api.paged_attention(
      q, kp, vp, bt, seq_lens, query_start_loc=qsl, window=window, implementation=impl
    )
    assert out.shape == q.shape and out.dtype == q.dtype
    out = _f64(out)
    assert np.all(np.isfinite(out)), impl
    np.testing.assert_allclose(out, expect, **_tol(dtype), err_msg=impl)
    np.testing.assert_array_equal(out[qsl[-1] :], 0.0)  # padding rows


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("window", [None, 6])
def test_decode_default_query_start_loc(impl, window):
  rng = np.random.default_rng(7)
  q, kp, vp, bt, seq_lens, qsl = _batch(
    rng, [1, 1, 1, 1], [0, 9, 17, 40], 4, 2, 16, 8, jnp.float32, extra_rows=0, window=window
  )
  out = api.paged_attention(q, kp, vp, bt, seq_lens, window=window, implementation=impl)
  expect = _oracle(q, kp, vp, bt, seq_lens, qsl, window)
  np.testing.assert_allclose(_f64(out), expect, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_custom_scale_and_tiling(impl):
  rng = np.random.default_rng(8)
  q, kp, vp, bt, seq_lens, qsl = _batch(rng, [37, 2], [3, 50], 8, 2, 16, 16, jnp.float32)
  kwargs = dict(query_start_loc=qsl, scale=0.3, implementation=impl)
  if impl == "interpret":
    kwargs.update(block_q=4, block_k=8)  # several query blocks per sequence, 2 chunks per page
  out = api.paged_attention(q, kp, vp, bt, seq_lens, **kwargs)
  expect = _oracle(q, kp, vp, bt, seq_lens, qsl, scale=0.3)
  np.testing.assert_allclose(_f64(out), expect, atol=1e-5, rtol=1e-5)


@settings(max_examples=8)
@given(
  q_lens=st.lists(st.integers(0, 9), min_size=4, max_size=4),
  ctx=st.lists(st.integers(0, 30), min_size=4, max_size=4),
  window=st.sampled_from([None, 1, 3, 8]),
  seed=st.integers(0, 2**16),
)
def test_random_ragged_batches(q_lens, ctx, window, seed):
  rng = np.random.default_rng(seed)
  # Fixed shapes (T = 40 rows, 12 blocks per sequence) so compiled functions are reused.
  q, kp, vp, bt, seq_lens, qsl = _batch(
    rng, q_lens, ctx, 4, 2, 8, 4, jnp.float32, window=window, max_blocks=12, num_rows=40
  )
  expect = _oracle(q, kp, vp, bt, seq_lens, qsl, window)
  for impl in IMPLS:
    out = api.paged_attention(
      q, kp, vp, bt, seq_lens, query_start_loc=qsl, window=window, implementation=impl
    )
    np.testing.assert_allclose(_f64(out), expect, atol=1e-5, rtol=1e-5)


def test_under_jit_with_traced_metadata():
  rng = np.random.default_rng(9)
  q, kp, vp, bt, seq_lens, qsl = _batch(rng, [3, 1], [5, 12], 4, 2, 16, 8, jnp.float32)
  f = jax.jit(
    lambda *a: api.paged_attention(*a[:5], query_start_loc=a[5], window=4, implementation="xla")
  )
  out = f(q, kp, vp, bt, seq_lens, qsl)
  expect = _oracle(q, kp, vp, bt, seq_lens, qsl, window=4)
  np.testing.assert_allclose(_f64(out), expect, atol=1e-5, rtol=1e-5)


def test_write_kv_then_attend_equals_dense_causal():
  rng = np.random.default_rng(10)
  num_blocks, bs, hkv, d, hq = 9, 4, 2, 8, 4
  kp = jnp.zeros((num_blocks, bs, hkv, d), jnp.float32)
  vp = jnp.zeros((num_blocks, bs, hkv, d), jnp.float32)
  t = 10
  bt = np.array([[3, 7, 1]], np.int32)
  pos = np.arange(t)
  slots = (bt[0, pos // bs] * bs + pos % bs).astype(np.int32)
  k = rng.standard_normal((t, hkv, d)).astype(np.float32)
  v = rng.standard_normal((t, hkv, d)).astype(np.float32)
  # Two writes: a prefill of 7 (plus two padding rows with slot -1), then 3 more tokens.
  pad_k = np.concatenate([k[:7], np.full((2, hkv, d), 99.0, np.float32)])
  pad_v = np.concatenate([v[:7], np.full((2, hkv, d), 99.0, np.float32)])
  kp, vp = api.write_kv(
    kp, vp, pad_k, pad_v, np.concatenate([slots[:7], [-1, -1]]).astype(np.int32)
  )
  kp, vp = api.write_kv(kp, vp, k[7:], v[7:], slots[7:])
  assert not np.any(np.asarray(kp) == 99.0)
  np.testing.assert_array_equal(np.asarray(kp)[bt[0, pos // bs], pos % bs], k)
  np.testing.assert_array_equal(np.asarray(vp)[bt[0, pos // bs], pos % bs], v)
  untouched = np.ones(num_blocks, bool)
  untouched[bt[0]] = False
  np.testing.assert_array_equal(np.asarray(kp)[untouched], 0.0)
  q = rng.standard_normal((t, hq, d)).astype(np.float32)
  qsl = np.array([0, t], np.int32)
  s = np.einsum("qhd,khd->hqk", q, np.repeat(k, hq // hkv, axis=1)) * d**-0.5
  s = np.where(np.tril(np.ones((t, t), bool))[None], s, -np.inf)
  w = np.exp(s - s.max(-1, keepdims=True))
  dense = np.einsum("hqk,khd->qhd", w / w.sum(-1, keepdims=True), np.repeat(v, hq // hkv, axis=1))
  for impl in IMPLS:
    out = api.paged_attention(
      q, kp, vp, bt, np.array([t], np.int32), query_start_loc=qsl, implementation=impl
    )
    np.testing.assert_allclose(np.asarray(out), dense, atol=1e-5, rtol=1e-5)
  # the same pages as layer 1 of a stacked [L, ...] array (the model's): written and attended
  # in place, the other layers untouched
  stacked = jnp.stack([jnp.full_like(kp, 7.0), jnp.zeros_like(kp), jnp.full_like(kp, 7.0)])
  sk, sv = api.write_kv(stacked, stacked, k, v, slots, 1)
  np.testing.assert_array_equal(np.asarray(sk[1]), np.asarray(kp))
  np.testing.assert_array_equal(np.asarray(sv[0]), 7.0)
  for impl in IMPLS:
    out = api.paged_attention(
      q, sk, sv, bt, np.array([t], np.int32), query_start_loc=qsl, implementation=impl, layer=1
    )
    np.testing.assert_allclose(np.asarray(out), dense, atol=1e-5, rtol=1e-5)
  with pytest.raises(ValueError, match="layer=3"):
    api.paged_attention(q, sk, sv, bt, np.array([t], np.int32), query_start_loc=qsl, layer=3)


def _good():
  rng = np.random.default_rng(11)
  q, kp, vp, bt, seq_lens, qsl = _batch(rng, [2, 1], [3, 4], 4, 2, 16, 8, jnp.float32)
  return dict(q=q, k_pages=kp, v_pages=vp, block_tables=bt, seq_lens=seq_lens, query_start_loc=qsl)


@pytest.mark.parametrize(
  ("change", "pattern"),
  [
    (dict(q=jnp.zeros((5, 4))), r"q must have shape \[T, H_q, D\]"),
    (dict(q=jnp.zeros((5, 3, 16))), r"H_q=3 must be a multiple of .* H_kv=2"),
    (dict(q=jnp.zeros((5, 4, 8))), r"head dim 16 must equal q head dim D=8"),
    (dict(v_pages=jnp.zeros((3, 8, 2, 16))), r"v_pages must have shape"),
    (dict(seq_lens=np.array([5, 5, 5], np.int32)), r"seq_lens must have shape \[2\]"),
    (dict(seq_lens=np.array([5, 99], np.int32)), r"seq_lens\[1\]=99 .*\[0, 16\]"),
    (dict(query_start_loc=np.array([0, 2], np.int32)), r"query_start_loc must have shape \[3\]"),
    (dict(query_start_loc=np.array([1, 2, 3], np.int32)), r"query_start_loc\[0\]=1 must be 0"),
    (dict(query_start_loc=np.array([0, 3, 2], np.int32)), r"non-decreasing"),
    (dict(query_start_loc=np.array([0, 2, 9], np.int32)), r"query_start_loc\[2\]=9 exceeds"),
    (dict(seq_lens=np.array([1, 5], np.int32)), r"sequence 0 has 2 queries but seq_lens\[0\]=1"),
    (dict(block_tables=np.full((2, 2), 77, np.int32)), r"block_tables\[\(0, 0\)\]=77"),
    (dict(block_tables=np.zeros((2, 2), np.float32)), r"block_tables must be an integer"),
    (dict(window=0), r"window=0 must be None or a Python int >= 1"),
    (dict(implementation="triton"), r"implementation='triton'"),
    (dict(query_start_loc=None), r"T=5 rows but there are N=2 sequences"),
  ],
)
def test_bad_inputs_raise(change, pattern):
  kwargs = _good()
  kwargs.update(change)
  args = [kwargs.pop(k) for k in ("q", "k_pages", "v_pages", "block_tables", "seq_lens")]
  with pytest.raises(ValueError, match=pattern):
    api.paged_attention(*args, **kwargs)


def test_pallas_constraints_raise():
  q, kp, vp, bt, seq_lens, qsl = _batch(
    np.random.default_rng(0), [2, 1], [3, 4], 4, 2, 16, 16, jnp.float32
  )
  args = (q, kp, vp, bt, seq_lens)
  kwargs = dict(query_start_loc=qsl)
  with pytest.raises(ValueError, match=r"block_k=3 must divide block_size=16"):
    api.paged_attention(*args, **kwargs, implementation="interpret", block_k=3)
  with pytest.raises(ValueError, match=r"block_q \* \(H_q // H_kv\) a power of two >= 16"):
    api.paged_attention(*args, **kwargs, implementation="pallas", block_q=3)


def test_write_kv_bad_inputs_raise():
  kp = jnp.zeros((2, 4, 2, 8))
  k = jnp.zeros((3, 2, 8))
  with pytest.raises(ValueError, match=r"slot_mapping\[2\]=8 .*\[-1, 8\)"):
    api.write_kv(kp, kp, k, k, np.array([0, -1, 8], np.int32))
  with pytest.raises(ValueError, match=r"v must have shape \[3, 2, 8\]"):
    api.write_kv(kp, kp, k, jnp.zeros((3, 2, 4)), np.array([0, 1, 2], np.int32))
  with pytest.raises(ValueError, match=r"slot_mapping must be an integer"):
    api.write_kv(kp, kp, k, k, np.array([0.0, 1.0, 2.0]))


def test_block_pickers():
  assert pallas_gpu.pick_block_k(16) == 16
  assert pallas_gpu.pick_block_k(528) == 16
  assert pallas_gpu.pick_block_k(256) == 64
  for g in (1, 2, 4, 8, 16, 32):
    bq = pallas_gpu.pick_block_q(g)
    assert bq * g >= 16 and bq * g <= max(64, g)


@pytest.mark.parametrize(
  ("dtype", "window", "hq", "hkv", "d", "bs"),
  [
    (jnp.bfloat16, None, 16, 4, 256, 16),
    (jnp.bfloat16, 128, 8, 2, 256, 32),
    (jnp.float32, None, 8, 8, 128, 16),
    (jnp.bfloat16, 64, 32, 4, 128, 528),
  ],
)
def test_pallas_kernel_lowers_for_cuda(dtype, window, hq, hkv, d, bs):
  """Cross-lowers the Triton kernel on CPU (catches unsupported ops and block sizes)."""
  t, n, nb, mb = 96, 8, 64, 16
  args = (
    jax.ShapeDtypeStruct((t, hq, d), dtype),
    jax.ShapeDtypeStruct((nb, bs, hkv, d), dtype),
    jax.ShapeDtypeStruct((nb, bs, hkv, d), dtype),
    jax.ShapeDtypeStruct((n, mb), jnp.int32),
    jax.ShapeDtypeStruct((n,), jnp.int32),
    jax.ShapeDtypeStruct((n + 1,), jnp.int32),
  )

  def f(q, kp, vp, bt, sl, qsl):
    return api.paged_attention(
      q, kp, vp, bt, sl, query_start_loc=qsl, window=window, implementation="pallas"
    )

  text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert "xla.gpu.triton" in text


@pytest.mark.parametrize("hq", [4, 16, 64])
def test_pallas_decode_kernel_lowers_for_cuda(hq):
  n, nb, bs, hkv, d = 32, 64, 16, 4, 256
  args = (
    jax.ShapeDtypeStruct((n, hq, d), jnp.bfloat16),
    jax.ShapeDtypeStruct((nb, bs, hkv, d), jnp.bfloat16),
    jax.ShapeDtypeStruct((nb, bs, hkv, d), jnp.bfloat16),
    jax.ShapeDtypeStruct((n, 8), jnp.int32),
    jax.ShapeDtypeStruct((n,), jnp.int32),
  )
  f = lambda *a: api.paged_attention(*a, window=32, implementation="pallas")
  text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert "xla.gpu.triton" in text


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("window", [None, 24])
def test_gpu_pallas_matches_oracle(dtype, window):
  rng = np.random.default_rng(12)
  q, kp, vp, bt, seq_lens, qsl = _batch(
    rng, [40, 1, 17, 1], [0, 70, 33, 5], 16, 4, 128, 16, dtype, window=window
  )
  out = api.paged_attention(
    q, kp, vp, bt, seq_lens, query_start_loc=qsl, window=window, implementation="pallas"
  )
  expect = _oracle(q, kp, vp, bt, seq_lens, qsl, window)
  # fp32 dots run as IEEE fp32 (HIGHEST); bf16 inputs round p to bf16 before the PV product.
  tol = dict(atol=1e-4, rtol=1e-4) if dtype == jnp.float32 else dict(atol=3e-2, rtol=3e-2)
  np.testing.assert_allclose(_f64(out), expect, **tol)
