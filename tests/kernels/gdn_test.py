"""Gated DeltaNet kernels vs the fp32 token-scan oracle (xla and Pallas interpret paths)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.pallas.gdn import api
from kernels.pallas.gdn import pallas_gpu
from kernels.pallas.gdn import reference

IMPLS = ["xla", "interpret"]
F32_ATOL = 1e-5  # kernels.md §9.2 (fp32 paths vs oracle).
BF16_REL_RMS = 5e-3  # kernels.md §9.2 (bf16 in, fp32 state vs fp32 oracle).


def make_inputs(t, h_k, h_v, d_k, d_v, *, dtype=jnp.float32, seed=0, decay=1.0, lead=()):
  ks = jax.random.split(jax.random.key(seed), 5)
  shp = tuple(lead) + (t,)
  q = jax.random.normal(ks[0], shp + (h_k, d_k)).astype(dtype)
  k = jax.random.normal(ks[1], shp + (h_k, d_k)).astype(dtype)
  v = jax.random.normal(ks[2], shp + (h_v, d_v)).astype(dtype)
  g = -jax.nn.softplus(jax.random.normal(ks[3], shp + (h_v,)) + 1.0) * decay
  beta = jax.nn.sigmoid(2.0 * jax.random.normal(ks[4], shp + (h_v,)))
  return q, k, v, g, beta


def rand_state(n, h_v, d_k, d_v, seed=7):
  return 0.3 * jax.random.normal(jax.random.key(seed), (n, h_v, d_k, d_v), jnp.float32)


def rel_rms(x, ref):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  return float(np.sqrt(np.mean((x - ref) ** 2)) / np.sqrt(np.mean(ref**2)))


def max_abs(x, ref):
  return float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(ref, np.float64))))


def oracle(q, k, v, g, beta, **kw):
  """Oracle on the same (possibly bf16-rounded) inputs, upcast to fp32."""
  f32 = [x.astype(jnp.float32) for x in (q, k, v, g, beta)]
  return reference.recurrent_gated_delta_rule(*f32, **kw)


# (T, H_k, H_v, d_k, d_v, cu_seqlens, dtype, decay)
PREFILL_CASES = [
  pytest.param(128, 2, 2, 64, 64, None, jnp.float32, 1.0, id="aligned-f32"),
  pytest.param(150, 1, 2, 64, 64, None, jnp.float32, 0.1, id="unaligned-gqa-f32"),
  pytest.param(
    200, 2, 4, 64, 64, [0, 64, 64, 137, 200], jnp.float32, 1.0, id="packed-gqa-empty-f32"
  ),
  pytest.param(96, 1, 1, 128, 128, [0, 30, 96], jnp.float32, 10.0, id="d128-packed-f32"),
  pytest.param(130, 2, 4, 64, 64, [0, 65, 130], jnp.bfloat16, 1.0, id="packed-gqa-bf16"),
  pytest.param(70, 1, 1, 128, 128, None, jnp.bfloat16, 0.01, id="d128-bf16"),
]


# Cases covered elsewhere in interpret mode run only with -m slow (keeps the default run short).
_SLOW_PREFILL = {
  ("interpret", "aligned-f32"),  # fp32 interpret accuracy: checkpoint and resume tests.
  ("interpret", "unaligned-gqa-f32"),
  ("interpret", "packed-gqa-empty-f32"),
  ("interpret", "d128-packed-f32"),
  ("xla", "d128-packed-f32"),
}


def _prefill_params():
  for impl in IMPLS:
    for case in PREFILL_CASES:
      marks = [pytest.mark.slow] if (impl, case.id) in _SLOW_PREFILL else []
      yield pytest.param(impl, *case.values, id=f"{case.id}-{impl}", marks=marks)


@pytest.mark.parametrize("impl,t,h_k,h_v,d_k,d_v,cu,dtype,decay", list(_prefill_params()))
def test_prefill_matches_oracle(impl, t, h_k, h_v, d_k, d_v, cu, dtype, decay):
  q, k, v, g, beta = make_inputs(t, h_k, h_v, d_k, d_v, dtype=dtype, decay=decay)
  n = 1 if cu is None else len(cu) - 1
  init = rand_state(n, h_v, d_k, d_v)
  cu_arr = None if cu is None else jnp.asarray(cu, jnp.int32)
  o, final, (states, counts) = api.chunk_gated_delta_rule(
    q, k, v, g, beta, initial_state=init, cu_seqlens=cu_arr, implementation=impl
  )
  ro, rf = oracle(q, k, v, g, beta, initial_state=init, cu_seqlens=cu)
  assert o.shape == v.shape and o.dtype == v.dtype
  assert final.shape == (n, h_v, d_k, d_v) and final.dtype == jnp.float32
  assert states.shape == (n, 0, h_v, d_k, d_v)
  np.testing.assert_array_equal(counts, np.zeros(n))
  if dtype == jnp.float32:
    assert max_abs(o, ro) <= F32_ATOL
    assert max_abs(final, rf) <= F32_ATOL
  else:
    assert rel_rms(o, ro) <= BF16_REL_RMS
    assert rel_rms(final, rf) <= BF16_REL_RMS


@pytest.mark.parametrize("impl", IMPLS)
def test_checkpoints_match_token_states(impl):
  cu = [0, 200, 200, 328, 390]
  t = cu[-1]
  q, k, v, g, beta = make_inputs(t, 1, 2, 64, 64, seed=3)
  init = rand_state(4, 2, 64, 64)
  _, final, (states, counts) = api.chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    initial_state=init,
    cu_seqlens=jnp.asarray(cu, jnp.int32),
    checkpoint_every=64,
    implementation=impl,
  )
  _, rf, rs = oracle(q, k, v, g, beta, initial_state=init, cu_seqlens=cu, return_states=True)
  np.testing.assert_array_equal(counts, [3, 0, 2, 0])
  assert states.shape == (4, 3, 2, 64, 64)
  for n in range(4):
    for j in range(3):
      if j < int(counts[n]):
        assert max_abs(states[n, j], rs[cu[n] + 64 * (j + 1) - 1]) <= F32_ATOL
      else:
        assert not np.any(np.asarray(states[n, j]))
  assert max_abs(final, rf) <= F32_ATOL
  np.testing.assert_array_equal(final[1], init[1])  # empty sequence keeps its state


@pytest.mark.parametrize("impl", ["xla", pytest.param("interpret", marks=pytest.mark.slow)])
def test_checkpoint_interval_128_and_exact_end(impl):
  q, k, v, g, beta = make_inputs(256, 1, 1, 64, 64, seed=4)
  _, final, (states, counts) = api.chunk_gated_delta_rule(
    q, k, v, g, beta, checkpoint_every=128, implementation=impl
  )
  np.testing.assert_array_equal(counts, [2])
  np.testing.assert_array_equal(states[0, 1], final[0])  # a multiple at the very end counts


@pytest.mark.parametrize("impl", IMPLS)
def test_resume_from_checkpoint_is_bit_exact(impl):
  t, split = 320, 192
  q, k, v, g, beta = make_inputs(t, 2, 2, 64, 64, seed=5)
  init = rand_state(1, 2, 64, 64)
  run = lambda sl, s0, **kw: api.chunk_gated_delta_rule(  # noqa: E731
    q[sl], k[sl], v[sl], g[sl], beta[sl], initial_state=s0, implementation=impl, **kw
  )
  o_all, f_all, (states, _) = run(slice(None), init, checkpoint_every=64)
  s_split = states[:, split // 64 - 1]
  o2, f2, _ = run(slice(split, None), s_split)
  np.testing.assert_array_equal(np.asarray(o2), np.asarray(o_all[split:]))
  np.testing.assert_array_equal(np.asarray(f2), np.asarray(f_all))


@pytest.mark.parametrize("impl", IMPLS)
def test_decode_after_prefill_matches_scan(impl):
  t, steps, h_k, h_v, d = 100, 3, 1, 2, 64
  q, k, v, g, beta = make_inputs(t + steps, h_k, h_v, d, d, seed=6)
  init = rand_state(1, h_v, d, d)
  _, final, _ = api.chunk_gated_delta_rule(
    q[:t], k[:t], v[:t], g[:t], beta[:t], initial_state=init, implementation=impl
  )
  pool = jnp.zeros((4, h_v, d, d), jnp.float32).at[1].set(final[0])
  read, write = 1, 2
  outs = []
  for i in range(t, t + steps):
    o, pool = api.fused_recurrent_gated_delta_rule_decode(
      q[i : i + 1],
      k[i : i + 1],
      v[i : i + 1],
      g[i : i + 1],
      beta[i : i + 1],
      state_pool=pool,
      read_indices=jnp.asarray([read], jnp.int32),
      write_indices=jnp.asarray([write], jnp.int32),
      implementation=impl,
    )
    outs.append(o[0])
    read, write = write, 3 if write == 2 else 2
  ro, rf = oracle(q, k, v, g, beta, initial_state=init)
  assert max_abs(jnp.stack(outs), ro[t:]) <= F32_ATOL
  assert max_abs(pool[read], rf[0]) <= F32_ATOL
  np.testing.assert_array_equal(pool[1], final[0])  # the cached slot is never overwritten


@pytest.mark.parametrize("impl", IMPLS)
def test_decode_batch_gqa_bf16(impl):
  n, h_k, h_v, d = 3, 2, 4, 64
  q, k, v, g, beta = make_inputs(n, h_k, h_v, d, d, dtype=jnp.bfloat16, seed=8)
  pool = rand_state(6, h_v, d, d)
  read = jnp.asarray([5, 0, 2], jnp.int32)
  write = jnp.asarray([1, 3, 4], jnp.int32)
  o, new_pool = api.fused_recurrent_gated_delta_rule_decode(
    q,
    k,
    v,
    g,
    beta,
    state_pool=pool,
    read_indices=read,
    write_indices=write,
    implementation=impl,
  )
  for i in range(n):
    ro, rf = oracle(
      q[i : i + 1],
      k[i : i + 1],
      v[i : i + 1],
      g[i : i + 1],
      beta[i : i + 1],
      initial_state=pool[read[i]][None],
    )
    assert rel_rms(o[i], ro[0]) <= 2e-3
    assert rel_rms(new_pool[write[i]], rf[0]) <= 2e-3
  for slot in (0, 2, 5):
    np.testing.assert_array_equal(new_pool[slot], pool[slot])


@pytest.mark.parametrize("impl", IMPLS)
def test_verify_per_token_states_match_scan(impl):
  n, kk, h_k, h_v, d = 2, 4, 1, 2, 64
  q, k, v, g, beta = make_inputs(kk, h_k, h_v, d, d, seed=9, lead=(n,))
  pool = rand_state(3, h_v, d, d)
  read = jnp.asarray([2, 0], jnp.int32)
  o, states = api.gated_delta_rule_verify(
    q, k, v, g, beta, state_pool=pool, read_indices=read, implementation=impl
  )
  assert o.shape == (n, kk, h_v, d) and states.shape == (n, kk, h_v, d, d)
  for i in range(n):
    ro, _, rs = oracle(
      q[i], k[i], v[i], g[i], beta[i], initial_state=pool[read[i]][None], return_states=True
    )
    assert max_abs(o[i], ro) <= F32_ATOL
    assert max_abs(states[i], rs) <= F32_ATOL


@pytest.mark.parametrize("impl", ["xla", pytest.param("interpret", marks=pytest.mark.slow)])
def test_traced_cu_seqlens_under_jit(impl):
  cu = jnp.asarray([0, 64, 192], jnp.int32)
  q, k, v, g, beta = make_inputs(192, 1, 1, 64, 64, seed=10)

  @jax.jit
  def f(cu):
    return api.chunk_gated_delta_rule(
      q, k, v, g, beta, cu_seqlens=cu, checkpoint_every=64, implementation=impl
    )

  o, final, (states, counts) = f(cu)
  assert states.shape[1] == 192 // 64  # traced: M = T // checkpoint_every
  np.testing.assert_array_equal(counts, [1, 2])
  ro, rf, rs = oracle(q, k, v, g, beta, cu_seqlens=[0, 64, 192], return_states=True)
  assert max_abs(o, ro) <= F32_ATOL and max_abs(final, rf) <= F32_ATOL
  assert max_abs(states[1, 1], rs[191]) <= F32_ATOL


def test_concrete_cu_seqlens_sizes_checkpoints():
  q, k, v, g, beta = make_inputs(192, 1, 1, 64, 64)
  _, _, (states, counts) = api.chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    cu_seqlens=jnp.asarray([0, 64, 192]),
    checkpoint_every=64,
    implementation="xla",
  )
  assert states.shape[1] == 2
  _, _, (states, counts) = api.chunk_gated_delta_rule(
    q, k, v, g, beta, checkpoint_every=64, max_checkpoints=1, implementation="xla"
  )
  assert states.shape[1] == 1
  np.testing.assert_array_equal(counts, [1])


def _bad_prefill_calls():
  q, k, v, g, beta = make_inputs(64, 1, 2, 64, 64)
  ok = dict(q=q, k=k, v=v, g=g, beta=beta)
  yield "checkpoint_every", dict(ok, checkpoint_every=100)
  yield "checkpoint_every", dict(ok, checkpoint_every=0)
  yield "k", dict(ok, k=k[:, :, :32])
  yield "v", dict(ok, v=v[:32])
  yield "g", dict(ok, g=g[:, :1])
  yield "beta", dict(ok, beta=beta[:10])
  yield "q", dict(ok, q=q.astype(jnp.int32))
  yield "cu_seqlens", dict(ok, cu_seqlens=jnp.asarray([0, 10, 50]))
  yield "cu_seqlens", dict(ok, cu_seqlens=jnp.asarray([0, 40, 30, 64]))
  yield "initial_state", dict(ok, initial_state=jnp.zeros((2, 2, 64, 64)))
  yield "initial_state", dict(ok, initial_state=jnp.zeros((1, 2, 64, 64), jnp.bfloat16))
  yield "max_checkpoints", dict(ok, max_checkpoints=2)
  yield "max_checkpoints", dict(ok, checkpoint_every=64, max_checkpoints=-1)
  yield "g", dict(ok, g=g.astype(jnp.int32))
  yield "implementation", dict(ok, implementation="cuda")
  yield "d_v", dict(ok, v=v[:, :, :48], implementation="interpret")


@pytest.mark.parametrize("name,kwargs", list(_bad_prefill_calls()))
def test_prefill_bad_input_raises(name, kwargs):
  kwargs = dict(kwargs)
  args = [kwargs.pop(x) for x in ("q", "k", "v", "g", "beta")]
  with pytest.raises(ValueError, match=name):
    api.chunk_gated_delta_rule(*args, **kwargs)


def test_decode_bad_input_raises():
  q, k, v, g, beta = make_inputs(2, 1, 2, 64, 64)
  pool = jnp.zeros((3, 2, 64, 64))
  ok = dict(state_pool=pool, read_indices=jnp.asarray([0, 1]), write_indices=jnp.asarray([2, 0]))
  f = api.fused_recurrent_gated_delta_rule_decode
  with pytest.raises(ValueError, match="write_indices"):
    f(q, k, v, g, beta, **dict(ok, write_indices=jnp.asarray([2, 3])))
  with pytest.raises(ValueError, match="read_indices"):
    f(q, k, v, g, beta, **dict(ok, read_indices=jnp.asarray([-1, 0])))
  with pytest.raises(ValueError, match="read_indices"):
    f(q, k, v, g, beta, **dict(ok, read_indices=jnp.asarray([0])))
  with pytest.raises(ValueError, match="state_pool"):
    f(q, k, v, g, beta, **dict(ok, state_pool=jnp.zeros((3, 2, 64, 32))))
  with pytest.raises(ValueError, match="state_pool"):
    f(q, k, v, g, beta, **dict(ok, state_pool=pool.astype(jnp.bfloat16)))
  with pytest.raises(ValueError, match="beta"):
    f(q, k, v, g, beta[:, :1], **ok)
  with pytest.raises(ValueError, match="read_indices"):
    api.gated_delta_rule_verify(
      q[None],
      k[None],
      v[None],
      g[None],
      beta[None],
      state_pool=pool,
      read_indices=jnp.asarray([3]),
    )


def _pallas_prefill(q, k, v, g, beta, init, cu, **kw):
  return pallas_gpu.chunk_gated_delta_rule_pallas(
    q,
    k,
    v,
    g,
    beta,
    initial_state=init,
    cu_seqlens=jnp.asarray(cu, jnp.int32),
    scale=q.shape[-1] ** -0.5,
    interpret=True,
    **{"checkpoint_every": None, "max_checkpoints": 0, **kw},
  )


def test_pallas_blocked_and_product_inverse_agree():
  """The 2x2-blocked inverse and the 64x64 product form give the same prefill (fp32)."""
  cu = [0, 64, 64, 137, 150]
  q, k, v, g, beta = make_inputs(150, 2, 4, 64, 64)
  init = rand_state(len(cu) - 1, 4, 64, 64)
  ob, fb, _ = _pallas_prefill(q, k, v, g, beta, init, cu, inverse="blocked")
  op, fp, _ = _pallas_prefill(q, k, v, g, beta, init, cu, inverse="product")
  ro, rf = oracle(q, k, v, g, beta, initial_state=init, cu_seqlens=cu)
  assert max_abs(ob, ro) <= F32_ATOL and max_abs(fb, rf) <= F32_ATOL
  assert max_abs(ob, op) <= 1e-6 and max_abs(fb, fp) <= 1e-6


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_pallas_parallel_and_fused_output_pass_bit_identical(dtype):
  """The split path (state kernel + parallel output kernel) feeds the same operands to the same
  dots as the fused sequential kernel: o, final state and fp32 checkpoints are bit-identical in
  interpret mode (packed sequences, an empty one, partial chunks, two d_v tiles)."""
  cu = [0, 64, 64, 137, 300]
  q, k, v, g, beta = make_inputs(300, 2, 4, 64, 64, dtype=dtype, seed=9)
  init = rand_state(len(cu) - 1, 4, 64, 64)
  kw = dict(checkpoint_every=64, max_checkpoints=3, block_v=32, out_block_v=32)
  fused = _pallas_prefill(q, k, v, g, beta, init, cu, output_pass="fused", **kw)
  par = _pallas_prefill(q, k, v, g, beta, init, cu, output_pass="parallel", **kw)
  for x, y in zip(jax.tree.leaves(fused), jax.tree.leaves(par), strict=True):
    np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))
  ro, rf = oracle(q, k, v, g, beta, initial_state=init, cu_seqlens=cu)
  tol = F32_ATOL if dtype == jnp.float32 else None
  if tol is None:
    assert rel_rms(par[0], ro) <= BF16_REL_RMS and rel_rms(par[1], rf) <= BF16_REL_RMS
  else:
    assert max_abs(par[0], ro) <= tol and max_abs(par[1], rf) <= tol
  np.testing.assert_array_equal(par[2][1], [1, 0, 1, 2])  # lengths 64, 0, 73, 163


@pytest.mark.parametrize(
  "kw", [dict(inverse="neumann"), dict(stop_after="output"), dict(output_pass="serial")]
)
def test_pallas_prefill_bad_switch_raises(kw):
  q, k, v, g, beta = make_inputs(64, 1, 1, 64, 64)
  with pytest.raises(ValueError, match=next(iter(kw))):
    _pallas_prefill(q, k, v, g, beta, rand_state(1, 1, 64, 64), [0, 64], **kw)


def _lower_for_cuda(fn, *args, **kwargs):
  return jax.jit(functools.partial(fn, **kwargs)).trace(*args).lower(lowering_platforms=("cuda",))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_pallas_kernels_lower_for_cuda(dtype):
  """Cross-lowers every Pallas kernel to Triton IR on CPU (catches lowering errors)."""
  spec = jax.ShapeDtypeStruct
  t, n, kk, h_k, h_v, d = 256, 2, 4, 2, 4, 128
  tok = (
    spec((t, h_k, d), dtype),
    spec((t, h_k, d), dtype),
    spec((t, h_v, d), dtype),
    spec((t, h_v), jnp.float32),
    spec((t, h_v), jnp.float32),
  )
  names = {"fused": ("gdn_chunk_inter",), "parallel": ("gdn_chunk_state", "gdn_chunk_output")}
  for inverse, output_pass in [
    ("blocked", "parallel"),
    ("product", "parallel"),
    ("product", "fused"),
  ]:
    lowered = _lower_for_cuda(
      lambda q, k, v, g, b, s0, cu, inverse=inverse, output_pass=output_pass: (
        pallas_gpu.chunk_gated_delta_rule_pallas(
          q,
          k,
          v,
          g,
          b,
          initial_state=s0,
          cu_seqlens=cu,
          checkpoint_every=128,
          max_checkpoints=2,
          scale=0.1,
          inverse=inverse,
          output_pass=output_pass,
        )
      ),
      *tok,
      spec((n, h_v, d, d), jnp.float32),
      spec((n + 1,), jnp.int32),
    )
    text = lowered.as_text()
    assert all(name in text for name in ("gdn_chunk_intra",) + names[output_pass])
  pool = spec((8, h_v, d, d), jnp.float32)
  idx = spec((n,), jnp.int32)
  step = tuple(spec((n,) + x.shape[1:], x.dtype) for x in tok)
  lowered = _lower_for_cuda(
    lambda q, k, v, g, b, p, r, w: pallas_gpu.decode_pallas(
      q, k, v, g, b, state_pool=p, read_indices=r, write_indices=w, scale=0.1
    ),
    *step,
    pool,
    idx,
    idx,
  )
  assert "gdn_decode" in lowered.as_text()
  win = tuple(spec((n, kk) + x.shape[1:], x.dtype) for x in tok)
  lowered = _lower_for_cuda(
    lambda q, k, v, g, b, p, r: pallas_gpu.verify_pallas(
      q, k, v, g, b, state_pool=p, read_indices=r, scale=0.1
    ),
    *win,
    pool,
    idx,
  )
  assert "gdn_verify" in lowered.as_text()


@pytest.mark.gpu
@pytest.mark.parametrize("t,cu", [(4096, None), (3000, [0, 1000, 1000, 2300, 3000])])
def test_gpu_pallas_prefill_bf16_matches_oracle(t, cu):
  q, k, v, g, beta = make_inputs(t, 4, 8, 128, 128, dtype=jnp.bfloat16, seed=11)
  n = 1 if cu is None else len(cu) - 1
  init = rand_state(n, 8, 128, 128)
  cu_arr = None if cu is None else jnp.asarray(cu, jnp.int32)
  o, final, (states, counts) = api.chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    initial_state=init,
    cu_seqlens=cu_arr,
    checkpoint_every=512,
    implementation="pallas",
  )
  ro, rf, rs = oracle(q, k, v, g, beta, initial_state=init, cu_seqlens=cu, return_states=True)
  assert rel_rms(o, ro) <= BF16_REL_RMS
  assert rel_rms(final, rf) <= BF16_REL_RMS
  assert rel_rms(states[0, 0], rs[511]) <= BF16_REL_RMS
  xo, xf, (xs, xc) = api.chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    initial_state=init,
    cu_seqlens=cu_arr,
    checkpoint_every=512,
    implementation="xla",
  )
  assert rel_rms(xo, ro) <= BF16_REL_RMS and rel_rms(xf, rf) <= BF16_REL_RMS
  np.testing.assert_array_equal(counts, xc)


@pytest.mark.gpu
def test_gpu_pallas_parallel_and_fused_output_pass_agree():
  """On GPU both output passes match the oracle; the state chain is the same code in both."""
  cu = [0, 1000, 1000, 2300, 3000]
  q, k, v, g, beta = make_inputs(3000, 4, 8, 128, 128, dtype=jnp.bfloat16, seed=13)
  init = rand_state(len(cu) - 1, 8, 128, 128)
  ro, rf = oracle(q, k, v, g, beta, initial_state=init, cu_seqlens=cu)
  res = {}
  for output_pass in ("fused", "parallel"):
    res[output_pass] = pallas_gpu.chunk_gated_delta_rule_pallas(
      q,
      k,
      v,
      g,
      beta,
      initial_state=init,
      cu_seqlens=jnp.asarray(cu, jnp.int32),
      checkpoint_every=256,
      max_checkpoints=5,
      scale=128**-0.5,
      output_pass=output_pass,
    )
    o, final, _ = res[output_pass]
    assert rel_rms(o, ro) <= BF16_REL_RMS and rel_rms(final, rf) <= BF16_REL_RMS
  (fo, ff, (fs, fc)), (po, pf, (ps, pc)) = res["fused"], res["parallel"]
  assert rel_rms(po, fo) <= 1e-3
  assert rel_rms(pf, ff) <= 1e-5 and rel_rms(ps, fs) <= 1e-5
  np.testing.assert_array_equal(pc, fc)


@pytest.mark.gpu
def test_gpu_pallas_decode_and_verify_match_xla():
  n, kk, h_k, h_v, d = 8, 4, 4, 8, 128
  q, k, v, g, beta = make_inputs(kk, h_k, h_v, d, d, seed=12, lead=(n,))
  pool = rand_state(2 * n, h_v, d, d)
  read = jnp.arange(n, dtype=jnp.int32)
  write = read + n
  o, new_pool = api.fused_recurrent_gated_delta_rule_decode(
    q[:, 0],
    k[:, 0],
    v[:, 0],
    g[:, 0],
    beta[:, 0],
    state_pool=pool,
    read_indices=read,
    write_indices=write,
    implementation="pallas",
  )
  xo, xpool = api.fused_recurrent_gated_delta_rule_decode(
    q[:, 0],
    k[:, 0],
    v[:, 0],
    g[:, 0],
    beta[:, 0],
    state_pool=pool,
    read_indices=read,
    write_indices=write,
    implementation="xla",
  )
  assert rel_rms(o, xo) <= 2e-3 and rel_rms(new_pool, xpool) <= 2e-3
  vo, vs = api.gated_delta_rule_verify(
    q, k, v, g, beta, state_pool=pool, read_indices=read, implementation="pallas"
  )
  xvo, xvs = api.gated_delta_rule_verify(
    q, k, v, g, beta, state_pool=pool, read_indices=read, implementation="xla"
  )
  assert rel_rms(vo, xvo) <= 2e-3 and rel_rms(vs, xvs) <= 2e-3
  np.testing.assert_allclose(vs[:, 0], new_pool[n:], rtol=1e-4, atol=1e-5)
