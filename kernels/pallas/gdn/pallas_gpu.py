"""Pallas (Triton backend) Gated DeltaNet kernels for GPU; also run with ``interpret=True``.

Prefill (chunk C = 64) is three kernels (fla's decomposition):

* ``intra`` (grid = chunk slots x H_v, fully parallel): loads the chunk's raw q, k, v, g, beta
  straight from the packed token arrays (masked rows), L2-normalises q and k in fp32, and
  computes the WY/UT quantities (``reference.chunk_intra``): W, K~ = exp(G_C - G) K,
  Q~ = exp(G) Q - P W, U and Uo = P U with P = (Q K^T) o Gamma, plus the cumulative log decay
  G. T = (I + A)^-1 uses the matmul-only product form (I - A)(I + A^2)...(I + A^32);
  ``inverse="blocked"`` instead inverts 2 x 2 blocks of C/2 (product form on the diagonal
  blocks, T10 = -T11 A10 T00).
* ``state`` (grid = N x H_v x d_v/BV, sequential over the sequence's chunks): keeps the fp32
  state tile S[d_k, BV] in registers; per chunk stores S (rounded to the input dtype) as the
  chunk's entry state, then ``V_new = U - W S``, ``S <- exp(G_C) S + K~^T V_new`` (two dots per
  step); writes fp32 checkpoints at interval boundaries and the final state.
* ``output`` (grid = chunk slots x H_v x d_v/BVo, fully parallel): ``O = Q~ S_entry + Uo``.

``output_pass="fused"`` (the previous layout, kept for comparison) replaces the last two by one
sequential ``inter`` kernel that also computes O inside the loop (three dots per step).

Decode and verify are one fused recurrent kernel each (grid = N x H_v x d_v/BV) reading states
from a pool by slot index; decode writes the pool in place (``input_output_aliases``).

Precision: gates, norms, G and the state are fp32. The input dtype is the numerics contract
(`hybrid_cache.engine.config.NUMERICS`): fp32 inputs ("exact") make every dot IEEE fp32
(``Precision.HIGHEST``, no TF32), so the kernel agrees with the XLA reference within fp32
rounding on GPU as on CPU; bf16 inputs ("serving") take bf16 operands with fp32 accumulation
for the big matmuls and a TF32 inverse (like fla). In interpret mode every dot is IEEE fp32.

Triton-backend rules followed (kernels.md §6.3): power-of-2 block shapes, no scratch memory,
no value slicing (scalars extracted by masked reductions), state carried in ``fori_loop``.
Interpret mode clamps dynamic slices, so the wrappers pad the token axis by one chunk there.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.pallas.gdn import reference

CHUNK = 64
_INVERSES = ("blocked", "product")
_STAGES = (None, "layout", "intra", "inter")
_OUTPUT_PASSES = ("parallel", "fused")
_EPS = 1e-6
f32 = jnp.float32


def _dot(a, b, *, ta=False, tb=False, precision=None):
  dims = (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))
  return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=f32)


def _l2norm(x):
  return x * lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + _EPS)


def _params(interpret, num_warps, num_stages):
  if interpret:
    return None
  return plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def _precisions(interpret, dtype):
  """(inverse precision, big-matmul precision): IEEE fp32 in interpret mode and for fp32
  inputs (the exact contract); TF32 / bf16 operands (default) for bf16 inputs on GPU."""
  if interpret or jnp.dtype(dtype) == jnp.float32:
    return lax.Precision.HIGHEST, lax.Precision.HIGHEST
  return lax.Precision.DEFAULT, lax.Precision.DEFAULT


def _product_inverse(a, eye, steps, prec):
  """(I + A)^-1 for strictly lower A (nilpotent, A^(2^(steps+1)) = 0) as the matmul-only product
  (I - A)(I + A^2)(I + A^4)...(I + A^(2^steps))."""
  t_inv = eye - a
  p = a
  for _ in range(steps):
    p = _dot(p, p, precision=prec)
    t_inv = _dot(t_inv, eye + p, precision=prec)
  return t_inv


def _tril_inverse_product(kc, beta, big_g, gamma, *, chunk, cdt, inv_prec, mm_prec):
  """T = (I + A)^-1 in ``cdt`` with A = diag(beta) (K K^T o Gamma) strictly lower, C x C tiles."""
  ri = lax.broadcasted_iota(jnp.int32, (chunk, chunk), 0)
  ci = lax.broadcasted_iota(jnp.int32, (chunk, chunk), 1)
  kk = _dot(kc, kc, tb=True, precision=mm_prec)
  a = jnp.where(ri > ci, beta[:, None] * kk * gamma, 0.0)
  eye = jnp.where(ri == ci, 1.0, 0.0).astype(f32)
  return _product_inverse(a, eye, chunk.bit_length() - 2, inv_prec).astype(cdt)


def _tril_inverse_blocked(kc, beta, big_g, *, chunk, cdt, inv_prec, mm_prec):
  """Same T as ``_tril_inverse_product`` via 2 x 2 blocks of C/2 (about 4x fewer inverse flops).

  T00 = (I + A00)^-1, T11 = (I + A11)^-1 (product form on C/2 tiles), T10 = -T11 A10 T00. The
  half tiles are taken out of / put back into the C-row tiles with 0/1 selection matmuls in
  ``cdt`` (exact: one nonzero term per output, fp32 accumulation; the blocks are rounded to
  ``cdt`` first, as the product path rounds T), since Triton tiles cannot be sliced.
  """
  half = chunk // 2
  r = lax.broadcasted_iota(jnp.int32, (chunk, half), 0)
  c = lax.broadcasted_iota(jnp.int32, (chunk, half), 1)
  sel0 = r == c  # [C, C/2]: row r is half-0 row c
  sel1 = r == c + half
  e0 = jnp.where(sel0, 1.0, 0.0).astype(cdt)
  e1 = jnp.where(sel1, 1.0, 0.0).astype(cdt)

  def take(sel, x):  # x[C] -> x[half rows] (exact masked reduction)
    return jnp.sum(jnp.where(sel, x[:, None], 0.0), axis=0)

  k0 = _dot(e0, kc, ta=True, precision=mm_prec).astype(cdt)  # [C/2, d_k]
  k1 = _dot(e1, kc, ta=True, precision=mm_prec).astype(cdt)
  g0, g1 = take(sel0, big_g), take(sel1, big_g)
  b0, b1 = take(sel0, beta), take(sel1, beta)
  hr = lax.broadcasted_iota(jnp.int32, (half, half), 0)
  hc = lax.broadcasted_iota(jnp.int32, (half, half), 1)
  eye = jnp.where(hr == hc, 1.0, 0.0).astype(f32)

  def diag_block(kb, gb, bb):
    gam = jnp.exp(jnp.where(hr > hc, gb[:, None] - gb[None, :], -jnp.inf))
    a = bb[:, None] * _dot(kb, kb, tb=True, precision=mm_prec) * gam
    return _product_inverse(a, eye, half.bit_length() - 2, inv_prec)

  t00 = diag_block(k0, g0, b0)
  t11 = diag_block(k1, g1, b1)
  a10 = b1[:, None] * _dot(k1, k0, tb=True, precision=mm_prec) * jnp.exp(g1[:, None] - g0[None, :])
  t10 = -_dot(t11, _dot(a10, t00, precision=inv_prec), precision=inv_prec)
  row0 = _dot(t00.astype(cdt), e0, tb=True, precision=mm_prec)  # [C/2, C]
  row1 = _dot(t10.astype(cdt), e0, tb=True, precision=mm_prec) + _dot(
    t11.astype(cdt), e1, tb=True, precision=mm_prec
  )
  t = _dot(e0, row0.astype(cdt), precision=mm_prec) + _dot(e1, row1.astype(cdt), precision=mm_prec)
  return t.astype(cdt)


def _intra_kernel(
  start_ref, len_ref, q_ref, k_ref, v_ref, g_ref, b_ref,
  w_ref, u_ref, kt_ref, qt_ref, uo_ref, gcum_ref,
  *, chunk, group, scale, cdt, inv_prec, mm_prec, inverse,
):  # fmt: skip
  c = pl.program_id(0)
  h = pl.program_id(1)
  hk = lax.div(h, jnp.int32(group))
  start = start_ref[c]
  length = len_ref[c]
  d_k = q_ref.shape[-1]
  d_v = v_ref.shape[-1]
  rows = lax.broadcasted_iota(jnp.int32, (chunk,), 0)
  valid = rows < length
  ts = pl.ds(start, chunk)
  mk = jnp.broadcast_to(valid[:, None], (chunk, d_k))
  mv = jnp.broadcast_to(valid[:, None], (chunk, d_v))
  # Ordered so that every output is stored as soon as it is known (fewer live tiles).
  k = plgpu.load(k_ref.at[ts, hk, :], mask=mk, other=0).astype(f32)
  g = plgpu.load(g_ref.at[ts, h], mask=valid, other=0).astype(f32)
  beta = plgpu.load(b_ref.at[ts, h], mask=valid, other=0).astype(f32)
  kn = _l2norm(k)
  big_g = jnp.cumsum(g)
  gcum_ref[...] = big_g
  g_last = jnp.sum(jnp.where(rows == chunk - 1, big_g, 0.0))
  kt_ref[...] = (jnp.exp(g_last - big_g)[:, None] * kn).astype(kt_ref.dtype)
  ri = lax.broadcasted_iota(jnp.int32, (chunk, chunk), 0)
  ci = lax.broadcasted_iota(jnp.int32, (chunk, chunk), 1)
  gamma = jnp.exp(jnp.where(ri >= ci, big_g[:, None] - big_g[None, :], -jnp.inf))
  kc = kn.astype(cdt)
  if inverse == "blocked":
    tc = _tril_inverse_blocked(
      kc, beta, big_g, chunk=chunk, cdt=cdt, inv_prec=inv_prec, mm_prec=mm_prec
    )
  else:
    tc = _tril_inverse_product(
      kc, beta, big_g, gamma, chunk=chunk, cdt=cdt, inv_prec=inv_prec, mm_prec=mm_prec
    )
  w = _dot(tc, ((beta * jnp.exp(big_g))[:, None] * kn).astype(cdt), precision=mm_prec)
  w_ref[...] = w.astype(w_ref.dtype)
  v = plgpu.load(v_ref.at[ts, h, :], mask=mv, other=0).astype(f32)
  u = _dot(tc, (beta[:, None] * v).astype(cdt), precision=mm_prec)
  u_ref[...] = u.astype(u_ref.dtype)
  q = plgpu.load(q_ref.at[ts, hk, :], mask=mk, other=0).astype(f32)
  qn = _l2norm(q) * scale
  pc = (_dot(qn.astype(cdt), kc, tb=True, precision=mm_prec) * gamma).astype(cdt)
  qt = jnp.exp(big_g)[:, None] * qn - _dot(pc, w.astype(cdt), precision=mm_prec)
  qt_ref[...] = qt.astype(qt_ref.dtype)
  uo_ref[...] = _dot(pc, u.astype(cdt), precision=mm_prec).astype(uo_ref.dtype)


def _fused_kernel(
  first_ref, count_ref, start_ref, len_ref, init_ref, w_ref, u_ref, kt_ref, qt_ref, uo_ref,
  gcum_ref,
  *rest, chunk, bv, ckpt_every, max_ckpt, cdt, mm_prec,
):  # fmt: skip
  if max_ckpt:
    _, o_ref, final_ref, ckpt_ref = rest
  else:
    o_ref, final_ref = rest
  n = pl.program_id(0)
  h = pl.program_id(1)
  vs = pl.ds(pl.program_id(2) * bv, bv)
  first = first_ref[n]
  count = count_ref[n]
  rows = lax.broadcasted_iota(jnp.int32, (chunk,), 0)

  def body(j, s):
    c = first + j
    sb = s.astype(cdt)
    w = w_ref[c, h, :, :]
    v_new = u_ref[c, h, :, vs].astype(f32) - _dot(w, sb, precision=mm_prec)
    o = _dot(qt_ref[c, h, :, :], sb, precision=mm_prec) + uo_ref[c, h, :, vs].astype(f32)
    rows_ok = jnp.broadcast_to((rows < len_ref[c])[:, None], o.shape)
    plgpu.store(o_ref.at[pl.ds(start_ref[c], chunk), h, vs], o.astype(o_ref.dtype), mask=rows_ok)
    g_last = jnp.sum(jnp.where(rows == chunk - 1, gcum_ref[c, h, :], 0.0))
    kt = kt_ref[c, h, :, :]
    s = jnp.exp(g_last) * s + _dot(kt, v_new.astype(cdt), ta=True, precision=mm_prec)
    if max_ckpt:
      end = (j + 1) * chunk
      slot = lax.div(end, jnp.int32(ckpt_every)) - 1
      is_ck = (lax.rem(end, jnp.int32(ckpt_every)) == 0) & (len_ref[c] == chunk) & (slot < max_ckpt)

      @pl.when(is_ck)
      def _():
        ckpt_ref[n, slot, h, :, vs] = s

    return s

  s = lax.fori_loop(0, count, body, init_ref[n, h, :, vs].astype(f32))
  final_ref[n, h, :, vs] = s


def _state_kernel(
  first_ref, count_ref, len_ref, init_ref, w_ref, u_ref, kt_ref, gcum_ref,
  *rest, chunk, bv, ckpt_every, max_ckpt, cdt, mm_prec,
):  # fmt: skip
  """Sequential pass of the split path: only ``S <- exp(G_C) S + K~^T (U - W S)``.

  Stores the state entering every chunk (rounded to ``cdt``, exactly the operand the fused path
  feeds to ``Q~ S``) for the parallel output kernel; checkpoints and final state stay fp32.
  """
  if max_ckpt:
    _, h_ref, final_ref, ckpt_ref = rest
  else:
    h_ref, final_ref = rest
  n = pl.program_id(0)
  h = pl.program_id(1)
  vs = pl.ds(pl.program_id(2) * bv, bv)
  first = first_ref[n]
  count = count_ref[n]
  rows = lax.broadcasted_iota(jnp.int32, (chunk,), 0)

  def body(j, s):
    c = first + j
    sb = s.astype(cdt)
    h_ref[c, h, :, vs] = sb
    v_new = u_ref[c, h, :, vs].astype(f32) - _dot(w_ref[c, h, :, :], sb, precision=mm_prec)
    g_last = jnp.sum(jnp.where(rows == chunk - 1, gcum_ref[c, h, :], 0.0))
    s = jnp.exp(g_last) * s + _dot(
      kt_ref[c, h, :, :], v_new.astype(cdt), ta=True, precision=mm_prec
    )
    if max_ckpt:
      end = (j + 1) * chunk
      slot = lax.div(end, jnp.int32(ckpt_every)) - 1
      is_ck = (lax.rem(end, jnp.int32(ckpt_every)) == 0) & (len_ref[c] == chunk) & (slot < max_ckpt)

      @pl.when(is_ck)
      def _():
        ckpt_ref[n, slot, h, :, vs] = s

    return s

  s = lax.fori_loop(0, count, body, init_ref[n, h, :, vs].astype(f32))
  final_ref[n, h, :, vs] = s


def _output_kernel(start_ref, len_ref, qt_ref, uo_ref, h_ref, o_ref, *, chunk, bv, mm_prec):
  """Parallel output pass of the split path: ``O = Q~ S_entry + Uo`` for one (chunk, head, tile)."""
  c = pl.program_id(0)
  h = pl.program_id(1)
  vs = pl.ds(pl.program_id(2) * bv, bv)
  length = len_ref[c]

  @pl.when(length > 0)
  def _():
    o = _dot(qt_ref[...], h_ref[...], precision=mm_prec) + uo_ref[...].astype(f32)
    rows = lax.broadcasted_iota(jnp.int32, (chunk,), 0)
    ok = jnp.broadcast_to((rows < length)[:, None], o.shape)
    plgpu.store(o_ref.at[pl.ds(start_ref[c], chunk), h, vs], o.astype(o_ref.dtype), mask=ok)


def _pad_tokens(x, rows):
  return jnp.pad(x, [(0, rows)] + [(0, 0)] * (x.ndim - 1))


@functools.partial(
  jax.jit,
  static_argnames=(
    "checkpoint_every", "max_checkpoints", "scale", "interpret", "block_v", "num_warps",
    "num_stages", "intra_warps", "inverse", "stop_after", "output_pass", "out_block_v",
    "out_warps", "out_stages",
  ),
)  # fmt: skip
def chunk_gated_delta_rule_pallas(
  q, k, v, g, beta, *, initial_state, cu_seqlens, checkpoint_every, max_checkpoints, scale,
  interpret=False, block_v=16, num_warps=4, num_stages=3, intra_warps=4, inverse="product",
  stop_after=None, output_pass="parallel", out_block_v=64, out_warps=4, out_stages=2,
):  # fmt: skip
  """Pallas chunked prefill; same contract as ``reference.chunk_gated_delta_rule_xla``.

  Tuning (static): ``block_v`` (d_v tile of the sequential kernel), ``num_warps`` /
  ``num_stages`` (sequential kernel), ``intra_warps`` (parallel kernel), ``inverse``
  ("product": one C x C product form, the default; "blocked": 2 x 2 blocks of C/2, 4x fewer
  inverse flops but more, smaller matmuls; measured no faster on H100, see BENCHMARKS.md;
  same result up to rounding). ``output_pass``: "parallel" (default; the sequential kernel only
  propagates the state and stores the ``cdt`` state entering each chunk, a separate kernel on
  grid chunk slots x H_v x d_v/``out_block_v`` with ``out_warps`` / ``out_stages`` computes
  O = Q~ S + Uo) or "fused" (the sequential kernel also computes O). Both feed the same
  operands to the same dots, so o, final state and checkpoints agree up to matmul accumulation
  order (bit-identical in interpret mode). ``stop_after`` ("layout" | "intra" | "inter",
  profiling only) returns that stage's intermediates instead of the results.
  """
  if inverse not in _INVERSES:
    raise ValueError(f"inverse={inverse!r}; allowed: {_INVERSES}")
  if output_pass not in _OUTPUT_PASSES:
    raise ValueError(f"output_pass={output_pass!r}; allowed: {_OUTPUT_PASSES}")
  if stop_after not in _STAGES:
    raise ValueError(f"stop_after={stop_after!r}; allowed: {_STAGES}")
  t, h_v, d_v = v.shape
  h_k, d_k = q.shape[1:]
  n = initial_state.shape[0]
  cdt = v.dtype
  lay = reference.chunk_layout(cu_seqlens, t, CHUNK, with_tokens=False)
  nc = lay.seq.shape[0]
  if stop_after == "layout":
    return dataclasses.astuple(lay)
  inv_prec, mm_prec = _precisions(interpret, cdt)
  if interpret:  # dynamic slices clamp in interpret mode: give every chunk a full window.
    q, k, v, g, beta = (_pad_tokens(x, CHUNK) for x in (q, k, v, g, beta))
  full = pl.BlockSpec()
  chunk_blk = lambda d: pl.BlockSpec((None, None, CHUNK, d), lambda c, h: (c, h, 0, 0))  # noqa: E731
  mk_shape = lambda d, dt: jax.ShapeDtypeStruct((nc, h_v, CHUNK, d), dt)  # noqa: E731
  intra = pl.pallas_call(
    functools.partial(
      _intra_kernel, chunk=CHUNK, group=h_v // h_k, scale=scale, cdt=cdt,
      inv_prec=inv_prec, mm_prec=mm_prec,
      inverse=inverse,
    ),
    grid=(nc, h_v),
    in_specs=[full] * 7,
    out_specs=[
      chunk_blk(d_k), chunk_blk(d_v), chunk_blk(d_k), chunk_blk(d_k), chunk_blk(d_v),
      pl.BlockSpec((None, None, CHUNK), lambda c, h: (c, h, 0)),
    ],
    out_shape=[
      mk_shape(d_k, cdt), mk_shape(d_v, cdt), mk_shape(d_k, cdt), mk_shape(d_k, cdt),
      mk_shape(d_v, cdt), jax.ShapeDtypeStruct((nc, h_v, CHUNK), f32),
    ],
    interpret=interpret,
    compiler_params=_params(interpret, intra_warps, 1),
    name="gdn_chunk_intra",
  )  # fmt: skip
  w, u, kt, qt, uo, gcum = intra(lay.start, lay.length, q, k, v, g, beta)
  if stop_after == "intra":
    return w, u, kt, qt, uo, gcum

  bv = min(block_v, d_v)
  m = max_checkpoints if checkpoint_every is not None else 0
  rows_o = q.shape[0]  # token layout (+C rows if interpret)
  final_shape = jax.ShapeDtypeStruct((n, h_v, d_k, d_v), f32)
  if output_pass == "fused":
    kernel, name = _fused_kernel, "gdn_chunk_inter"
    inputs = [lay.first, lay.count, lay.start, lay.length]
    inputs += [initial_state.astype(f32), w, u, kt, qt, uo, gcum]
    out_shape = [jax.ShapeDtypeStruct((rows_o, h_v, d_v), cdt), final_shape]
  else:
    kernel, name = _state_kernel, "gdn_chunk_state"
    inputs = [lay.first, lay.count, lay.length, initial_state.astype(f32), w, u, kt, gcum]
    out_shape = [jax.ShapeDtypeStruct((nc, h_v, d_k, d_v), cdt), final_shape]
  aliases = {}
  if m:
    inputs.append(jnp.zeros((n, m, h_v, d_k, d_v), f32))
    out_shape.append(jax.ShapeDtypeStruct((n, m, h_v, d_k, d_v), f32))
    aliases = {len(inputs) - 1: 2}
  inter = pl.pallas_call(
    functools.partial(
      kernel, chunk=CHUNK, bv=bv, ckpt_every=checkpoint_every or CHUNK, max_ckpt=m,
      cdt=cdt, mm_prec=mm_prec,
    ),
    grid=(n, h_v, d_v // bv),
    in_specs=[full] * len(inputs),
    out_specs=[full] * len(out_shape),
    out_shape=out_shape,
    input_output_aliases=aliases,
    interpret=interpret,
    compiler_params=_params(interpret, num_warps, num_stages),
    name=name,
  )  # fmt: skip
  outs = inter(*inputs)
  if stop_after == "inter":
    return outs
  if output_pass == "parallel":
    obv = min(out_block_v, d_v)
    qt_spec = pl.BlockSpec((None, None, CHUNK, d_k), lambda c, h, j: (c, h, 0, 0))
    tile = lambda d: pl.BlockSpec((None, None, d, obv), lambda c, h, j: (c, h, 0, j))  # noqa: E731
    output = pl.pallas_call(
      functools.partial(_output_kernel, chunk=CHUNK, bv=obv, mm_prec=mm_prec),
      grid=(nc, h_v, d_v // obv),
      in_specs=[full, full, qt_spec, tile(CHUNK), tile(d_k)],
      out_specs=full,
      out_shape=jax.ShapeDtypeStruct((rows_o, h_v, d_v), cdt),
      interpret=interpret,
      compiler_params=_params(interpret, out_warps, out_stages),
      name="gdn_chunk_output",
    )  # fmt: skip
    outs = [output(lay.start, lay.length, qt, uo, outs[0])] + list(outs[1:])
  o, final = outs[0][:t], outs[1]
  states = outs[2] if m else jnp.zeros((n, m, h_v, d_k, d_v), f32)
  if checkpoint_every is None:
    counts = jnp.zeros((n,), jnp.int32)
  else:
    counts = jnp.minimum(lay.lengths // checkpoint_every, m).astype(jnp.int32)
  return o, final, (states, counts)


def _recurrent_tile(s, q, k, v, g, beta):
  """One token on a state tile s[d_k, BV] (fp32); q, k [d_k] normalised; v [BV]."""
  s = jnp.exp(g) * s
  pred = jnp.sum(s * k[:, None], axis=0)
  delta = beta * (v - pred)
  s = s + k[:, None] * delta[None, :]
  o = jnp.sum(s * q[:, None], axis=0)
  return s, o


def _decode_kernel(
  read_ref, write_ref, q_ref, k_ref, v_ref, g_ref, b_ref, pool_ref, o_ref, pool_out_ref,
  *, group, scale, bv,
):  # fmt: skip
  n = pl.program_id(0)
  h = pl.program_id(1)
  vs = pl.ds(pl.program_id(2) * bv, bv)
  hk = lax.div(h, jnp.int32(group))
  q = _l2norm(q_ref[n, hk, :].astype(f32)) * scale
  k = _l2norm(k_ref[n, hk, :].astype(f32))
  s = pool_ref[read_ref[n], h, :, vs]
  s, o = _recurrent_tile(
    s, q, k, v_ref[n, h, vs].astype(f32), g_ref[n, h].astype(f32), b_ref[n, h].astype(f32)
  )
  o_ref[n, h, vs] = o.astype(o_ref.dtype)
  pool_out_ref[write_ref[n], h, :, vs] = s


@functools.partial(jax.jit, static_argnames=("scale", "interpret", "block_v", "num_warps"))
def decode_pallas(
  q, k, v, g, beta, *, state_pool, read_indices, write_indices, scale, interpret=False,
  block_v=32, num_warps=4,
):  # fmt: skip
  """Fused recurrent decode; the pool is aliased to the output.

  The update is in place when the caller's enclosing ``jit`` donates ``state_pool``; otherwise
  XLA copies the pool once before the kernel (this wrapper does not donate, so eager callers
  keep a valid input array).
  """
  n, h_v, d_v = v.shape
  h_k = q.shape[1]
  bv = min(block_v, d_v)
  full = pl.BlockSpec()
  call = pl.pallas_call(
    functools.partial(_decode_kernel, group=h_v // h_k, scale=scale, bv=bv),
    grid=(n, h_v, d_v // bv),
    in_specs=[full] * 8,
    out_specs=[full, full],
    out_shape=[
      jax.ShapeDtypeStruct(v.shape, v.dtype),
      jax.ShapeDtypeStruct(state_pool.shape, state_pool.dtype),
    ],
    input_output_aliases={7: 1},
    interpret=interpret,
    compiler_params=_params(interpret, num_warps, 1),
    name="gdn_decode",
  )
  return call(read_indices, write_indices, q, k, v, g, beta, state_pool)


def _verify_kernel(
  read_ref, q_ref, k_ref, v_ref, g_ref, b_ref, pool_ref, o_ref, st_ref, *, group, scale, bv,
):  # fmt: skip
  n = pl.program_id(0)
  h = pl.program_id(1)
  vs = pl.ds(pl.program_id(2) * bv, bv)
  hk = lax.div(h, jnp.int32(group))

  def body(i, s):
    q = _l2norm(q_ref[n, i, hk, :].astype(f32)) * scale
    k = _l2norm(k_ref[n, i, hk, :].astype(f32))
    s, o = _recurrent_tile(
      s,
      q,
      k,
      v_ref[n, i, h, vs].astype(f32),
      g_ref[n, i, h].astype(f32),
      b_ref[n, i, h].astype(f32),
    )
    o_ref[n, i, h, vs] = o.astype(o_ref.dtype)
    st_ref[n, i, h, :, vs] = s
    return s

  lax.fori_loop(0, q_ref.shape[1], body, pool_ref[read_ref[n], h, :, vs])


@functools.partial(jax.jit, static_argnames=("scale", "interpret", "block_v", "num_warps"))
def verify_pallas(
  q, k, v, g, beta, *, state_pool, read_indices, scale, interpret=False, block_v=32,
  num_warps=4,
):  # fmt: skip
  """Multi-token verify writing the state after every token ([N, K, H_v, d_k, d_v] fp32)."""
  n, kk, h_v, d_v = v.shape
  h_k, d_k = q.shape[2:]
  bv = min(block_v, d_v)
  full = pl.BlockSpec()
  call = pl.pallas_call(
    functools.partial(_verify_kernel, group=h_v // h_k, scale=scale, bv=bv),
    grid=(n, h_v, d_v // bv),
    in_specs=[full] * 7,
    out_specs=[full, full],
    out_shape=[
      jax.ShapeDtypeStruct(v.shape, v.dtype),
      jax.ShapeDtypeStruct((n, kk, h_v, d_k, d_v), f32),
    ],
    interpret=interpret,
    compiler_params=_params(interpret, num_warps, 1),
    name="gdn_verify",
  )
  return call(read_indices, q, k, v, g, beta, state_pool)
