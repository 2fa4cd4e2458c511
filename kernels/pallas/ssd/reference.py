"""Pure-JAX Mamba2 SSD: a token-by-token fp32 oracle and the chunked form (the "xla" path).

Recurrence per head h (group g = h // (H/G)), state S in R^{P x N}, fp32:

  dt_t = softplus(dt_t + dt_bias_h)      (or dt_t + dt_bias_h when dt_softplus=False)
  S_t  = exp(dt_t A_h) S_{t-1} + dt_t x_t B_tᵀ
  y_t  = S_t C_t + D_h x_t

Shapes (packed tokens): x [T, H, P], dt [T, H], A [H], B and C [T, G, N], D and dt_bias [H],
state [N_seq, H, P, N] fp32. Checkpoint j of sequence n is the state after (j+1)*every tokens of
that sequence.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kernels.pallas import packing

_HI = jax.lax.Precision.HIGHEST


def process_dt(dt: jax.Array, dt_bias, dt_softplus: bool) -> jax.Array:
  """fp32 dt after bias and (optional) softplus; dt [..., H]."""
  dt = dt.astype(jnp.float32)
  if dt_bias is not None:
    dt = dt + dt_bias.astype(jnp.float32)
  return jax.nn.softplus(dt) if dt_softplus else dt


def heads_to_groups(arr: jax.Array, num_heads: int) -> jax.Array:
  """[..., G, N] -> [..., H, N] by the h // (H/G) mapping."""
  g = arr.shape[-2]
  return jnp.repeat(arr, num_heads // g, axis=-2)


def ssd_step(state, x, dt, A, B, C, D):
  """One recurrence step for a batch; all fp32.

  Args:
    state: [Nb, H, P, N]; x: [Nb, H, P]; dt: [Nb, H] (already processed); A: [H];
    B, C: [Nb, G, N]; D: [H] or None.

  Returns:
    (y [Nb, H, P], new_state [Nb, H, P, N]).
  """
  h = x.shape[-2]
  bh = heads_to_groups(B, h)
  ch = heads_to_groups(C, h)
  decay = jnp.exp(dt * A[None, :])
  new = decay[..., None, None] * state + (dt[..., None] * x)[..., None] * bh[..., None, :]
  y = jnp.einsum("bhpn,bhn->bhp", new, ch, precision=_HI)
  if D is not None:
    y = y + D[None, :, None] * x
  return y, new


def _f32(*arrays):
  return [None if a is None else jnp.asarray(a).astype(jnp.float32) for a in arrays]


def ssd_oracle(
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
):
  """Token-by-token fp32 oracle (one ``lax.scan`` over the packed tokens, resetting the state at
  each sequence start). Needs a concrete ``cu_seqlens``.

  Returns (y [T, H, P] fp32, final_state [N, H, P, N] fp32, (states [N, M, H, P, N], counts [N])).
  """
  t_total, h, p = x.shape
  n_state = B.shape[-1]
  cu = np.asarray([0, t_total] if cu_seqlens is None else cu_seqlens)
  n_seq = len(cu) - 1
  every = checkpoint_every or 0
  _, m = packing.resolve_checkpoints(every or None, max_checkpoints, t_total, cu, None)
  if initial_state is None:
    initial_state = jnp.zeros((n_seq, h, p, n_state), jnp.float32)
  seq = np.searchsorted(cu[1:], np.arange(t_total), side="right")
  is_start = np.zeros((t_total,), bool)
  is_start[cu[:-1][cu[:-1] < cu[1:]]] = True
  x, B, C, A, D, initial_state = _f32(x, B, C, A, D, initial_state)
  dtp = process_dt(dt, dt_bias, dt_softplus)
  y, per_tok = _oracle_scan(x, dtp, A, B, C, D, initial_state, jnp.asarray(seq), is_start)
  finals, states = [], np.zeros((n_seq, m, h, p, n_state), np.float32)
  counts = np.zeros((n_seq,), np.int32)
  for n in range(n_seq):
    lo, hi = int(cu[n]), int(cu[n + 1])
    finals.append(per_tok[hi - 1] if hi > lo else initial_state[n])
    if every:
      counts[n] = min((hi - lo) // every, m)
      for j in range(counts[n]):
        states[n, j] = np.asarray(per_tok[lo + (j + 1) * every - 1])
  return y, jnp.stack(finals), (jnp.asarray(states), jnp.asarray(counts))


@jax.jit
def _oracle_scan(x, dtp, A, B, C, D, initial_state, seq, is_start):
  """lax.scan over all packed tokens; the state resets at every sequence start."""

  def step(s, inp):
    xt, dtt, bt, ct, sq, start = inp
    s = jnp.where(start, initial_state[sq], s)
    y, s = ssd_step(s[None], xt[None], dtt[None], A, bt[None], ct[None], D)
    return s[0], (y[0], s[0])

  s0 = jnp.zeros(initial_state.shape[1:], jnp.float32)
  _, (y, per_tok) = jax.lax.scan(step, s0, (x, dtp, B, C, seq, is_start))
  return y, per_tok


class Prefill(NamedTuple):
  """Host-side setup shared by the chunked XLA and Pallas prefills."""

  cu: jax.Array  # int32 [N+1]
  n_seq: int
  every: int  # 0: no checkpoints
  max_ckpt: int  # M
  dtp: jax.Array  # fp32 [T, H], processed dt
  a32: jax.Array  # fp32 [H]
  initial_state: jax.Array  # fp32 [N, H, P, N_state]


def prepare_prefill(
  x, dt, A, B, dt_bias, dt_softplus, initial_state, cu_seqlens, checkpoint_every,
  max_checkpoints, chunk_size,
) -> Prefill:  # fmt: skip
  """Resolves cu_seqlens and checkpoint slots, processes dt, defaults/casts the initial state."""
  t_total, h, p = x.shape
  cu, n_seq = packing.normalize_cu_seqlens(cu_seqlens, t_total)
  every, m = packing.resolve_checkpoints(
    checkpoint_every, max_checkpoints, t_total, cu_seqlens, chunk_size
  )
  if initial_state is None:
    initial_state = jnp.zeros((n_seq, h, p, B.shape[-1]), jnp.float32)
  return Prefill(
    cu, n_seq, every, m, process_dt(dt, dt_bias, dt_softplus), A.astype(jnp.float32),
    initial_state.astype(jnp.float32),
  )  # fmt: skip


def ssd_chunked(
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
):
  """Chunked SSD in pure JAX (fp32 math, jittable with traced ``cu_seqlens``).

  Same contract as ``api.chunk_scan`` (inputs assumed validated). y is returned in x.dtype.
  """
  t_total, h, p = x.shape
  g, n_state = B.shape[-2], B.shape[-1]
  r = h // g
  cu, n_seq, every, m, dtp, A32, initial_state = prepare_prefill(
    x, dt, A, B, dt_bias, dt_softplus, initial_state, cu_seqlens, checkpoint_every,
    max_checkpoints, chunk_size,
  )  # fmt: skip
  (D32,) = _f32(D)
  lay = packing.chunk_layout(cu, t_total, chunk_size)
  nc, q = lay.num_chunks, chunk_size

  xc = packing.to_chunks(x.astype(jnp.float32), lay).reshape(nc, q, g, r, p)
  dtc = packing.to_chunks(dtp, lay).reshape(nc, q, g, r)  # padding slots: dt = 0
  bc = packing.to_chunks(B.astype(jnp.float32), lay)  # [nc, q, g, n]
  cc = packing.to_chunks(C.astype(jnp.float32), lay)
  acum = jnp.cumsum(dtc * A32.reshape(g, r), axis=1)  # [nc, q, g, r], <= 0
  a_last = acum[:, -1]  # [nc, g, r]

  # Chunk-local states and their passing from chunk to chunk.
  wk = jnp.exp(a_last[:, None] - acum) * dtc  # [nc, q, g, r]
  s_loc = jnp.einsum("cjgn,cjgrp->cgrpn", bc, xc * wk[..., None], precision=_HI)
  decay = jnp.exp(a_last)

  def pass_state(h_prev, inp):
    is_first, seq, dec, s = inp
    init = initial_state[jnp.minimum(seq, n_seq - 1)].reshape(g, r, p, n_state)
    init = jnp.where(seq < n_seq, init, 0.0)
    h_in = jnp.where(is_first, init, h_prev)
    h_out = dec[..., None, None] * h_in + s
    return h_out, h_out

  h0 = jnp.zeros((g, r, p, n_state), jnp.float32)
  _, h_out = jax.lax.scan(pass_state, h0, (lay.chunk_is_first, lay.seq, decay, s_loc))
  init_c = initial_state[jnp.minimum(lay.seq, n_seq - 1)].reshape(nc, g, r, p, n_state)
  init_c = jnp.where((lay.seq < n_seq)[:, None, None, None, None], init_c, 0.0)
  prev = jnp.concatenate([h0[None], h_out[:-1]], 0)
  h_in = jnp.where(lay.chunk_is_first[:, None, None, None, None], init_c, prev)

  # Outputs.
  cb = jnp.einsum("cign,cjgn->cgij", cc, bc, precision=_HI)  # [nc, g, q, q]
  ai = jnp.moveaxis(acum, 1, -1)  # [nc, g, r, q]
  diff = ai[..., :, None] - ai[..., None, :]
  causal = jnp.tril(jnp.ones((q, q), bool))
  lmat = jnp.exp(jnp.where(causal, diff, -jnp.inf))  # mask before exp
  w = cb[:, :, None] * lmat * jnp.moveaxis(dtc, 1, -1)[..., None, :]  # [nc, g, r, q, q]
  y = jnp.einsum("cgrij,cjgrp->cigrp", w, xc, precision=_HI)
  y_state = jnp.einsum("cign,cgrpn->cigrp", cc, h_in, precision=_HI)
  y = y + jnp.exp(acum)[..., None] * y_state
  if D32 is not None:
    y = y + D32.reshape(g, r)[:, :, None] * xc
  y = packing.from_chunks(y.reshape(nc, q, h, p), lay).astype(x.dtype)

  h_out = h_out.reshape(nc, h, p, n_state)
  last = lay.first + lay.count - 1
  final = jnp.where(
    (lay.count > 0)[:, None, None, None], h_out[jnp.maximum(last, 0)], initial_state
  )
  states, counts = gather_checkpoints(h_out, lay, cu, every, m)
  return y, final, (states, counts)


def gather_checkpoints(h_out, lay: packing.ChunkLayout, cu, every: int, m: int):
  """Per-chunk end states [nc, ...] -> (states [N, M, ...] zero-padded, counts [N])."""
  n_seq = cu.shape[0] - 1
  lengths = cu[1:] - cu[:-1]
  if not every:
    return jnp.zeros((n_seq, 0) + h_out.shape[1:], h_out.dtype), jnp.zeros((n_seq,), jnp.int32)
  counts = jnp.minimum(lengths // every, m).astype(jnp.int32)
  per = every // lay.chunk_size
  j = jnp.arange(m, dtype=jnp.int32)
  idx = lay.first[:, None] + (j[None, :] + 1) * per - 1
  ok = j[None, :] < counts[:, None]
  idx = jnp.clip(jnp.where(ok, idx, 0), 0, h_out.shape[0] - 1)
  states = h_out[idx]
  states = jnp.where(ok.reshape(ok.shape + (1,) * (h_out.ndim - 1)), states, 0.0)
  return states, counts
