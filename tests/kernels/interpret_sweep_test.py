"""Pallas kernels in interpret mode vs the fp32 token-scan oracles over a shape grid.

Grid (kernels.md §9.2): heads (GQA/group ratio 1 and 2), head dims 64 and 128, chunk-aligned,
unaligned and packed lengths (the packed batch has an empty sequence), fp32 and bf16. Per case:
outputs, final states and the checkpoints (every 64 tokens) against the oracle; resuming every
sequence from its first checkpoint reproduces the whole run bit-exactly in fp32; decode steps
after a chunked prefill, then a multi-token verify, match the token scan (verify returns the
state after every token). Tolerances: fp32 max abs 1e-5 (GDN), 1e-4 (SSD, normalised by
max(1, max|ref|)); bf16 inputs rel-RMS 5e-3; conv states are copies of inputs (exact).

One case per property runs by default; the rest of the grid is marked slow.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.pallas.conv1d import api as conv_api
from kernels.pallas.conv1d import reference as conv_ref
from kernels.pallas.gdn import api as gdn_api
from kernels.pallas.gdn import reference as gdn_ref
from kernels.pallas.ssd import api as ssd_api
from kernels.pallas.ssd import reference as ssd_ref

IMPL = "interpret"
EVERY = 64
LENGTHS = {"aligned": [0, 128], "unaligned": [0, 150], "packed": [0, 150, 150, 278]}
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}
GDN_F32_ATOL = 1e-5
SSD_F32_TOL = 1e-4
BF16_REL_RMS = 5e-3


def _rel_rms(x, ref):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  return float(np.sqrt(np.mean((x - ref) ** 2)) / max(np.sqrt(np.mean(ref**2)), 1e-30))


def _err(x, ref):
  """max |x - ref| / max(1, max |ref|)."""
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  return float(np.max(np.abs(x - ref), initial=0.0) / max(1.0, np.max(np.abs(ref), initial=0.0)))


def _assert_close(x, ref, dtype, f32_tol, what):
  if dtype == jnp.float32:
    assert _err(x, ref) <= f32_tol, what
  else:
    assert _rel_rms(x, ref) <= BF16_REL_RMS, what


def _grid(axes, default):
  """pytest params over the product of ``axes``; only ``default`` runs without -m slow."""
  for combo in itertools.product(*axes.values()):
    marks = [] if combo == default else [pytest.mark.slow]
    yield pytest.param(*combo, id="-".join(map(str, combo)), marks=marks)


def _oracle_checkpoints(per_token, cu, every):
  """Token-scan states at every ``every`` tokens of each sequence: {(n, j): state}."""
  out = {}
  for n in range(len(cu) - 1):
    for j in range((cu[n + 1] - cu[n]) // every):
      out[n, j] = per_token[cu[n] + (j + 1) * every - 1]
  return out


def _check_checkpoints(states, counts, expected, cu, dtype, tol):
  want = [(cu[n + 1] - cu[n]) // EVERY for n in range(len(cu) - 1)]
  np.testing.assert_array_equal(counts, want)
  for n in range(len(cu) - 1):
    for j in range(states.shape[1]):
      if j < want[n]:
        _assert_close(states[n, j], expected[n, j], dtype, tol, f"checkpoint {n},{j}")
      else:
        assert not np.any(np.asarray(states[n, j])), f"unused slot {n},{j} not zero"


def _resume_split(cu, counts):
  """Per sequence: resume point (first checkpoint, else 0) and the packed rest's cu_seqlens."""
  starts = [EVERY if int(c) >= 1 else 0 for c in counts]
  rest = [0]
  for n, s in enumerate(starts):
    rest.append(rest[-1] + cu[n + 1] - cu[n] - s)
  idx = np.concatenate([np.arange(cu[n] + s, cu[n + 1]) for n, s in enumerate(starts)])
  return starts, np.asarray(rest, np.int32), idx.astype(np.int32)


def _check_resume(resumed, whole, oracle, idx, dtype):
  """(outputs, final) of the resumed run vs the whole run's tokens ``idx`` and final states:
  bit-exact in fp32 (chunk-aligned resume, kernels.md §1.6), else close to the oracle."""
  (out2, f2), (out, final), (ref, ref_final) = resumed, whole, oracle
  if dtype == jnp.float32:
    np.testing.assert_array_equal(np.asarray(out2), np.asarray(out)[idx])
    np.testing.assert_array_equal(np.asarray(f2), np.asarray(final))
  else:
    _assert_close(out2, ref[idx], dtype, None, "resumed outputs")
    _assert_close(f2, ref_final, dtype, None, "resumed final state")


