"""Mamba2 SSD kernels vs the fp32 token-scan oracle (xla and Pallas-interpret paths)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.pallas.ssd import api
from kernels.pallas.ssd import pallas_gpu
from kernels.pallas.ssd import reference


def _inputs(seed, t, h, p, g, n, n_seq, dtype=jnp.float32, batch_shape=None):
  rng = np.random.default_rng(seed)
  lead = (t,) if batch_shape is None else batch_shape
  x = rng.standard_normal(lead + (h, p))
  dt = rng.standard_normal(lead + (h,)) - 1.0
  a = -rng.uniform(0.5, 4.0, (h,))
  b = rng.standard_normal(lead + (g, n)) / np.sqrt(n)
  c = rng.standard_normal(lead + (g, n))
  d = rng.standard_normal((h,))
  bias = rng.standard_normal((h,)) * 0.5
  s0 = rng.standard_normal((n_seq, h, p, n))
  f = lambda v, dt_=dtype: jnp.asarray(v, dt_)
  return dict(
    x=f(x),
    dt=f(dt),
    A=f(a, jnp.float32),
    B=f(b),
    C=f(c),
    D=f(d, jnp.float32),
    dt_bias=f(bias, jnp.float32),
    initial_state=f(s0, jnp.float32),
  )


def _rounded(inp):
  """fp32 copies of (possibly bf16) inputs, for the fp32 oracle."""
  return {k: v.astype(jnp.float32) for k, v in inp.items()}


def _max_rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.max(np.abs(a - b), initial=0.0) / max(1.0, np.max(np.abs(b), initial=0.0))


def _rel_rms(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.sqrt(np.mean((a - b) ** 2)) / max(np.sqrt(np.mean(b**2)), 1e-30)


def _pad_slots(states, m):
  """Zero-pads the checkpoint-slot axis to m (jit with a traced cu_seqlens uses M = T // every)."""
  extra = m - states.shape[1]
  assert extra >= 0
  return jnp.pad(states, [(0, 0), (0, extra)] + [(0, 0)] * (states.ndim - 2))


def _run_eager(inp, impl, **kw):
  i = dict(inp)
  x, dt, a, b, c = (i.pop(k) for k in ("x", "dt", "A", "B", "C"))
  return api.chunk_scan(x, dt, a, b, c, implementation=impl, **i, **kw)


@functools.cache
def _jitted(impl, static):
  def f(inp, cu):
    return _run_eager(inp, impl, cu_seqlens=cu, **dict(static))

  return jax.jit(f)


def _run(inp, impl, cu_seqlens=None, **kw):
  """chunk_scan under jit (cu_seqlens traced) to keep CPU test time low."""
  cu = None if cu_seqlens is None else jnp.asarray(cu_seqlens, jnp.int32)
  return _jitted(impl, tuple(sorted(kw.items())))(inp, cu)


def _oracle(inp, **kw):
  i = _rounded(inp)
  x, dt, a, b, c = (i.pop(k) for k in ("x", "dt", "A", "B", "C"))
  kw.pop("chunk_size", None)
  return reference.ssd_oracle(x, dt, a, b, c, **i, **kw)


# (T, H, P, G, N, chunk, cu_seqlens, checkpoint_every)
CASES = {
  "packed_unaligned": (100, 4, 16, 2, 16, 16, [0, 1, 37, 37, 100], 32),
  "single_aligned_p64": (64, 2, 64, 1, 32, 32, None, 32),
  "p128_groups": (40, 4, 128, 4, 16, 16, [0, 17, 40], 16),
}


@pytest.mark.parametrize("impl", ["xla", "interpret"])
@pytest.mark.parametrize("case", list(CASES))
def test_chunk_scan_matches_oracle_fp32(impl, case):
  t, h, p, g, n, chunk, cu, every = CASES[case]
  n_seq = 1 if cu is None else len(cu) - 1
  inp = _inputs(0, t, h, p, g, n, n_seq)
  kw = dict(cu_seqlens=None if cu is None else np.asarray(cu, np.int32), checkpoint_every=every)
  y, final, (states, counts) = _run(inp, impl, chunk_size=chunk, **kw)
  yo, fo, (so, co) = _oracle(inp, **kw)
  assert y.shape == (t, h, p) and y.dtype == jnp.float32
  assert final.shape == (n_seq, h, p, n) and final.dtype == jnp.float32
  assert _max_rel(y, yo) <= 2e-5
  assert _max_rel(final, fo) <= 2e-5
  np.testing.assert_array_equal(counts, co)
  assert _max_rel(states, _pad_slots(so, states.shape[1])) <= 2e-5


@pytest.mark.parametrize("impl", ["xla", "interpret"])
@pytest.mark.parametrize("dt_shift", [-12.0, 6.0])
def test_extreme_decay_is_finite_and_matches(impl, dt_shift):
  # dt_shift=6: per-token dt*A down to about -24, per-chunk cumsum to about -400 (exp underflow);
  # dt_shift=-12: almost no decay and tiny inputs.
  t, h, p, g, n, chunk, cu, every = CASES["packed_unaligned"]
  inp = _inputs(21, t, h, p, g, n, len(cu) - 1)
  inp["dt"] = inp["dt"] + dt_shift
  y, final, (states, _) = _run(inp, impl, chunk_size=chunk, cu_seqlens=cu, checkpoint_every=every)
  yo, fo, (so, _) = _oracle(inp, cu_seqlens=np.asarray(cu), checkpoint_every=every)
  assert np.all(np.isfinite(np.asarray(y))) and np.all(np.isfinite(np.asarray(final)))
  assert _max_rel(y, yo) <= 2e-5 and _max_rel(final, fo) <= 2e-5
  assert _max_rel(states, _pad_slots(so, states.shape[1])) <= 2e-5


@functools.cache
def _parallel_jitted(static):
  def f(inp, cu):
    i = dict(inp)
    x, dt, a, b, c = (i.pop(k) for k in ("x", "dt", "A", "B", "C"))
    return pallas_gpu.ssd_chunk_scan(
      x, dt, a, b, c, cu_seqlens=cu, algorithm="parallel", interpret=True, **i, **dict(static)
    )

  return jax.jit(f)


def _run_parallel(inp, cu_seqlens=None, **kw):
  cu = None if cu_seqlens is None else jnp.asarray(cu_seqlens, jnp.int32)
  return _parallel_jitted(tuple(sorted(kw.items())))(inp, cu)


@pytest.mark.parametrize("case", ["packed_unaligned", "p128_groups"])
def test_parallel_algorithm_matches_oracle(case):
  t, h, p, g, n, chunk, cu, every = CASES[case]
  inp = _inputs(0, t, h, p, g, n, len(cu) - 1)
  y, final, (states, counts) = _run_parallel(
    inp, cu_seqlens=cu, chunk_size=chunk, checkpoint_every=every
  )
  yo, fo, (so, co) = _oracle(inp, cu_seqlens=np.asarray(cu), checkpoint_every=every)
  assert _max_rel(y, yo) <= 2e-5 and _max_rel(final, fo) <= 2e-5
  np.testing.assert_array_equal(counts, co)
  assert _max_rel(states, _pad_slots(so, states.shape[1])) <= 2e-5


def test_parallel_algorithm_resume_is_bit_exact():
  inp = _inputs(3, 96, 2, 16, 2, 16, 1)
  y, final, (states, _) = _run_parallel(inp, chunk_size=16, checkpoint_every=32)
  rest = {k: (v[64:] if k in ("x", "dt", "B", "C") else v) for k, v in inp.items()}
  rest["initial_state"] = states[:, 1]
  y2, final2, _ = _run_parallel(rest, chunk_size=16)
  np.testing.assert_array_equal(np.asarray(y2), np.asarray(y[64:]))
  np.testing.assert_array_equal(np.asarray(final2), np.asarray(final))


@pytest.mark.parametrize("impl", ["xla", "interpret"])
def test_chunk_scan_bf16(impl):
  t, h, p, g, n = 80, 4, 64, 2, 32
  cu = np.array([0, 50, 80], np.int32)
  inp = _inputs(1, t, h, p, g, n, 2, dtype=jnp.bfloat16)
  y, final, (states, _) = _run(inp, impl, chunk_size=16, cu_seqlens=cu, checkpoint_every=16)
  yo, fo, (so, _) = _oracle(inp, cu_seqlens=cu, checkpoint_every=16)
  assert y.dtype == jnp.bfloat16 and final.dtype == jnp.float32
  assert _rel_rms(y, yo) <= 5e-3
  assert _rel_rms(final, fo) <= 5e-3
  assert _rel_rms(states, _pad_slots(so, states.shape[1])) <= 5e-3


@pytest.mark.parametrize("impl", ["xla", "interpret"])
def test_max_checkpoints_drops_extra_and_clips_counts(impl):
  t, h, p, g, n = 64, 2, 16, 1, 16
  inp = _inputs(20, t, h, p, g, n, 2)
  cu = np.array([0, 50, 64], np.int32)
  # Default M = max_n L_n // 16 when cu_seqlens is concrete (checked without running).
  shapes = jax.eval_shape(
    lambda inp: _run_eager(inp, impl, chunk_size=16, cu_seqlens=cu, checkpoint_every=16), inp
  )
  assert shapes[2][0].shape == (2, 3, h, p, n)
  _, f_all, (s_all, c_all) = _run(
    inp, impl, chunk_size=16, cu_seqlens=cu, checkpoint_every=16, max_checkpoints=3
  )
  np.testing.assert_array_equal(c_all, [3, 0])
  _, f1, (s1, c1) = _run(
    inp, impl, chunk_size=16, cu_seqlens=cu, checkpoint_every=16, max_checkpoints=1
  )
  np.testing.assert_array_equal(c1, [1, 0])
  np.testing.assert_array_equal(np.asarray(s1[:, 0]), np.asarray(s_all[:, 0]))
  np.testing.assert_array_equal(np.asarray(f1), np.asarray(f_all))


def test_jit_with_traced_cu_seqlens():
  t, h, p, g, n = 70, 2, 16, 1, 16
  inp = _inputs(2, t, h, p, g, n, 3)
  cu = np.array([0, 20, 33, 70], np.int32)
  f = jax.jit(
    functools.partial(_run, impl="xla", chunk_size=16, checkpoint_every=16, max_checkpoints=3)
  )
  y, final, (states, counts) = f(inp, cu_seqlens=jnp.asarray(cu))
  yo, fo, (so, co) = _oracle(inp, cu_seqlens=cu, checkpoint_every=16, max_checkpoints=3)
  assert _max_rel(y, yo) <= 2e-5 and _max_rel(final, fo) <= 2e-5
  np.testing.assert_array_equal(counts, co)
  assert _max_rel(states, _pad_slots(so, states.shape[1])) <= 2e-5


@pytest.mark.parametrize("impl", ["xla", "interpret"])
def test_resume_from_checkpoint_is_bit_exact(impl):
  t, h, p, g, n, chunk = 96, 2, 16, 2, 16, 16
  inp = _inputs(3, t, h, p, g, n, 1)
  y, final, (states, counts) = _run(inp, impl, chunk_size=chunk, checkpoint_every=32)
  assert int(counts[0]) == 3
  split = 64  # state after 64 tokens is checkpoint j = 1
  rest = {k: (v[split:] if k in ("x", "dt", "B", "C") else v) for k, v in inp.items()}
  rest["initial_state"] = states[:, 1]
  y2, final2, _ = _run(rest, impl, chunk_size=chunk)
  np.testing.assert_array_equal(np.asarray(y2), np.asarray(y[split:]))
  np.testing.assert_array_equal(np.asarray(final2), np.asarray(final))


@pytest.mark.parametrize("impl", ["xla"])
def test_resume_unaligned_split(impl):
  t, h, p, g, n, chunk = 90, 2, 16, 1, 16, 16
  inp = _inputs(4, t, h, p, g, n, 1)
  y, final, _ = _run(inp, impl, chunk_size=chunk)
  split = 37
  first = {k: (v[:split] if k in ("x", "dt", "B", "C") else v) for k, v in inp.items()}
  y1, f1, _ = _run(first, impl, chunk_size=chunk)
  rest = {k: (v[split:] if k in ("x", "dt", "B", "C") else v) for k, v in inp.items()}
  rest["initial_state"] = f1
  y2, f2, _ = _run(rest, impl, chunk_size=chunk)
  assert _max_rel(jnp.concatenate([y1, y2]), y) <= 1e-5
  assert _max_rel(f2, final) <= 1e-5


@pytest.mark.parametrize("impl", ["xla", "interpret"])
def test_decode_after_prefill_matches_token_scan(impl):
  t, h, p, g, n, prefill = 40, 4, 16, 2, 16, 33
  n_seq = 2
  inp = _inputs(5, t, h, p, g, n, n_seq)
  # Two sequences of t tokens each, laid out [seq, token]; prefill both, then decode.
  inp2 = _inputs(6, t, h, p, g, n, n_seq)
  both = {
    k: (jnp.concatenate([inp[k], inp2[k]]) if k in ("x", "dt", "B", "C") else inp[k]) for k in inp
  }
  cu_full = np.array([0, t, 2 * t], np.int32)
  yo, fo, _ = _oracle(both, cu_seqlens=cu_full)
  pre = {
    k: (
      jnp.concatenate([inp[k][:prefill], inp2[k][:prefill]])
      if k in ("x", "dt", "B", "C")
      else inp[k]
    )
    for k in inp
  }
  cu_pre = np.array([0, prefill, 2 * prefill], np.int32)
  _, final, _ = _run(pre, impl, chunk_size=16, cu_seqlens=cu_pre)
  pool = jnp.zeros((5, h, p, n), jnp.float32).at[jnp.array([3, 1])].set(final)
  read = jnp.array([3, 1], jnp.int32)
  write = jnp.array([2, 4], jnp.int32)
  ys = []
  for i in range(prefill, t):
    tok = lambda k, i=i: jnp.stack([inp[k][i], inp2[k][i]])
    y, pool = api.ssd_decode(
      tok("x"),
      tok("dt"),
      inp["A"],
      tok("B"),
      tok("C"),
      D=inp["D"],
      dt_bias=inp["dt_bias"],
      state_pool=pool,
      read_indices=read,
      write_indices=write,
      implementation=impl,
    )
    ys.append(y)
    read, write = write, read
  y_dec = jnp.stack(ys, 1)  # [2, steps, H, P]
  yo2 = yo.reshape(2, t, h, p)[:, prefill:]
  assert _max_rel(y_dec, yo2) <= 1e-5
  assert _max_rel(pool[read], fo) <= 1e-5


@pytest.mark.parametrize("impl", ["xla", "interpret"])
def test_verify_returns_per_token_states(impl):
  nb, s, h, p, g, n = 3, 4, 2, 32, 1, 16
  inp = _inputs(7, 0, h, p, g, n, nb, batch_shape=(nb, s))
  pool = jnp.asarray(np.random.default_rng(8).standard_normal((6, h, p, n)), jnp.float32)
  read = jnp.array([5, 0, 2], jnp.int32)
  y, states = api.ssd_verify(
    inp["x"],
    inp["dt"],
    inp["A"],
    inp["B"],
    inp["C"],
    D=inp["D"],
    dt_bias=inp["dt_bias"],
    state_pool=pool,
    read_indices=read,
    implementation=impl,
  )
  assert y.shape == (nb, s, h, p) and states.shape == (nb, s, h, p, n)
  flat = lambda a: a.reshape((nb * s,) + a.shape[2:])
  cu = np.arange(0, nb * s + 1, s, dtype=np.int32)
  yo, fo, (so, _) = reference.ssd_oracle(
    flat(inp["x"]),
    flat(inp["dt"]),
    inp["A"],
    flat(inp["B"]),
    flat(inp["C"]),
    D=inp["D"],
    dt_bias=inp["dt_bias"],
    initial_state=pool[read],
    cu_seqlens=cu,
    checkpoint_every=1,
  )
  assert _max_rel(y, yo.reshape(nb, s, h, p)) <= 1e-5
  assert _max_rel(states, so[:, :s]) <= 1e-5
  assert _max_rel(states[:, -1], fo) <= 1e-5


def _bad_kwargs():
  inp = _inputs(9, 32, 2, 16, 1, 16, 1)
  return inp


@pytest.mark.parametrize(
  "change, match",
  [
    (dict(checkpoint_every=24), "checkpoint_every"),
    (dict(checkpoint_every=0), "checkpoint_every"),
    (dict(A=jnp.zeros((3,))), "A"),
    (dict(B=jnp.zeros((32, 3, 16)), C=jnp.zeros((32, 3, 16))), "groups"),
    (dict(C=jnp.zeros((32, 1, 8))), "C"),
    (dict(dt=jnp.zeros((32, 3))), "dt"),
    (dict(cu_seqlens=np.array([0, 10, 31], np.int32)), "cu_seqlens"),
    (dict(cu_seqlens=np.array([0, 20, 10, 32], np.int32)), "cu_seqlens"),
    (dict(initial_state=jnp.zeros((2, 2, 16, 16))), "initial_state"),
    (dict(implementation="cuda"), "implementation"),
    (dict(implementation="interpret", chunk_size=24), "chunk_size"),
    (dict(checkpoint_every=16, max_checkpoints=-1), "max_checkpoints"),
    (dict(max_checkpoints=2), "max_checkpoints"),
    (dict(x=jnp.zeros((32, 2, 16), jnp.int32)), "x has dtype int32"),
    (dict(dt=jnp.zeros((32, 2), jnp.int32)), "dt has dtype int32"),
    (dict(initial_state=jnp.zeros((1, 2, 16, 16), jnp.bfloat16)), "initial_state has dtype"),
  ],
)
def test_bad_inputs_raise(change, match):
  inp = _bad_kwargs()
  kw = dict(chunk_size=16, implementation="xla")
  for k in list(change):
    if k in inp:
      inp[k] = change.pop(k)
  kw.update(change)
  impl = kw.pop("implementation")
  with pytest.raises(ValueError, match=match):
    _run_eager(inp, impl, **kw)


def test_decode_bad_indices_raise():
  inp = _inputs(10, 0, 2, 16, 1, 16, 1, batch_shape=(2,))
  pool = jnp.zeros((3, 2, 16, 16))
  args = (inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"])
  with pytest.raises(ValueError, match="write_indices"):
    api.ssd_decode(
      *args,
      state_pool=pool,
      read_indices=jnp.array([0, 1]),
      write_indices=jnp.array([0, 3]),
      implementation="xla",
    )
  with pytest.raises(ValueError, match="read_indices"):
    api.ssd_decode(*args, state_pool=pool, read_indices=jnp.array([0.0, 1.0]),
                   write_indices=jnp.array([0, 1]), implementation="xla")  # fmt: skip
  with pytest.raises(ValueError, match="state_pool"):
    api.ssd_decode(
      *args,
      state_pool=pool[:, :, :8],
      read_indices=jnp.array([0, 1]),
      write_indices=jnp.array([0, 1]),
      implementation="xla",
    )


def _lower_cuda(f, *args):
  return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_pallas_kernels_lower_for_cuda(dtype):
  t, h, p, g, n = 200, 4, 128, 2, 64
  inp = _inputs(11, t, h, p, g, n, 3, dtype=dtype)
  cu = jnp.array([0, 64, 90, 200], jnp.int32)

  def prefill(inp, cu):
    return _run(inp, "pallas", chunk_size=64, cu_seqlens=cu, checkpoint_every=64, max_checkpoints=2)

  assert "ssd_chunk_scan" in _lower_cuda(prefill, inp, cu).as_text()

  def prefill_parallel(inp, cu):
    i = dict(inp)
    x, dt, a, b, c = (i.pop(k) for k in ("x", "dt", "A", "B", "C"))
    return pallas_gpu.ssd_chunk_scan(
      x, dt, a, b, c, cu_seqlens=cu, chunk_size=64, checkpoint_every=64, max_checkpoints=2,
      algorithm="parallel", **i,
    )  # fmt: skip

  text = _lower_cuda(prefill_parallel, inp, cu).as_text()
  assert "ssd_chunk_state" in text and "ssd_state_pass" in text and "ssd_chunk_output" in text
  one = {k: v for k, v in inp.items() if k != "initial_state"}
  _lower_cuda(lambda inp: _run(inp, "pallas", chunk_size=64), one)  # single-sequence path
  nb = 3
  dec = _inputs(12, 0, h, p, g, n, 1, dtype=dtype, batch_shape=(nb,))
  pool = jnp.zeros((4, h, p, n), jnp.float32)
  idx = jnp.array([0, 1, 2], jnp.int32)
  _lower_cuda(
    lambda pool: pallas_gpu.ssd_decode(
      dec["x"],
      dec["dt"],
      dec["A"],
      dec["B"],
      dec["C"],
      D=dec["D"],
      dt_bias=dec["dt_bias"],
      state_pool=pool,
      read_indices=idx,
      write_indices=idx,
    ),
    pool,
  )
  ver = _inputs(13, 0, h, p, g, n, 1, dtype=dtype, batch_shape=(nb, 4))
  _lower_cuda(
    lambda pool: pallas_gpu.ssd_verify(
      ver["x"],
      ver["dt"],
      ver["A"],
      ver["B"],
      ver["C"],
      D=ver["D"],
      dt_bias=ver["dt_bias"],
      state_pool=pool,
      read_indices=idx,
    ),
    pool,
  )


@pytest.mark.slow
def test_interpret_large_head_dims():
  t, h, p, g, n = 300, 4, 128, 2, 128
  cu = np.array([0, 128, 300], np.int32)
  inp = _inputs(14, t, h, p, g, n, 2)
  y, final, (states, _) = _run(inp, "interpret", chunk_size=64, cu_seqlens=cu, checkpoint_every=64)
  yo, fo, (so, _) = _oracle(inp, cu_seqlens=cu, checkpoint_every=64)
  assert _max_rel(y, yo) <= 2e-5 and _max_rel(final, fo) <= 2e-5
  assert _max_rel(states, _pad_slots(so, states.shape[1])) <= 2e-5


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_gpu_chunk_scan_nemotron_shapes(dtype):
  t, h, p, g, n = 1000, 8, 64, 2, 128
  cu = np.array([0, 300, 301, 1000], np.int32)
  inp = _inputs(15, t, h, p, g, n, 3, dtype=dtype)
  y, final, (states, counts) = _run(
    inp, "pallas", chunk_size=64, cu_seqlens=cu, checkpoint_every=128
  )
  yo, fo, (so, co) = _oracle(inp, cu_seqlens=cu, checkpoint_every=128)
  np.testing.assert_array_equal(counts, co)
  assert _rel_rms(y, yo) <= 5e-3
  assert _rel_rms(final, fo) <= 5e-3
  assert _rel_rms(states, _pad_slots(so, states.shape[1])) <= 5e-3
  i = dict(inp)
  x, dt, a, b, c = (i.pop(k) for k in ("x", "dt", "A", "B", "C"))
  y2, f2, (s2, c2) = pallas_gpu.ssd_chunk_scan(
    x, dt, a, b, c, cu_seqlens=jnp.asarray(cu), chunk_size=64, checkpoint_every=128,
    algorithm="parallel", **i,
  )  # fmt: skip
  np.testing.assert_array_equal(c2, co)
  assert _rel_rms(y2, yo) <= 5e-3 and _rel_rms(f2, fo) <= 5e-3
  assert _rel_rms(s2, _pad_slots(so, s2.shape[1])) <= 5e-3


@pytest.mark.gpu
def test_gpu_decode_and_verify():
  nb, s, h, p, g, n = 4, 3, 8, 64, 2, 128
  inp = _inputs(16, 0, h, p, g, n, 1, batch_shape=(nb, s))
  pool = jnp.asarray(np.random.default_rng(17).standard_normal((8, h, p, n)), jnp.float32)
  read = jnp.array([7, 0, 2, 5], jnp.int32)
  write = jnp.array([7, 1, 3, 6], jnp.int32)
  args = (inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"])
  kw = dict(D=inp["D"], dt_bias=inp["dt_bias"], state_pool=pool, read_indices=read)
  yp, sp = api.ssd_verify(*args, implementation="pallas", **kw)
  yx, sx = api.ssd_verify(*args, implementation="xla", **kw)
  assert _rel_rms(yp, yx) <= 2e-3 and _rel_rms(sp, sx) <= 2e-3
  one = [a[:, 0] if a.ndim > 1 else a for a in args]  # A [H] is per-head, not per-token
  yd, pool_d = api.ssd_decode(*one, implementation="pallas", write_indices=write, **kw)
  assert _rel_rms(yd, yx[:, 0]) <= 2e-3
  assert _rel_rms(pool_d[write], sx[:, 0]) <= 2e-3
  untouched = np.setdiff1d(np.arange(8), np.asarray(write))
  np.testing.assert_array_equal(np.asarray(pool_d[untouched]), np.asarray(pool[untouched]))


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", ["fused", "parallel"])
def test_gpu_resume_from_checkpoint_is_bit_exact(algorithm):
  t, h, p, g, n, chunk = 512, 8, 64, 2, 128, 64
  inp = _inputs(18, t, h, p, g, n, 1, dtype=jnp.bfloat16)

  def run(inp, **kw):
    i = dict(inp)
    x, dt, a, b, c = (i.pop(k) for k in ("x", "dt", "A", "B", "C"))
    return pallas_gpu.ssd_chunk_scan(
      x, dt, a, b, c, chunk_size=chunk, algorithm=algorithm, **i, **kw
    )

  y, final, (states, _) = run(inp, checkpoint_every=128)
  split = 256  # checkpoint j = 1
  rest = {k: (v[split:] if k in ("x", "dt", "B", "C") else v) for k, v in inp.items()}
  rest["initial_state"] = states[:, 1]
  y2, final2, _ = run(rest)
  np.testing.assert_array_equal(np.asarray(y2), np.asarray(y[split:]))
  np.testing.assert_array_equal(np.asarray(final2), np.asarray(final))
