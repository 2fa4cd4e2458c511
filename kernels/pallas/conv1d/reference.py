"""Pure-JAX causal depthwise conv1d with state: token oracle and vectorised (the "xla" path).

For a sequence with pre-sequence inputs x_{-K+1..-1} (the conv state, zeros when absent):

  y_t[d] = act( bias[d] + sum_{j=0..K-1} weight[d, j] * x_{t-K+1+j}[d] )

The conv state after p tokens is [x_{p-K+1}, ..., x_{p-1}] laid out [D, K-1] (oldest first),
i.e. the last K-1 rows of concat(state rows, x). Math in fp32; y in x.dtype; states in x.dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from kernels.pallas import packing

ACTIVATIONS = ("silu", None)


def apply_activation(y: jax.Array, activation) -> jax.Array:
  return jax.nn.silu(y) if activation == "silu" else y


def conv_oracle(
  x,
  weight,
  bias=None,
  *,
  conv_state=None,
  cu_seqlens=None,
  checkpoint_every=None,
  max_checkpoints=None,
  activation="silu",
):
  """Token-by-token oracle (one ``lax.scan`` over the packed tokens, the window reset to the
  sequence's conv state at each sequence start). Needs a concrete ``cu_seqlens``.

  Returns (y [T, D] fp32, final_state [N, D, K-1], (checkpoints [N, M, D, K-1], counts [N])).
  """
  t_total, d = x.shape
  k = weight.shape[1]
  cu = np.asarray([0, t_total] if cu_seqlens is None else cu_seqlens)
  n_seq = len(cu) - 1
  every = checkpoint_every or 0
  _, m = packing.resolve_checkpoints(every or None, max_checkpoints, t_total, cu, None)
  if conv_state is None:
    conv_state = jnp.zeros((n_seq, d, k - 1), x.dtype)
  conv_state = conv_state.astype(x.dtype)
  b = jnp.zeros((d,), jnp.float32) if bias is None else bias.astype(jnp.float32)
  seq = np.searchsorted(cu[1:], np.arange(t_total), side="right")
  is_start = np.zeros((t_total,), bool)
  is_start[cu[:-1][cu[:-1] < cu[1:]]] = True
  y, per_tok = _oracle_scan(
    x, weight.astype(jnp.float32), b, conv_state, jnp.asarray(seq), is_start, activation
  )
  finals = []
  ckpts = np.zeros((n_seq, m, d, k - 1), np.float32)
  counts = np.zeros((n_seq,), np.int32)
  for n in range(n_seq):
    lo, hi = int(cu[n]), int(cu[n + 1])
    finals.append(per_tok[hi - 1] if hi > lo else conv_state[n])
    if every:
      counts[n] = min((hi - lo) // every, m)
      for j in range(counts[n]):
        ckpts[n, j] = np.asarray(per_tok[lo + (j + 1) * every - 1].astype(jnp.float32))
  return y, jnp.stack(finals), (jnp.asarray(ckpts).astype(x.dtype), jnp.asarray(counts))


@functools.partial(jax.jit, static_argnames="activation")
def _oracle_scan(x, w, b, conv_state, seq, is_start, activation):
  def step(window, inp):
    xt, sq, start = inp
    window = jnp.where(start, conv_state[sq], window)  # [D, K-1]
    full = jnp.concatenate([window, xt[:, None]], axis=1)  # [D, K]
    y = apply_activation(jnp.sum(full.astype(jnp.float32) * w, axis=1) + b, activation)
    return full[:, 1:], (y, full[:, 1:])

  _, (y, per_tok) = jax.lax.scan(step, conv_state[0] * 0, (x, seq, is_start))
  return y, per_tok


def extended_rows(x, conv_state, cu, seq, pos):
  """Value of input position ``pos`` (may be negative, >= -(K-1)) of sequence ``seq``.

  seq, pos: int32 arrays of equal shape S. Returns [*S, D] in x.dtype.
  """
  k1 = conv_state.shape[-1]
  tok = jnp.clip(cu[seq] + pos, 0, max(x.shape[0] - 1, 0))
  from_x = jnp.take(x, tok, axis=0, mode="fill", fill_value=0)
  col = jnp.clip(k1 + pos, 0, k1 - 1)
  from_state = conv_state[seq, :, col].astype(x.dtype)  # [*S, D]
  return jnp.where((pos >= 0)[..., None], from_x, from_state)


def states_at(x, conv_state, cu, seq, boundary):
  """Conv states after ``boundary`` tokens of ``seq`` (int32 arrays, shape S) -> [*S, D, K-1]."""
  k1 = conv_state.shape[-1]
  offs = jnp.arange(-k1, 0, dtype=jnp.int32)
  rows = extended_rows(
    x, conv_state, cu, seq[..., None] + 0 * offs, boundary[..., None] + offs
  )  # [*S, K-1, D]
  return jnp.swapaxes(rows, -1, -2)


def conv_states_and_checkpoints(x, conv_state, cu, every: int, m: int):
  """(final_state [N, D, K-1], (checkpoints [N, M, D, K-1], counts [N])) in x.dtype."""
  n_seq = cu.shape[0] - 1
  lengths = cu[1:] - cu[:-1]
  seqs = jnp.arange(n_seq, dtype=jnp.int32)
  final = states_at(x, conv_state, cu, seqs, lengths)
  d, k1 = conv_state.shape[1:]
  if not every:
    return final, (jnp.zeros((n_seq, 0, d, k1), x.dtype), jnp.zeros((n_seq,), jnp.int32))
  counts = jnp.minimum(lengths // every, m).astype(jnp.int32)
  j = jnp.arange(m, dtype=jnp.int32)
  bnd = (j[None, :] + 1) * every + 0 * seqs[:, None]
  ck = states_at(x, conv_state, cu, seqs[:, None] + 0 * j[None, :], bnd)
  ok = (j[None, :] < counts[:, None])[..., None, None]
  return final, (jnp.where(ok, ck, 0).astype(x.dtype), counts)


def prepare(x, weight, conv_state, cu_seqlens, checkpoint_every, max_checkpoints):
  """Host-side setup shared by the XLA and Pallas prefills.

  Returns (int32 cu [N+1], N, every (0: none), M, conv_state [N, D, K-1] in x.dtype, zeros
  when None).
  """
  t_total, d = x.shape
  cu, n_seq = packing.normalize_cu_seqlens(cu_seqlens, t_total)
  every, m = packing.resolve_checkpoints(
    checkpoint_every, max_checkpoints, t_total, cu_seqlens, None
  )
  if conv_state is None:
    conv_state = jnp.zeros((n_seq, d, weight.shape[1] - 1), x.dtype)
  return cu, n_seq, every, m, conv_state.astype(x.dtype)


def conv_xla(
  x,
  weight,
  bias=None,
  *,
  conv_state=None,
  cu_seqlens=None,
  checkpoint_every=None,
  max_checkpoints=None,
  activation="silu",
):
  """Vectorised conv over packed tokens (jittable, traced ``cu_seqlens`` allowed).

  Same contract as ``api.causal_conv1d`` (inputs assumed validated).
  """
  t_total, d = x.shape
  k = weight.shape[1]
  cu, n_seq, every, m, conv_state = prepare(
    x, weight, conv_state, cu_seqlens, checkpoint_every, max_checkpoints
  )
  seq, pos = packing.token_positions(cu, t_total)
  w = weight.astype(jnp.float32)
  acc = jnp.zeros((t_total, d), jnp.float32)
  if bias is not None:
    acc = acc + bias.astype(jnp.float32)
  for j in range(k):
    lag = k - 1 - j
    rows = extended_rows(x, conv_state, cu, seq, pos - lag)
    acc = acc + rows.astype(jnp.float32) * w[:, j]
  y = apply_activation(acc, activation).astype(x.dtype)
  final, ck = conv_states_and_checkpoints(x, conv_state, cu, every, m)
  return y, final, ck


def conv_update_xla(x_t, weight, bias, state, activation):
  """One decode token per sequence: x_t [B, D], state [B, D, K-1] -> (y [B, D], new_state)."""
  window = jnp.concatenate([state.astype(x_t.dtype), x_t[:, :, None]], axis=2)  # [B, D, K]
  acc = jnp.sum(window.astype(jnp.float32) * weight.astype(jnp.float32), axis=2)
  if bias is not None:
    acc = acc + bias.astype(jnp.float32)
  return apply_activation(acc, activation).astype(x_t.dtype), window[:, :, 1:]
