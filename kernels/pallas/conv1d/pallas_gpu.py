"""Pallas (Triton backend) causal depthwise conv1d: packed prefill and slot-pool decode.

Prefill: grid (token blocks of BT, channel blocks of BD) over the packed tokens. For each tap
with lag o the kernel gathers rows t - o; rows that fall before their sequence's start
(position < o) are read instead from the conv state, flattened by XLA to [N*(K-1), D] rows
(row n*(K-1) + K-1 + position - o). Final states and checkpoints are row gathers done in XLA
(``reference.conv_states_and_checkpoints``). Load shapes are powers of two; tails are masked.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from kernels.pallas import packing
from kernels.pallas.conv1d import reference


def _next_pow2(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


def _conv_kernel(
  seq_ref,  # [T] int32
  pos_ref,  # [T] int32
  x_ref,  # [T, D]
  w_ref,  # [K, D] fp32
  b_ref,  # [D] fp32
  st_ref,  # [N*(K-1), D]
  y_ref,  # out [T, D]
  *,
  num_tokens: int,
  width: int,
  taps: int,
  block_t: int,
  block_d: int,
  silu: bool,
):
  t0 = pl.program_id(0) * block_t
  d0 = pl.program_id(1) * block_d
  rows = t0 + lax.broadcasted_iota(jnp.int32, (block_t,), 0)
  cols = d0 + lax.broadcasted_iota(jnp.int32, (block_d,), 0)
  row_ok = rows < num_tokens
  col_ok = cols < width
  rows_c = jnp.minimum(rows, num_tokens - 1)
  seq = pltriton.load(seq_ref.at[rows_c], mask=row_ok, other=0)
  pos = pltriton.load(pos_ref.at[rows_c], mask=row_ok, other=0)
  cols_c = jnp.minimum(cols, width - 1)
  acc = jnp.zeros((block_t, block_d), jnp.float32)
  acc += pltriton.load(b_ref.at[cols_c], mask=col_ok, other=0.0)[None, :]
  k1 = taps - 1
  for j in range(taps):
    lag = k1 - j
    w = pltriton.load(w_ref.at[j, cols_c], mask=col_ok, other=0.0)
    in_x = (pos >= lag) & row_ok
    src = jnp.maximum(rows_c - lag, 0)
    mask_x = in_x[:, None] & col_ok[None, :]
    v = pltriton.load(x_ref.at[src[:, None], cols_c[None, :]], mask=mask_x, other=0.0)
    if lag:
      in_s = (pos < lag) & row_ok
      srow = jnp.clip(seq * k1 + k1 + pos - lag, 0, st_ref.shape[0] - 1)
      mask_s = in_s[:, None] & col_ok[None, :]
      vs = pltriton.load(st_ref.at[srow[:, None], cols_c[None, :]], mask=mask_s, other=0.0)
      v = jnp.where(mask_x, v.astype(jnp.float32), vs.astype(jnp.float32))
    acc += v.astype(jnp.float32) * w[None, :]
  if silu:
    acc = acc * jax.nn.sigmoid(acc)
  pltriton.store(
    y_ref.at[rows[:, None], cols[None, :]],  # unclipped: duplicate masked writes are unsafe
    acc.astype(y_ref.dtype),
    mask=row_ok[:, None] & col_ok[None, :],
  )


def causal_conv1d(
  x,
  weight,
  bias=None,
  *,
  conv_state=None,
  cu_seqlens=None,
  checkpoint_every=None,
  max_checkpoints=None,
  activation="silu",
  block_t=64,
  block_d=128,
  interpret=False,
):
  """Pallas conv prefill; same contract as ``api.causal_conv1d`` (inputs assumed validated)."""
  t_total, d = x.shape
  k = weight.shape[1]
  cu, n_seq, every, m, conv_state = reference.prepare(
    x, weight, conv_state, cu_seqlens, checkpoint_every, max_checkpoints
  )
  if t_total == 0:
    y = jnp.zeros((0, d), x.dtype)
  else:
    seq, pos = packing.token_positions(cu, t_total)
    st_rows = jnp.swapaxes(conv_state, 1, 2).reshape(n_seq * (k - 1), d)
    bt = min(block_t, _next_pow2(t_total))
    bd = min(block_d, _next_pow2(d))
    b32 = jnp.zeros((d,), jnp.float32) if bias is None else bias.astype(jnp.float32)
    kernel = functools.partial(
      _conv_kernel,
      num_tokens=t_total,
      width=d,
      taps=k,
      block_t=bt,
      block_d=bd,
      silu=activation == "silu",
    )
    y = pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((t_total, d), x.dtype),
      grid=(pl.cdiv(t_total, bt), pl.cdiv(d, bd)),
      compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=1),
      interpret=interpret,
      name="causal_conv1d",
    )(seq, pos, x, weight.astype(jnp.float32).T, b32, st_rows)
  final, ck = reference.conv_states_and_checkpoints(x, conv_state, cu, every, m)
  return y, final, ck


def _update_kernel(
  ridx_ref,
  widx_ref,
  x_ref,  # [Nb, D]
  w_ref,  # [K, D] fp32
  b_ref,  # [D] fp32
  pool_in_ref,  # [slots, D, K-1] (aliased with pool_ref)
  y_ref,  # out [Nb, D]
  pool_ref,  # out
  *,
  width: int,
  taps: int,
  block_d: int,
  silu: bool,
):
  i = pl.program_id(0)
  cols = pl.program_id(1) * block_d + lax.broadcasted_iota(jnp.int32, (block_d,), 0)
  ok = cols < width
  cols_c = jnp.minimum(cols, width - 1)  # loads; stores use the unclipped (masked) cols
  r = ridx_ref[i]
  wslot = widx_ref[i]
  window = [pltriton.load(pool_in_ref.at[r, cols_c, j], mask=ok, other=0) for j in range(taps - 1)]
  window.append(pltriton.load(x_ref.at[i, cols_c], mask=ok, other=0))
  acc = pltriton.load(b_ref.at[cols_c], mask=ok, other=0.0)
  for j in range(taps):
    w = pltriton.load(w_ref.at[j, cols_c], mask=ok, other=0.0)
    acc += window[j].astype(jnp.float32) * w
  if silu:
    acc = acc * jax.nn.sigmoid(acc)
  pltriton.store(y_ref.at[i, cols], acc.astype(y_ref.dtype), mask=ok)
  for j in range(taps - 1):
    pltriton.store(pool_ref.at[wslot, cols, j], window[j + 1].astype(pool_ref.dtype), mask=ok)


def causal_conv1d_update(
  x_t,
  weight,
  bias=None,
  *,
  state_pool,
  read_indices,
  write_indices,
  activation="silu",
  block_d=256,
  interpret=False,
):
  """Pallas conv decode step; updates ``state_pool`` in place (aliased). See ``api``."""
  nb, d = x_t.shape
  k = weight.shape[1]
  bd = min(block_d, _next_pow2(d))
  b32 = jnp.zeros((d,), jnp.float32) if bias is None else bias.astype(jnp.float32)
  kernel = functools.partial(_update_kernel, width=d, taps=k, block_d=bd, silu=activation == "silu")
  return pl.pallas_call(
    kernel,
    out_shape=[
      jax.ShapeDtypeStruct((nb, d), x_t.dtype),
      jax.ShapeDtypeStruct(state_pool.shape, state_pool.dtype),
    ],
    grid=(nb, pl.cdiv(d, bd)),
    input_output_aliases={5: 1},
    compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=1),
    interpret=interpret,
    name="causal_conv1d_update",
  )(
    read_indices.astype(jnp.int32),
    write_indices.astype(jnp.int32),
    x_t,
    weight.astype(jnp.float32).T,
    b32,
    state_pool,
  )
