"""Pallas (Triton backend) Mamba2 SSD kernels: chunked prefill, decode, verify.

Prefill, algorithm "fused" (default): one program per (sequence, head, P-tile) loops over the
sequence's chunks and keeps the fp32 state tile [BP, N] in registers (a ``fori_loop`` carry:
the Triton backend has no scratch memory). Per chunk of C tokens with in-chunk cumsum
a = cumsum(dt*A) (<= 0):

  y     = ((C Bᵀ) ⊙ exp(a_i - a_j)[i>=j] ⊙ dt_j) x + exp(a) ⊙ (C Sᵀ) + D x
  S_new = exp(a_C) S + (x ⊙ exp(a_C - a) dt)ᵀ B

Only non-positive quantities are exponentiated; the upper triangle is masked before ``exp``.
Chunks never straddle sequences. Kernels read and write the packed token layout in place with
masked row gathers; rows past a sequence end load as zeros (dt = 0 leaves the state unchanged)
and are not stored. Checkpoints are written only at checkpoint chunks; unused slots are zeroed
in-kernel. Every load/dot shape is a power of two (C, BP, N >= 16).

Algorithm "parallel" splits the same math into three kernels (chunk-local states over
(chunk slots, H, P-tiles); a sequential state pass over (N_seq, H, P-tiles, N-tiles); chunk
outputs) for more parallelism with few long sequences, at the cost of writing and reading fp32
per-chunk states. The two algorithms agree to rounding, not bit for bit: resume bit-exactness
holds within one algorithm.

Decode/verify: one program per (sequence, head, P-tile), state read from / written to a slot
pool (decode aliases the pool in place). All kernels also run under ``interpret=True`` (CPU).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from kernels.pallas import packing
from kernels.pallas import validation
from kernels.pallas.ssd import reference


def _block_p(p: int, block_p: int | None) -> int:
  bp = block_p or min(p, 64)
  if not validation.is_pow2(bp) or p % bp:
    raise ValueError(f"block_p={bp} must be a power of two dividing the head dim P={p}")
  return bp


def _check_pow2(**dims):
  for name, v in dims.items():
    validation.check_pow2(name, v, 16)


def _compiler_params(num_warps=4, num_stages=1):
  return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def _dot(a, b, contract_a: int, contract_b: int):
  """fp32-accumulated dot; IEEE fp32 (no TF32) when both operands are fp32: the exact numerics
  contract (fp32 model) holds on GPU too; bf16 operands (serving) keep the fast path."""
  exact = a.dtype == jnp.float32 and b.dtype == jnp.float32
  return lax.dot_general(
    a,
    b,
    (((contract_a,), (contract_b,)), ((), ())),
    precision=lax.Precision.HIGHEST if exact else None,
    preferred_element_type=jnp.float32,
  )


def _prefill_kernel(
  cu_ref,  # [N+1] sequence boundaries
  nchunk_ref,  # [N] chunks per sequence
  ckcount_ref,  # [N] checkpoints to write per sequence (<= M)
  a_ref,  # [H] fp32
  d_ref,  # [H] fp32
  x_ref,  # [T, H, P] packed tokens
  dt_ref,  # [H, T] fp32 (processed)
  b_ref,  # [T, G, N]
  c_ref,  # [T, G, N]
  init_ref,  # [N_seq, H, P, N] fp32
  y_ref,  # out [T, H, P]
  fin_ref,  # out [N_seq, H, P, N] fp32
  *ck_refs,  # out [N_seq, M, H, P, N] fp32 (only when M > 0)
  num_tokens: int,
  chunk: int,
  block_p: int,
  heads_per_group: int,
  per_ckpt: int,
  max_ckpt: int,
):
  s = pl.program_id(0)
  h = pl.program_id(1)
  p0 = pl.program_id(2) * block_p
  g = h // heads_per_group
  seq_start = cu_ref[s]
  seq_end = cu_ref[s + 1]
  nch = nchunk_ref[s]
  a_h = a_ref[h]
  d_h = d_ref[h]
  ps = pl.ds(p0, block_p)
  rows = lax.broadcasted_iota(jnp.int32, (chunk, chunk), 0)
  cols = lax.broadcasted_iota(jnp.int32, (chunk, chunk), 1)
  causal = rows >= cols
  state0 = init_ref[s, h, ps, :].astype(jnp.float32)

  offs = lax.broadcasted_iota(jnp.int32, (chunk,), 0)
  pcols = p0 + lax.broadcasted_iota(jnp.int32, (1, block_p), 1)
  ncols = lax.broadcasted_iota(jnp.int32, (1, init_ref.shape[-1]), 1)

  def body(ci, state):
    # Tokens of chunk ci of this sequence, read in place from the packed layout. Rows past the
    # sequence end load as zeros (dt = 0 leaves the state unchanged) and are not stored.
    tok = seq_start + ci * chunk + offs
    valid = tok < seq_end
    tok_c = jnp.minimum(tok, num_tokens - 1)  # in-bounds addresses for loads
    v2 = valid[:, None]
    # Array indices on every axis (interpret mode cannot mix gathers with slices).
    rows = tok_c[:, None]
    xb = pltriton.load(x_ref.at[rows, h, pcols], mask=v2, other=0)  # [C, BP]
    dtb = pltriton.load(dt_ref.at[h, tok_c], mask=valid, other=0.0)  # [C] fp32
    bb = pltriton.load(b_ref.at[rows, g, ncols], mask=v2, other=0)  # [C, N]
    cb_in = pltriton.load(c_ref.at[rows, g, ncols], mask=v2, other=0)
    da = dtb * a_h
    acum = jnp.cumsum(da)
    a_last = jnp.sum(da)
    cbm = _dot(cb_in, bb, 1, 1)  # [C, C]
    diff = acum[:, None] - acum[None, :]
    lmat = jnp.exp(jnp.where(causal, diff, -jnp.inf))
    w = (cbm * lmat * dtb[None, :]).astype(xb.dtype)
    y = _dot(w, xb, 1, 0)  # [C, BP]
    y += jnp.exp(acum)[:, None] * _dot(cb_in.astype(jnp.float32), state, 1, 1)
    y += d_h * xb.astype(jnp.float32)
    # Unclipped rows: masked-out rows never alias another token's row (interpret-mode safe).
    pltriton.store(y_ref.at[tok[:, None], h, pcols], y.astype(y_ref.dtype), mask=v2)
    xw = (xb.astype(jnp.float32) * (jnp.exp(a_last - acum) * dtb)[:, None]).astype(xb.dtype)
    state = jnp.exp(a_last) * state + _dot(xw, bb.astype(xb.dtype), 0, 0)  # [BP, N]
    if max_ckpt:
      done = ci + 1
      j = lax.div(done, per_ckpt) - 1

      @pl.when((lax.rem(done, per_ckpt) == 0) & (j < max_ckpt))
      def _():
        ck_refs[0][s, j, h, ps, :] = state

    return state

  state = lax.fori_loop(0, nch, body, state0)
  fin_ref[s, h, ps, :] = state
  if max_ckpt:
    zeros = jnp.zeros(state.shape, jnp.float32)

    def zero_body(j, carry):
      ck_refs[0][s, j, h, ps, :] = zeros
      return carry

    lax.fori_loop(ckcount_ref[s], max_ckpt, zero_body, 0)


def ssd_chunk_scan(
  x,
  dt,
  A,
  B,
  C,
  *,
  D=None,
  dt_bias=None,
  dt_softplus=True,
  initial_state=None,
  cu_seqlens=None,
  checkpoint_every=None,
  max_checkpoints=None,
  chunk_size=64,
  block_p=None,
  num_warps=4,
  num_stages=1,
  algorithm="fused",
  interpret=False,
):
  """Pallas chunked SSD; same contract as ``api.chunk_scan`` (inputs assumed validated).

  ``algorithm``: "fused" (one kernel, grid (N_seq, H, P // block_p), sequential over a
  sequence's chunks) or "parallel" (three kernels: chunk-local states over a (chunks, H,
  P-tiles) grid, a sequential state pass over (N_seq, H, P-tiles, N-tiles), then outputs over
  (chunks, H, P-tiles); more parallelism for few long sequences at the cost of writing and
  reading fp32 per-chunk states). Tuning: ``block_p`` (default min(P, 64)), Triton
  ``num_warps`` and ``num_stages``.
  """
  if algorithm not in ("fused", "parallel"):
    raise ValueError(f"algorithm={algorithm!r} must be 'fused' or 'parallel'")
  t_total, h, p = x.shape
  g, n = B.shape[-2:]
  bp = _block_p(p, block_p)
  _check_pow2(chunk_size=chunk_size, state_size=n, block_p=bp)
  cu, n_seq, every, m, dtp, a32, initial_state = reference.prepare_prefill(
    x, dt, A, B, dt_bias, dt_softplus, initial_state, cu_seqlens, checkpoint_every,
    max_checkpoints, chunk_size,
  )  # fmt: skip
  q = chunk_size
  d32 = jnp.zeros((h,), jnp.float32) if D is None else D.astype(jnp.float32)
  lengths = cu[1:] - cu[:-1]
  ck_count = jnp.minimum(lengths // every, m).astype(jnp.int32) if every else lengths * 0
  if t_total == 0:
    states = jnp.zeros((n_seq, m, h, p, n), jnp.float32)
    return jnp.zeros(x.shape, x.dtype), initial_state, (states, ck_count)

  if algorithm == "parallel":
    lay = packing.chunk_layout(cu, t_total, q)
    dtc = packing.to_chunks(dtp, lay).reshape(lay.num_chunks * q, h).T  # [H, NC*C], small
    y, final, states = _parallel_scan(
      lay, ck_count, a32, d32, x, dtc, B.astype(x.dtype), C.astype(x.dtype), initial_state,
      heads_per_group=h // g, block_p=bp, every=every, max_ckpt=m, num_warps=num_warps,
      num_stages=num_stages, interpret=interpret,
    )  # fmt: skip
    return y, final, (states, ck_count)

  # Fused: the kernel reads and writes the packed token layout in place.
  out_shape = [
    jax.ShapeDtypeStruct((t_total, h, p), x.dtype),
    jax.ShapeDtypeStruct((n_seq, h, p, n), jnp.float32),
  ]
  if m:
    out_shape.append(jax.ShapeDtypeStruct((n_seq, m, h, p, n), jnp.float32))
  kernel = functools.partial(
    _prefill_kernel,
    num_tokens=t_total,
    chunk=q,
    block_p=bp,
    heads_per_group=h // g,
    per_ckpt=max(every // q, 1),
    max_ckpt=m,
  )
  outs = pl.pallas_call(
    kernel,
    out_shape=out_shape,
    grid=(n_seq, h, p // bp),
    compiler_params=_compiler_params(num_warps, num_stages),
    interpret=interpret,
    name="ssd_chunk_scan",
  )(
    cu,
    ((lengths + q - 1) // q).astype(jnp.int32),
    ck_count,
    a32,
    d32,
    x,
    dtp.T,  # [H, T]: per-token scalars contiguous per head
    B.astype(x.dtype),
    C.astype(x.dtype),
    initial_state,
  )
  states = outs[2] if m else jnp.zeros((n_seq, 0, h, p, n), jnp.float32)
  return outs[0], outs[1], (states, ck_count)


def _chunk_rows(gidx_ref, c, chunk: int, num_tokens: int):
  """Token rows of chunk slot c: (rows [C], in-bounds rows [C], valid [C])."""
  tok = gidx_ref[pl.ds(pl.multiple_of(c * chunk, chunk), chunk)]  # T marks padding
  return tok, jnp.minimum(tok, num_tokens - 1), tok < num_tokens


def _chunk_state_kernel(
  gidx_ref,  # [NC*C] int32 token of each chunk slot (T for padding)
  acum_ref,  # [H, NC*C] fp32 in-chunk cumsum of dt*A
  alast_ref,  # [H, NC] fp32 chunk totals
  x_ref,  # [T, H, P] packed tokens
  dt_ref,  # [H, NC*C] fp32 (chunk layout)
  b_ref,  # [T, G, N]
  s_ref,  # out [NC, H, P, N] fp32 chunk-local states
  *,
  num_tokens: int,
  chunk: int,
  block_p: int,
  heads_per_group: int,
):
  c = pl.program_id(0)
  h = pl.program_id(1)
  p0 = pl.program_id(2) * block_p
  g = h // heads_per_group
  ts = pl.ds(pl.multiple_of(c * chunk, chunk), chunk)
  _, tok_c, valid = _chunk_rows(gidx_ref, c, chunk, num_tokens)
  rows, v2 = tok_c[:, None], valid[:, None]
  pcols = p0 + lax.broadcasted_iota(jnp.int32, (1, block_p), 1)
  ncols = lax.broadcasted_iota(jnp.int32, (1, s_ref.shape[-1]), 1)
  xb = pltriton.load(x_ref.at[rows, h, pcols], mask=v2, other=0)
  bb = pltriton.load(b_ref.at[rows, g, ncols], mask=v2, other=0)
  wk = jnp.exp(alast_ref[h, c] - acum_ref[h, ts]) * dt_ref[h, ts]
  xw = (xb.astype(jnp.float32) * wk[:, None]).astype(xb.dtype)
  s_ref[c, h, pl.ds(p0, block_p), :] = _dot(xw, bb.astype(xb.dtype), 0, 0)


def _state_pass_kernel(
  start_ref,  # [N] first chunk of each sequence
  nchunk_ref,  # [N]
  ckcount_ref,  # [N]
  decay_ref,  # [H, NC] fp32 exp(chunk total)
  s_ref,  # [NC, H, P, N] fp32 chunk-local states (aliased with hin_ref)
  init_ref,  # [N_seq, H, P, N]
  hin_ref,  # out [NC, H, P, N]: state entering each chunk
  fin_ref,  # out [N_seq, H, P, N]
  *ck_refs,  # out [N_seq, M, H, P, N] (only when M > 0)
  block_p: int,
  block_n: int,
  per_ckpt: int,
  max_ckpt: int,
):
  sq = pl.program_id(0)
  h = pl.program_id(1)
  ps = pl.ds(pl.program_id(2) * block_p, block_p)
  ns = pl.ds(pl.program_id(3) * block_n, block_n)
  c0 = start_ref[sq]

  def body(ci, state):
    c = c0 + ci
    local = s_ref[c, h, ps, ns]  # read before the aliased write of the same tile
    hin_ref[c, h, ps, ns] = state
    state = decay_ref[h, c] * state + local
    if max_ckpt:
      done = ci + 1
      j = lax.div(done, per_ckpt) - 1

      @pl.when((lax.rem(done, per_ckpt) == 0) & (j < max_ckpt))
      def _():
        ck_refs[0][sq, j, h, ps, ns] = state

    return state

  state = lax.fori_loop(0, nchunk_ref[sq], body, init_ref[sq, h, ps, ns])
  fin_ref[sq, h, ps, ns] = state
  if max_ckpt:
    zeros = jnp.zeros(state.shape, jnp.float32)

    def zero_body(j, carry):
      ck_refs[0][sq, j, h, ps, ns] = zeros
      return carry

    lax.fori_loop(ckcount_ref[sq], max_ckpt, zero_body, 0)


def _chunk_output_kernel(
  gidx_ref,  # [NC*C] int32
  acum_ref,  # [H, NC*C]
  d_ref,  # [H]
  x_ref,  # [T, H, P]
  dt_ref,  # [H, NC*C]
  b_ref,  # [T, G, N]
  c_ref,  # [T, G, N]
  hin_ref,  # [NC, H, P, N] fp32
  y_ref,  # out [T, H, P]
  *,
  num_tokens: int,
  chunk: int,
  block_p: int,
  heads_per_group: int,
):
  c = pl.program_id(0)
  h = pl.program_id(1)
  p0 = pl.program_id(2) * block_p
  g = h // heads_per_group
  ts = pl.ds(pl.multiple_of(c * chunk, chunk), chunk)
  tok, tok_c, valid = _chunk_rows(gidx_ref, c, chunk, num_tokens)
  rows, v2 = tok_c[:, None], valid[:, None]
  pcols = p0 + lax.broadcasted_iota(jnp.int32, (1, block_p), 1)
  ncols = lax.broadcasted_iota(jnp.int32, (1, hin_ref.shape[-1]), 1)
  sub = lax.broadcasted_iota(jnp.int32, (chunk, chunk), 0)
  col = lax.broadcasted_iota(jnp.int32, (chunk, chunk), 1)
  xb = pltriton.load(x_ref.at[rows, h, pcols], mask=v2, other=0)
  cb_in = pltriton.load(c_ref.at[rows, g, ncols], mask=v2, other=0)
  bb = pltriton.load(b_ref.at[rows, g, ncols], mask=v2, other=0)
  dtb = dt_ref[h, ts]
  acum = acum_ref[h, ts]
  cbm = _dot(cb_in, bb, 1, 1)
  lmat = jnp.exp(jnp.where(sub >= col, acum[:, None] - acum[None, :], -jnp.inf))
  w = (cbm * lmat * dtb[None, :]).astype(xb.dtype)
  y = _dot(w, xb, 1, 0)
  h_in = hin_ref[c, h, pl.ds(p0, block_p), :]
  y += jnp.exp(acum)[:, None] * _dot(cb_in.astype(jnp.float32), h_in, 1, 1)
  y += d_ref[h] * xb.astype(jnp.float32)
  # Unclipped rows: padding slots (row T) are out of range and masked, never aliasing a token.
  pltriton.store(y_ref.at[tok[:, None], h, pcols], y.astype(y_ref.dtype), mask=v2)


def _parallel_scan(
  lay, ck_count, a32, d32, x, dtc, b, c, init, *, heads_per_group, block_p, every,
  max_ckpt, num_warps, num_stages, interpret,
):  # fmt: skip
  """Three-kernel SSD (chunk states -> sequential state pass -> outputs); x, b, c and the
  returned y are in the packed token layout, dtc [H, NC*C] in the chunk layout."""
  nc, q = lay.num_chunks, lay.chunk_size
  h, t_pad = dtc.shape
  t_total, _, p = x.shape
  n = b.shape[-1]
  n_seq = init.shape[0]
  da = (dtc * a32[:, None]).reshape(h, nc, q)
  acum = jnp.cumsum(da, axis=-1)
  alast = acum[..., -1]
  acum = acum.reshape(h, t_pad)
  cp = _compiler_params(num_warps, num_stages)
  common = dict(num_tokens=t_total, chunk=q, block_p=block_p, heads_per_group=heads_per_group)
  s_loc = pl.pallas_call(
    functools.partial(_chunk_state_kernel, **common),
    out_shape=jax.ShapeDtypeStruct((nc, h, p, n), jnp.float32),
    grid=(nc, h, p // block_p),
    compiler_params=cp,
    interpret=interpret,
    name="ssd_chunk_state",
  )(lay.gather_index, acum, alast, x, dtc, b)
  bn = min(n, 64)
  bp2 = min(p, 64)
  out_shape = [
    jax.ShapeDtypeStruct((nc, h, p, n), jnp.float32),
    jax.ShapeDtypeStruct((n_seq, h, p, n), jnp.float32),
  ]
  if max_ckpt:
    out_shape.append(jax.ShapeDtypeStruct((n_seq, max_ckpt, h, p, n), jnp.float32))
  outs = pl.pallas_call(
    functools.partial(
      _state_pass_kernel,
      block_p=bp2,
      block_n=bn,
      per_ckpt=max(every // q, 1),
      max_ckpt=max_ckpt,
    ),  # fmt: skip
    out_shape=out_shape,
    grid=(n_seq, h, p // bp2, n // bn),
    input_output_aliases={4: 0},
    compiler_params=_compiler_params(4, 1),
    interpret=interpret,
    name="ssd_state_pass",
  )(lay.first, lay.count, ck_count, jnp.exp(alast), s_loc, init)
  h_in, final = outs[0], outs[1]
  states = outs[2] if max_ckpt else jnp.zeros((n_seq, 0, h, p, n), jnp.float32)
  y = pl.pallas_call(
    functools.partial(_chunk_output_kernel, **common),
    out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    grid=(nc, h, p // block_p),
    compiler_params=cp,
    interpret=interpret,
    name="ssd_chunk_output",
  )(lay.gather_index, acum, d32, x, dtc, b, c, h_in)
  return y, final, states


def _prep_step(x, dt, A, B, C, D, dt_bias, dt_softplus):
  h = x.shape[-2]
  dtp = reference.process_dt(dt, dt_bias, dt_softplus)
  d32 = jnp.zeros((h,), jnp.float32) if D is None else D.astype(jnp.float32)
  return dtp, A.astype(jnp.float32), d32


def _decode_kernel(
  ridx_ref,
  widx_ref,
  a_ref,
  d_ref,
  x_ref,  # [Nb, H, P]
  dt_ref,  # [Nb, H] fp32
  b_ref,  # [Nb, G, N]
  c_ref,
  pool_in_ref,  # [slots, H, P, N] (aliased with pool_ref)
  y_ref,  # out [Nb, H, P]
  pool_ref,  # out (aliased)
  *,
  block_p: int,
  heads_per_group: int,
):
  b = pl.program_id(0)
  h = pl.program_id(1)
  ps = pl.ds(pl.program_id(2) * block_p, block_p)
  g = h // heads_per_group
  r = ridx_ref[b]
  w = widx_ref[b]
  state = pool_in_ref[r, h, ps, :].astype(jnp.float32)  # [BP, N]
  xt = x_ref[b, h, ps].astype(jnp.float32)
  dtt = dt_ref[b, h]
  bt = b_ref[b, g, :].astype(jnp.float32)
  ct = c_ref[b, g, :].astype(jnp.float32)
  state = jnp.exp(dtt * a_ref[h]) * state + (dtt * xt)[:, None] * bt[None, :]
  y = jnp.sum(state * ct[None, :], axis=1) + d_ref[h] * xt
  y_ref[b, h, ps] = y.astype(y_ref.dtype)
  pool_ref[w, h, ps, :] = state.astype(pool_ref.dtype)


def ssd_decode(
  x,
  dt,
  A,
  B,
  C,
  *,
  D=None,
  dt_bias=None,
  dt_softplus=True,
  state_pool,
  read_indices,
  write_indices,
  block_p=None,
  interpret=False,
):
  """Pallas decode step; updates ``state_pool`` in place (aliased output). See ``api``."""
  nb, h, p = x.shape
  g, n = B.shape[-2:]
  bp = _block_p(p, block_p)
  _check_pow2(state_size=n, block_p=bp)
  dtp, a32, d32 = _prep_step(x, dt, A, B, C, D, dt_bias, dt_softplus)
  kernel = functools.partial(_decode_kernel, block_p=bp, heads_per_group=h // g)
  y, pool = pl.pallas_call(
    kernel,
    out_shape=[
      jax.ShapeDtypeStruct((nb, h, p), x.dtype),
      jax.ShapeDtypeStruct(state_pool.shape, state_pool.dtype),
    ],
    grid=(nb, h, p // bp),
    input_output_aliases={8: 1},
    compiler_params=_compiler_params(num_warps=2),
    interpret=interpret,
    name="ssd_decode",
  )(
    read_indices.astype(jnp.int32),
    write_indices.astype(jnp.int32),
    a32,
    d32,
    x,
    dtp,
    B,
    C,
    state_pool,
  )
  return y, pool


def _verify_kernel(
  ridx_ref,
  a_ref,
  d_ref,
  x_ref,  # [Nb, S, H, P]
  dt_ref,  # [Nb, S, H] fp32
  b_ref,  # [Nb, S, G, N]
  c_ref,
  pool_ref,  # [slots, H, P, N]
  y_ref,  # out [Nb, S, H, P]
  st_ref,  # out [Nb, S, H, P, N] fp32
  *,
  block_p: int,
  heads_per_group: int,
  num_steps: int,
):
  b = pl.program_id(0)
  h = pl.program_id(1)
  ps = pl.ds(pl.program_id(2) * block_p, block_p)
  g = h // heads_per_group
  a_h = a_ref[h]
  d_h = d_ref[h]
  state0 = pool_ref[ridx_ref[b], h, ps, :].astype(jnp.float32)

  def body(i, state):
    xt = x_ref[b, i, h, ps].astype(jnp.float32)
    dtt = dt_ref[b, i, h]
    bt = b_ref[b, i, g, :].astype(jnp.float32)
    ct = c_ref[b, i, g, :].astype(jnp.float32)
    state = jnp.exp(dtt * a_h) * state + (dtt * xt)[:, None] * bt[None, :]
    y = jnp.sum(state * ct[None, :], axis=1) + d_h * xt
    y_ref[b, i, h, ps] = y.astype(y_ref.dtype)
    st_ref[b, i, h, ps, :] = state
    return state

  lax.fori_loop(0, num_steps, body, state0)


def ssd_verify(
  x,
  dt,
  A,
  B,
  C,
  *,
  D=None,
  dt_bias=None,
  dt_softplus=True,
  state_pool,
  read_indices,
  block_p=None,
  interpret=False,
):
  """Pallas multi-token verify: per-token outputs and states. See ``api.ssd_verify``."""
  nb, steps, h, p = x.shape
  g, n = B.shape[-2:]
  bp = _block_p(p, block_p)
  _check_pow2(state_size=n, block_p=bp)
  dtp, a32, d32 = _prep_step(x, dt, A, B, C, D, dt_bias, dt_softplus)
  kernel = functools.partial(_verify_kernel, block_p=bp, heads_per_group=h // g, num_steps=steps)
  return pl.pallas_call(
    kernel,
    out_shape=[
      jax.ShapeDtypeStruct((nb, steps, h, p), x.dtype),
      jax.ShapeDtypeStruct((nb, steps, h, p, n), jnp.float32),
    ],
    grid=(nb, h, p // bp),
    compiler_params=_compiler_params(num_warps=2),
    interpret=interpret,
    name="ssd_verify",
  )(read_indices.astype(jnp.int32), a32, d32, x, dtp, B, C, state_pool)