# ----------------------------------------------------------------------------------------- GDN

_GDN_HEADS = {"h1": (1, 1), "gqa2": (2, 4)}


def _gdn_inputs(t, h_k, h_v, d, dtype, seed, lead=()):
  ks = jax.random.split(jax.random.key(seed), 5)
  shp = tuple(lead) + (t,)
  q = jax.random.normal(ks[0], shp + (h_k, d)).astype(dtype)
  k = jax.random.normal(ks[1], shp + (h_k, d)).astype(dtype)
  v = jax.random.normal(ks[2], shp + (h_v, d)).astype(dtype)
  g = -jax.nn.softplus(jax.random.normal(ks[3], shp + (h_v,)) + 1.0)
  beta = jax.nn.sigmoid(2.0 * jax.random.normal(ks[4], shp + (h_v,)))
  return q, k, v, g, beta


def _gdn_oracle(q, k, v, g, beta, **kw):
  f32 = [x.astype(jnp.float32) for x in (q, k, v, g, beta)]
  return gdn_ref.recurrent_gated_delta_rule(*f32, return_states=True, **kw)


@pytest.mark.parametrize(
  "heads,d,lengths,dtype",
  list(_grid(dict(h=_GDN_HEADS, d=[64, 128], L=LENGTHS, dt=DTYPES), ("gqa2", 64, "packed", "f32"))),
)
def test_gdn_prefill_checkpoints_and_resume(heads, d, lengths, dtype):
  (h_k, h_v), cu, dtype = _GDN_HEADS[heads], LENGTHS[lengths], DTYPES[dtype]
  n, t = len(cu) - 1, cu[-1]
  q, k, v, g, beta = _gdn_inputs(t, h_k, h_v, d, dtype, seed=d + len(cu))
  init = 0.3 * jax.random.normal(jax.random.key(1), (n, h_v, d, d), jnp.float32)
  cu_arr = np.asarray(cu, np.int32)
  o, final, (states, counts) = gdn_api.chunk_gated_delta_rule(
    q, k, v, g, beta, initial_state=init, cu_seqlens=cu_arr, checkpoint_every=EVERY,
    implementation=IMPL,
  )  # fmt: skip
  ro, rf, per_tok = _gdn_oracle(q, k, v, g, beta, initial_state=init, cu_seqlens=cu)
  assert o.shape == v.shape and o.dtype == dtype and final.dtype == jnp.float32
  _assert_close(o, ro, dtype, GDN_F32_ATOL, "o")
  _assert_close(final, rf, dtype, GDN_F32_ATOL, "final state")
  expected = _oracle_checkpoints(per_tok, cu, EVERY)
  _check_checkpoints(states, counts, expected, cu, dtype, GDN_F32_ATOL)

  starts, rest_cu, idx = _resume_split(cu, counts)
  s0 = jnp.stack([states[i, 0] if s else init[i] for i, s in enumerate(starts)])
  o2, f2, _ = gdn_api.chunk_gated_delta_rule(
    q[idx], k[idx], v[idx], g[idx], beta[idx], initial_state=s0, cu_seqlens=rest_cu,
    implementation=IMPL,
  )  # fmt: skip
  _check_resume((o2, f2), (o, final), (ro, rf), idx, dtype)


