"""The causal depthwise conv of a recurrent layer (GDN, Mamba2) over gathered conv states.

One call site for both layers: a decode step (every sequence has one token, T == N) runs the
stateful update kernel; otherwise the chunked kernel runs over the packed sequences and emits
the conv states at this step's checkpoint boundaries. A speculative verify step (`verify_conv`)
runs the chunked kernel over N windows of S tokens and returns the conv window after every
token, so the caller can keep the one of the accepted position (the window shifted by the
accepted count).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.pallas.conv1d import api as conv_api
from models import decode_split
from models import state_pool


def causal_conv(
  x: jax.Array,
  weight: jax.Array,
  bias: jax.Array | None,
  conv0: jax.Array,
  *,
  decode: bool,
  query_start_loc: jax.Array,
  ckpt_kw: dict,
  implementation: str | None,
  num_decodes: int = 0,
) -> tuple[jax.Array, tuple[jax.Array, tuple[jax.Array | None, jax.Array | None]]]:
  """x [T, C], conv0 [N, C, K-1] (the sequences' states). Returns (y [T, C], conv_out).

  `conv_out` = (final states [N, C, K-1], (checkpoints, counts)) as `state_pool.write_recurrent`
  takes it; a decode step has no checkpoints (None, None). With `num_decodes` = D > 0 (a mixed
  step, `decode_split`), sequences [0, D) run the update kernel and the checkpoints are those
  of sequences D.. (written with `ckpt_write[D:]`).
  """

  def update(x, conv0):
    ids = state_pool.slot_ids(x.shape[0])
    return conv_api.causal_conv1d_update(
      x,
      weight,
      bias,
      state_pool=conv0,
      read_indices=ids,
      write_indices=ids,
      activation="silu",
      implementation=implementation,
    )

  def chunked(x, conv0, cu_seqlens):
    return conv_api.causal_conv1d(
      x,
      weight,
      bias,
      conv_state=conv0,
      cu_seqlens=cu_seqlens,
      **ckpt_kw,
      activation="silu",
      implementation=implementation,
    )

  return decode_split.run_recurrence(
    decode, num_decodes, query_start_loc, [x], [conv0], update, chunked
  )


def verify_conv(
  x: jax.Array,
  weight: jax.Array,
  bias: jax.Array | None,
  conv0: jax.Array,
  *,
  window: int,
  implementation: str | None,
) -> tuple[jax.Array, jax.Array]:
  """x [N*S, C] (N windows of S = `window` tokens), conv0 [N, C, K-1]. Pools are not touched.

  Returns (y [N*S, C], windows [N, S, C, K-1]) where windows[n, i] is the conv state after
  token i of window n: the last K-1 pre-conv inputs of [conv0[n] ; x[n, :i+1]] (kernels.md
  §1.5), i.e. conv0 shifted left by i+1 rows.
  """
  n, c, km1 = conv0.shape
  cu = jnp.arange(n + 1, dtype=jnp.int32) * window
  y, _, _ = conv_api.causal_conv1d(
    x,
    weight,
    bias,
    conv_state=conv0,
    cu_seqlens=cu,
    activation="silu",
    implementation=implementation,
  )
  full = jnp.concatenate(
    [conv0, jnp.swapaxes(x.reshape(n, window, c), 1, 2).astype(conv0.dtype)], axis=-1
  )  # [N, C, K-1+S]
  idx = jnp.arange(window)[:, None] + 1 + jnp.arange(km1)[None, :]  # [S, K-1]
  windows = jnp.moveaxis(full[:, :, idx], 2, 1)  # [N, S, C, K-1]
  return y, windows
