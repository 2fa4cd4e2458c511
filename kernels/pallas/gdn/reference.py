"""Pure-JAX Gated DeltaNet: fp32 token-scan oracle and chunked (WY/UT) XLA form.

Recurrence per value head (state ``S[d_k, d_v]`` fp32, q already L2-normalised and scaled):
``S <- exp(g_t) S;  delta = beta_t (v_t - S^T k_t);  S <- S + k_t delta^T;  o_t = S^T q_t``.
Value head ``h`` uses key head ``h // (H_v // H_k)``. Shapes follow ``api.py``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from kernels.pallas import packing

CHUNK = 64
_HI = lax.Precision.HIGHEST
_EPS = 1e-6


def chunk_layout(cu_seqlens: jax.Array, num_tokens: int, chunk: int = CHUNK, with_tokens=True):
  """GDN chunk tables: ``packing.chunk_layout`` with the loose static bound ``T // C + N``
  chunk slots (the slot count the Pallas kernels were tuned and GPU-verified with)."""
  n = cu_seqlens.shape[0] - 1
  return packing.chunk_layout(
    cu_seqlens, num_tokens, chunk, num_chunks=num_tokens // chunk + n, with_tokens=with_tokens
  )


def l2norm(x: jax.Array) -> jax.Array:
  """fp32 L2 normalisation over the last axis: ``x / sqrt(sum(x^2) + 1e-6)``."""
  x = x.astype(jnp.float32)
  return x * lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + _EPS)


def prepare_qk(q, k, num_v_heads: int, scale: float):
  """Normalises q, k (fp32), scales q and repeats key heads to ``num_v_heads``."""
  group = num_v_heads // q.shape[-2]
  qn = jnp.repeat(l2norm(q) * scale, group, axis=-2)
  kn = jnp.repeat(l2norm(k), group, axis=-2)
  return qn, kn


def recurrent_step(state, q, k, v, g, beta):
  """One token for all heads. state [..., H, dk, dv]; q, k [..., H, dk]; v [..., H, dv]."""
  state = jnp.exp(g)[..., None, None] * state
  pred = jnp.einsum("...hkv,...hk->...hv", state, k, precision=_HI)
  delta = beta[..., None] * (v - pred)
  state = state + k[..., :, None] * delta[..., None, :]
  o = jnp.einsum("...hkv,...hk->...hv", state, q, precision=_HI)
  return state, o


def recurrent_gated_delta_rule(
  q, k, v, g, beta, *, initial_state=None, cu_seqlens=None, scale=None, return_states=False
):
  """fp32 token-by-token oracle: one ``lax.scan`` over the packed tokens, reset per sequence.

  ``cu_seqlens`` must be concrete (host values). Returns ``(o [T, H_v, d_v] fp32,
  final_state [N, H_v, d_k, d_v] fp32)`` and, when ``return_states``, also the state after
  every token ``[T, H_v, d_k, d_v]``.
  """
  t, h_v, d_v = v.shape
  d_k = q.shape[-1]
  scale = d_k**-0.5 if scale is None else float(scale)
  cu = np.asarray([0, t] if cu_seqlens is None else cu_seqlens, dtype=np.int64)
  n = len(cu) - 1
  if initial_state is None:
    initial_state = jnp.zeros((n, h_v, d_k, d_v), jnp.float32)
  seq = np.searchsorted(cu, np.arange(t), side="right") - 1
  is_start = np.zeros(t, bool)
  is_start[cu[:-1][cu[:-1] < cu[1:]]] = True
  o, states = _oracle_scan(
    q,
    k,
    v,
    g,
    beta,
    initial_state.astype(jnp.float32),
    jnp.asarray(seq, jnp.int32),
    jnp.asarray(is_start),
    scale,
  )
  final = jnp.stack(
    [states[cu[i + 1] - 1] if cu[i + 1] > cu[i] else initial_state[i] for i in range(n)]
  ).astype(jnp.float32)
  if return_states:
    return o, final, states
  return o, final


@jax.jit
def _oracle_scan(q, k, v, g, beta, init, seq, is_start, scale):
  h_v = v.shape[-2]
  qn, kn = prepare_qk(q, k, h_v, scale)
  f32 = jnp.float32

  def step(s, xs):
    sq, st, *tok = xs
    s = jnp.where(st, init[sq], s)
    s, o = recurrent_step(s, *tok)
    return s, (o, s)

  _, (o, states) = lax.scan(
    step, init[0], (seq, is_start, qn, kn, v.astype(f32), g.astype(f32), beta.astype(f32))
  )
  return o, states


def chunk_intra(qn, kn, v, g, beta):
  """Per-chunk (parallel) part of the WY/UT form, all fp32.

  Args: qn, kn [..., C, dk]; v [..., C, dv]; g, beta [..., C] (padded tokens: zeros).
  Returns: (w, u, kt, qt, uo, gc) with w, kt, qt [..., C, dk]; u, uo [..., C, dv]; gc [...]
    such that, for the state s entering the chunk, ``v_new = u - w s``,
    ``o = qt s + uo`` and ``s_next = exp(gc) s + kt^T v_new``.
  """
  c = g.shape[-1]
  big_g = jnp.cumsum(g, axis=-1)
  diff = big_g[..., :, None] - big_g[..., None, :]
  causal = jnp.tril(jnp.ones((c, c), bool))
  gamma = jnp.exp(jnp.where(causal, diff, -jnp.inf))
  strict = jnp.tril(jnp.ones((c, c), bool), -1)
  kk = jnp.einsum("...ik,...jk->...ij", kn, kn, precision=_HI)
  a = jnp.where(strict, beta[..., :, None] * kk * gamma, 0.0)
  eye = jnp.eye(c, dtype=jnp.float32)
  rhs = jnp.concatenate([(beta * jnp.exp(big_g))[..., None] * kn, beta[..., None] * v], axis=-1)
  wu = jax.scipy.linalg.solve_triangular(eye + a, rhs, lower=True, unit_diagonal=True)
  d_k = kn.shape[-1]
  w, u = wu[..., :d_k], wu[..., d_k:]
  gc = big_g[..., -1]
  kt = jnp.exp(gc[..., None] - big_g)[..., None] * kn
  p = jnp.einsum("...ik,...jk->...ij", qn, kn, precision=_HI) * gamma
  qt = jnp.exp(big_g)[..., None] * qn - jnp.einsum("...ij,...jk->...ik", p, w, precision=_HI)
  uo = jnp.einsum("...ij,...jv->...iv", p, u, precision=_HI)
  return w, u, kt, qt, uo, gc


def chunk_inter(s, w, u, kt, qt, uo, gc):
  """Sequential part for one chunk: returns ``(s_next, o)``; s [..., dk, dv] fp32."""
  v_new = u - jnp.einsum("...ck,...kv->...cv", w, s, precision=_HI)
  o = jnp.einsum("...ck,...kv->...cv", qt, s, precision=_HI) + uo
  s_next = jnp.exp(gc)[..., None, None] * s + jnp.einsum(
    "...ck,...cv->...kv", kt, v_new, precision=_HI
  )
  return s_next, o


@functools.partial(
  jax.jit, static_argnames=("checkpoint_every", "max_checkpoints", "scale", "chunk")
)
def chunk_gated_delta_rule_xla(
  q,
  k,
  v,
  g,
  beta,
  *,
  initial_state,
  cu_seqlens,
  checkpoint_every,
  max_checkpoints,
  scale,
  chunk=CHUNK,
):
  """Chunked WY/UT form in pure JAX (the "xla" implementation); arguments validated by api.

  Args:
    q, k: [T, H_k, d_k]; v: [T, H_v, d_v]; g, beta: [T, H_v].
    initial_state: [N, H_v, d_k, d_v] fp32. cu_seqlens: int32[N+1] (may be traced).
    checkpoint_every: int multiple of ``chunk`` or None. max_checkpoints: static int M.
    scale: float multiplier of the normalised q.

  Returns:
    (o [T, H_v, d_v] in v.dtype, final [N, H_v, d_k, d_v] fp32,
     (states [N, M, H_v, d_k, d_v] fp32, counts int32[N])).
  """
  t, h_v, d_v = v.shape
  d_k = q.shape[-1]
  n = initial_state.shape[0]
  lay = chunk_layout(cu_seqlens, t, chunk)
  qn, kn = prepare_qk(q, k, h_v, scale)
  pos = jnp.arange(chunk, dtype=jnp.int32)
  idx = lay.start[:, None] + pos[None, :]
  valid = pos[None, :] < lay.length[:, None]
  idx = jnp.where(valid, idx, 0)

  def gather(x):
    y = x.astype(jnp.float32)[idx]
    mask = valid.reshape(valid.shape + (1,) * (y.ndim - 2))
    return jnp.where(mask, y, 0.0)

  # [NC, C, H, d] -> [NC, H, C, d]; g, beta -> [NC, H, C].
  qc, kc, vc = (jnp.swapaxes(gather(x), 1, 2) for x in (qn, kn, v))
  gc_, bc = (jnp.swapaxes(gather(x), 1, 2) for x in (g, beta))
  w, u, kt, qt, uo, gcs = chunk_intra(qc, kc, vc, gc_, bc)

  m = max_checkpoints
  ce = checkpoint_every or chunk
  init_pad = jnp.concatenate(
    [initial_state.astype(jnp.float32), jnp.zeros((1, h_v, d_k, d_v), jnp.float32)]
  )
  final0 = init_pad
  ckpt0 = jnp.zeros((n + 1, m + 1, h_v, d_k, d_v), jnp.float32)
  last = lay.count - 1

  def step(carry, xs):
    s, final, ckpt = carry
    seq, loc, length, w_, u_, kt_, qt_, uo_, g_ = xs
    s0 = jnp.where(loc == 0, init_pad[seq], s)
    s1, o = chunk_inter(s0, w_, u_, kt_, qt_, uo_, g_)
    seq_c = jnp.minimum(seq, n - 1)
    is_last = (seq < n) & (loc == last[seq_c])
    final = lax.dynamic_update_index_in_dim(final, s1, jnp.where(is_last, seq, n), axis=0)
    end = (loc + 1) * chunk
    is_ck = (checkpoint_every is not None) & (length == chunk) & (end % ce == 0)
    slot = end // ce - 1
    is_ck = is_ck & (slot < m) & (seq < n)
    ckpt = lax.dynamic_update_slice(
      ckpt,
      s1[None, None],
      (jnp.where(is_ck, seq, n), jnp.where(is_ck, slot, m), 0, 0, 0),
    )
    return (s1, final, ckpt), o

  s_init = jnp.zeros((h_v, d_k, d_v), jnp.float32)
  xs = (lay.seq, lay.local, lay.length, w, u, kt, qt, uo, gcs)
  (_, final, ckpt), o_chunks = lax.scan(step, (s_init, final0, ckpt0), xs)
  # o_chunks [NC, H, C, dv] -> tokens.
  o = o_chunks[lay.token_chunk, :, lay.token_pos]
  if checkpoint_every is None:
    counts = jnp.zeros((n,), jnp.int32)
  else:
    counts = jnp.minimum(lay.lengths // checkpoint_every, m).astype(jnp.int32)
  return o.astype(v.dtype), final[:n], (ckpt[:n, :m], counts)


@functools.partial(jax.jit, static_argnames=("scale",))
def decode_xla(q, k, v, g, beta, *, state_pool, read_indices, write_indices, scale):
  """One token per sequence: q, k [N, H_k, d_k]; v [N, H_v, d_v]; g, beta [N, H_v].

  Returns ``(o [N, H_v, d_v] in v.dtype, new_pool)`` with the updated states written to
  ``state_pool[write_indices]`` (all reads happen before the writes).
  """
  h_v = v.shape[-2]
  qn, kn = prepare_qk(q, k, h_v, scale)
  s = state_pool[read_indices].astype(jnp.float32)
  f32 = jnp.float32
  s, o = recurrent_step(s, qn, kn, v.astype(f32), g.astype(f32), beta.astype(f32))
  pool = state_pool.at[write_indices].set(s.astype(state_pool.dtype))
  return o.astype(v.dtype), pool


@functools.partial(jax.jit, static_argnames=("scale",))
def verify_xla(q, k, v, g, beta, *, state_pool, read_indices, scale):
  """K tokens per sequence: q, k [N, K, H_k, d_k]; v [N, K, H_v, d_v]; g, beta [N, K, H_v].

  Returns ``(o [N, K, H_v, d_v] in v.dtype, states [N, K, H_v, d_k, d_v] fp32)`` where
  ``states[:, i]`` is the state after draft token i.
  """
  h_v = v.shape[-2]
  qn, kn = prepare_qk(q, k, h_v, scale)
  s = state_pool[read_indices].astype(jnp.float32)
  f32 = jnp.float32
  xs = tuple(
    jnp.swapaxes(x, 0, 1) for x in (qn, kn, v.astype(f32), g.astype(f32), beta.astype(f32))
  )

  def step(s, tok):
    s, o = recurrent_step(s, *tok)
    return s, (o, s)

  _, (o, states) = lax.scan(step, s, xs)
  return jnp.swapaxes(o, 0, 1).astype(v.dtype), jnp.swapaxes(states, 0, 1)