@pytest.mark.parametrize(
  "heads,d,dtype", list(_grid(dict(h=_GDN_HEADS, d=[64, 128], dt=DTYPES), ("gqa2", 64, "f32")))
)
def test_gdn_decode_and_verify_after_prefill(heads, d, dtype):
  """Packed chunked prefill (lengths 100, 64), 2 decode steps (the second in place), then a
  3-token verify from the decoded slots."""
  (h_k, h_v), dtype = _GDN_HEADS[heads], DTYPES[dtype]
  lens, steps, kk = [100, 64], 2, 3
  total = [x + steps + kk for x in lens]
  cu_all = np.concatenate([[0], np.cumsum(total)])
  q, k, v, g, beta = _gdn_inputs(int(cu_all[-1]), h_k, h_v, d, dtype, seed=3 * d)
  init = 0.3 * jax.random.normal(jax.random.key(2), (2, h_v, d, d), jnp.float32)
  ro, _, per_tok = _gdn_oracle(q, k, v, g, beta, initial_state=init, cu_seqlens=cu_all)
  pre = np.concatenate([np.arange(cu_all[i], cu_all[i] + lens[i]) for i in range(2)])
  _, final, _ = gdn_api.chunk_gated_delta_rule(
    q[pre], k[pre], v[pre], g[pre], beta[pre], initial_state=init,
    cu_seqlens=np.asarray([0, lens[0], sum(lens)], np.int32), implementation=IMPL,
  )  # fmt: skip
  pool = jnp.zeros((6, h_v, d, d), jnp.float32).at[jnp.array([4, 1])].set(final)
  read, write = np.array([4, 1], np.int32), np.array([0, 2], np.int32)
  for s in range(steps):
    tok = cu_all[:-1] + np.asarray(lens) + s
    o, pool = gdn_api.fused_recurrent_gated_delta_rule_decode(
      q[tok], k[tok], v[tok], g[tok], beta[tok], state_pool=pool, read_indices=read,
      write_indices=write, implementation=IMPL,
    )  # fmt: skip
    _assert_close(o, ro[tok], dtype, GDN_F32_ATOL, f"decode o step {s}")
    _assert_close(pool[write], per_tok[tok], dtype, GDN_F32_ATOL, f"decode state step {s}")
    read = write  # later steps update the slots in place (read == write)
  np.testing.assert_array_equal(pool[jnp.array([4, 1])], final)  # cached slots untouched
  win = (cu_all[:-1] + np.asarray(lens) + steps)[:, None] + np.arange(kk)[None, :]  # [2, K]
  o, states = gdn_api.gated_delta_rule_verify(
    q[win], k[win], v[win], g[win], beta[win], state_pool=pool, read_indices=read,
    implementation=IMPL,
  )  # fmt: skip
  assert states.shape == (2, kk, h_v, d, d) and states.dtype == jnp.float32
  _assert_close(o, ro[win], dtype, GDN_F32_ATOL, "verify o")
  _assert_close(states, per_tok[win], dtype, GDN_F32_ATOL, "verify per-token states")


# ----------------------------------------------------------------------------------------- SSD

_SSD_HEADS = {"g1": (2, 1), "g2": (4, 2)}  # (H, G)
_SSD_N = 64


def _ssd_inputs(lead, h, p, g, n, dtype, seed):
  rng = np.random.default_rng(seed)
  f = lambda a, dt=dtype: jnp.asarray(a, dt)  # noqa: E731
  return dict(
    x=f(rng.standard_normal(lead + (h, p))),
    dt=f(rng.standard_normal(lead + (h,)) - 1.0),
    A=f(-rng.uniform(0.5, 4.0, (h,)), jnp.float32),
    B=f(rng.standard_normal(lead + (g, n)) / np.sqrt(n)),
    C=f(rng.standard_normal(lead + (g, n))),
    D=f(rng.standard_normal((h,)), jnp.float32),
    dt_bias=f(rng.standard_normal((h,)) * 0.5, jnp.float32),
  )


def _ssd_take(inp, idx):
  return {k: (v[idx] if k in ("x", "dt", "B", "C") else v) for k, v in inp.items()}


def _ssd_run(inp, **kw):
  i = dict(inp)
  args = [i.pop(k) for k in ("x", "dt", "A", "B", "C")]
  return ssd_api.chunk_scan(*args, **i, chunk_size=64, implementation=IMPL, **kw)


def _ssd_oracle(inp, **kw):
  i = {k: v.astype(jnp.float32) for k, v in inp.items()}
  args = [i.pop(k) for k in ("x", "dt", "A", "B", "C")]
  return ssd_ref.ssd_oracle(*args, **i, **kw)


