"""The causal depthwise conv of a recurrent layer (GDN, Mamba2) over gathered conv states.

One call site for both layers: a decode step (every sequence has one token, T == N) runs the
stateful update kernel; otherwise the chunked kernel runs over the packed sequences and emits
the conv states at this step's checkpoint boundaries.
"""

from __future__ import annotations

import jax

from kernels.pallas.conv1d import api as conv_api
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
) -> tuple[jax.Array, tuple[jax.Array, tuple[jax.Array | None, jax.Array | None]]]:
  """x [T, C], conv0 [N, C, K-1] (the sequences' states). Returns (y [T, C], conv_out).

  `conv_out` = (final states [N, C, K-1], (checkpoints, counts)) as `state_pool.write_recurrent`
  takes it; a decode step has no checkpoints (None, None).
  """
  if decode:
    ids = state_pool.slot_ids(x.shape[0])
    y, final = conv_api.causal_conv1d_update(
      x,
      weight,
      bias,
      state_pool=conv0,
      read_indices=ids,
      write_indices=ids,
      activation="silu",
      implementation=implementation,
    )
    return y, (final, (None, None))
  y, final, ckpts = conv_api.causal_conv1d(
    x,
    weight,
    bias,
    conv_state=conv0,
    cu_seqlens=query_start_loc,
    **ckpt_kw,
    activation="silu",
    implementation=implementation,
  )
  return y, (final, ckpts)