@pytest.mark.parametrize(
  "heads,p,lengths,dtype",
  list(_grid(dict(h=_SSD_HEADS, p=[64, 128], L=LENGTHS, dt=DTYPES), ("g2", 64, "packed", "f32"))),
)
def test_ssd_prefill_checkpoints_and_resume(heads, p, lengths, dtype):
  (h, g), cu, dtype = _SSD_HEADS[heads], LENGTHS[lengths], DTYPES[dtype]
  n_seq, t = len(cu) - 1, cu[-1]
  inp = _ssd_inputs((t,), h, p, g, _SSD_N, dtype, seed=p + len(cu))
  init = jnp.asarray(np.random.default_rng(5).standard_normal((n_seq, h, p, _SSD_N)), jnp.float32)
  cu_arr = np.asarray(cu, np.int32)
  y, final, (states, counts) = _ssd_run(
    inp, initial_state=init, cu_seqlens=cu_arr, checkpoint_every=EVERY
  )
  yo, fo, (so, _) = _ssd_oracle(inp, initial_state=init, cu_seqlens=cu_arr, checkpoint_every=EVERY)
  assert y.shape == inp["x"].shape and y.dtype == dtype and final.dtype == jnp.float32
  _assert_close(y, yo, dtype, SSD_F32_TOL, "y")
  _assert_close(final, fo, dtype, SSD_F32_TOL, "final state")
  expected = {(n, j): so[n, j] for n in range(n_seq) for j in range(so.shape[1])}
  expected = {key: val for key, val in expected.items() if key[1] < int(counts[key[0]])}
  _check_checkpoints(states, counts, expected, cu, dtype, SSD_F32_TOL)

  starts, rest_cu, idx = _resume_split(cu, counts)
  s0 = jnp.stack([states[i, 0] if s else init[i] for i, s in enumerate(starts)])
  y2, f2, _ = _ssd_run(_ssd_take(inp, idx), initial_state=s0, cu_seqlens=rest_cu)
  _check_resume((y2, f2), (y, final), (yo, fo), idx, dtype)


@pytest.mark.parametrize(
  "heads,p,dtype", list(_grid(dict(h=_SSD_HEADS, p=[64, 128], dt=DTYPES), ("g2", 64, "f32")))
)
def test_ssd_decode_and_verify_after_prefill(heads, p, dtype):
  (h, g), dtype = _SSD_HEADS[heads], DTYPES[dtype]
  lens, steps, kk = [100, 64], 2, 3
  cu_all = np.concatenate([[0], np.cumsum([x + steps + kk for x in lens])]).astype(np.int32)
  inp = _ssd_inputs((int(cu_all[-1]),), h, p, g, _SSD_N, dtype, seed=7 * p)
  init = jnp.asarray(np.random.default_rng(6).standard_normal((2, h, p, _SSD_N)), jnp.float32)
  every_tok = dict(checkpoint_every=1, max_checkpoints=int(cu_all[-1]))
  yo, _, (so, _) = _ssd_oracle(inp, initial_state=init, cu_seqlens=cu_all, **every_tok)
  per_tok = lambda tok: jnp.stack([so[i, tok[i] - cu_all[i]] for i in range(2)])  # noqa: E731
  pre = np.concatenate([np.arange(cu_all[i], cu_all[i] + lens[i]) for i in range(2)])
  _, final, _ = _ssd_run(
    _ssd_take(inp, pre), initial_state=init, cu_seqlens=np.asarray([0, lens[0], sum(lens)])
  )
  pool = jnp.zeros((6, h, p, _SSD_N), jnp.float32).at[jnp.array([4, 1])].set(final)
  read, write = np.array([4, 1], np.int32), np.array([0, 2], np.int32)
  shared = dict(D=inp["D"], dt_bias=inp["dt_bias"], implementation=IMPL)
  for s in range(steps):
    tok = cu_all[:-1] + np.asarray(lens) + s
    i = _ssd_take(inp, tok)
    y, pool = ssd_api.ssd_decode(
      i["x"], i["dt"], i["A"], i["B"], i["C"], state_pool=pool, read_indices=read,
      write_indices=write, **shared,
    )  # fmt: skip
    _assert_close(y, yo[tok], dtype, SSD_F32_TOL, f"decode y step {s}")
    _assert_close(pool[write], per_tok(tok), dtype, SSD_F32_TOL, f"decode state step {s}")
    read = write  # later steps update the slots in place (read == write)
  np.testing.assert_array_equal(pool[jnp.array([4, 1])], final)  # cached slots untouched
  win = (cu_all[:-1] + np.asarray(lens) + steps)[:, None] + np.arange(kk)[None, :]
  i = _ssd_take(inp, win)
  y, states = ssd_api.ssd_verify(
    i["x"], i["dt"], i["A"], i["B"], i["C"], state_pool=pool, read_indices=read, **shared
  )
  assert states.shape == (2, kk, h, p, _SSD_N) and states.dtype == jnp.float32
  _assert_close(y, yo[win], dtype, SSD_F32_TOL, "verify y")
  want = jnp.stack([per_tok(win[:, j]) for j in range(kk)], axis=1)
  _assert_close(states, want, dtype, SSD_F32_TOL, "verify per-token states")


# -------------------------------------------------------------------------------------- conv1d


def _conv_inputs(t, d, n_seq, dtype, seed, k=4):
  rng = np.random.default_rng(seed)
  return (
    jnp.asarray(rng.standard_normal((t, d)), dtype),
    jnp.asarray(rng.standard_normal((d, k)) / k, dtype),
    jnp.asarray(rng.standard_normal((d,)), dtype),
    jnp.asarray(rng.standard_normal((n_seq, d, k - 1)), dtype),
  )


@functools.partial(jax.jit, static_argnums=5)
def _conv_prefill(x, w, b, conv_state, cu, every):
  """Under jit (traced cu_seqlens: M = T // every slots) to keep interpret mode fast on CPU."""
  return conv_api.causal_conv1d(
    x, w, b, conv_state=conv_state, cu_seqlens=cu, checkpoint_every=every, implementation=IMPL
  )


_conv_update = jax.jit(functools.partial(conv_api.causal_conv1d_update, implementation=IMPL))


def _conv_close(y, ref, dtype):
  tol = 1e-5 if dtype == jnp.float32 else 1e-2  # bf16: the output is rounded once
  np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(ref, np.float32), tol, tol)


def _exact(a, b):
  np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


@pytest.mark.parametrize(
  "d,lengths,dtype", list(_grid(dict(d=[64, 200], L=LENGTHS, dt=DTYPES), (200, "packed", "bf16")))
)
def test_conv_prefill_checkpoints_resume_and_decode(d, lengths, dtype):
  cu, dtype = LENGTHS[lengths], DTYPES[dtype]
  n_seq, t = len(cu) - 1, cu[-1]
  x, w, b, st = _conv_inputs(t, d, n_seq, dtype, seed=d + len(cu))
  cu_arr = np.asarray(cu, np.int32)
  y, final, (ck, counts) = _conv_prefill(x, w, b, st, cu_arr, EVERY)
  f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
  yo, fo, (cko, co) = conv_ref.conv_oracle(
    f32(x), f32(w), f32(b), conv_state=f32(st), cu_seqlens=cu_arr, checkpoint_every=EVERY
  )
  assert y.dtype == final.dtype == ck.dtype == dtype
  _conv_close(y, yo, dtype)
  _exact(final, fo)  # conv states are copies of inputs: exact in any dtype
  np.testing.assert_array_equal(counts, co)
  _exact(ck[:, : cko.shape[1]], cko)
  assert not np.any(np.asarray(ck[:, cko.shape[1] :], np.float32))

  starts, rest_cu, idx = _resume_split(cu, counts)
  s0 = jnp.stack([ck[i, 0] if s else st[i] for i, s in enumerate(starts)])
  y2, f2, _ = _conv_prefill(x[idx], w, b, s0, rest_cu, None)
  _exact(y2, np.asarray(y, np.float32)[idx])
  _exact(f2, final)

  # Two decode steps per sequence (the second in place) continue from the final states.
  x_dec = jnp.asarray(np.random.default_rng(9).standard_normal((2, n_seq, d)), dtype)
  pool = jnp.zeros((2 * n_seq + 1, d, 3), dtype).at[1 : n_seq + 1].set(final)
  read = np.arange(1, n_seq + 1, dtype=np.int32)
  write = read + n_seq
  ext = jnp.concatenate([f32(final), jnp.moveaxis(f32(x_dec), 0, 2)], axis=2)  # [N, D, 3 + 2]
  for s in range(2):
    yd, pool = _conv_update(x_dec[s], w, b, state_pool=pool, read_indices=read, write_indices=write)
    window = ext[:, :, s : s + 4]
    want = jax.nn.silu(jnp.sum(window * f32(w), axis=2) + f32(b))
    _conv_close(yd, want, dtype)
    _exact(pool[write], ext[:, :, s + 1 : s + 4])
    read = write  # the second step updates the slots in place (read == write)
  _exact(pool[1 : n_seq + 1], final)  # the prefill's slots are untouched
