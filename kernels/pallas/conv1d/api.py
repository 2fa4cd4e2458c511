"""Public causal depthwise conv1d ops (Mamba2 / GDN short conv) with conv state.

``implementation``: None (Pallas on GPU, else XLA), ``"xla"``, ``"pallas"`` or ``"interpret"``.
State semantics (kernels.md §1.5): the conv state after p tokens is the last K-1 *inputs*
(pre-conv, pre-activation) [x_{p-K+1}, ..., x_{p-1}], laid out [D, K-1] oldest first.
"""

from __future__ import annotations

import jax.numpy as jnp

from kernels.pallas import common
from kernels.pallas import packing
from kernels.pallas.conv1d import pallas_gpu
from kernels.pallas.conv1d import reference


def _validate(x, weight, bias, activation):
  if x.ndim != 2:
    raise ValueError(f"x must have shape [T, D], got {tuple(x.shape)}")
  d = x.shape[1]
  if weight.ndim != 2 or weight.shape[0] != d or weight.shape[1] < 2:
    raise ValueError(f"weight has shape {tuple(weight.shape)}; expected [{d}, K] with K >= 2")
  if bias is not None and bias.shape != (d,):
    raise ValueError(f"bias has shape {tuple(bias.shape)}; expected ({d},)")
  if activation not in reference.ACTIVATIONS:
    raise ValueError(f"activation={activation!r} not in {reference.ACTIVATIONS}")
  return d, weight.shape[1]


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
  implementation=None,
):
  """Causal depthwise conv1d over packed sequences, with state in and states out.

  Args:
    x: [T, D] packed inputs (bf16 or fp32).
    weight: [D, K] depthwise taps; weight[:, K-1] multiplies the current token.
    bias: optional [D].
    conv_state: optional [N, D, K-1], the K-1 inputs preceding each sequence (oldest first);
      zeros when None.
    cu_seqlens: optional int32 [N+1] boundaries (None: one sequence); may be traced.
    checkpoint_every: None or positive int: also return the conv state after every
      checkpoint_every tokens of each sequence (same boundaries as the SSD/GDN scans).
    max_checkpoints: static slots M per sequence. Default: the largest L_n // checkpoint_every
      when cu_seqlens is concrete (or None), else T // checkpoint_every. Checkpoints beyond M
      are dropped and counts is clipped to M (same convention as the GDN kernels).
    activation: "silu" or None.
    implementation: None | "xla" | "pallas" | "interpret".

  Returns:
    (y [T, D] in x.dtype, final_conv_state [N, D, K-1] in x.dtype,
     (conv_checkpoints [N, M, D, K-1] in x.dtype, counts int32 [N] = min(L_n // every, M)));
     unused slots are zero.

  Raises:
    ValueError: bad shapes, activation, checkpoint arguments, cu_seqlens or implementation.
  """
  impl = common.resolve_implementation(implementation)
  d, k = _validate(x, weight, bias, activation)
  t_total = x.shape[0]
  _, n_seq = packing.normalize_cu_seqlens(cu_seqlens, t_total)
  packing.resolve_checkpoints(checkpoint_every, max_checkpoints, t_total, cu_seqlens, None)
  if conv_state is not None and conv_state.shape != (n_seq, d, k - 1):
    raise ValueError(
      f"conv_state has shape {tuple(conv_state.shape)}; expected {(n_seq, d, k - 1)}"
    )
  kwargs = dict(
    conv_state=conv_state,
    cu_seqlens=cu_seqlens,
    checkpoint_every=checkpoint_every,
    max_checkpoints=max_checkpoints,
    activation=activation,
  )
  if impl == "xla":
    return reference.conv_xla(x, weight, bias, **kwargs)
  return pallas_gpu.causal_conv1d(x, weight, bias, interpret=impl == "interpret", **kwargs)


def causal_conv1d_update(
  x_t,
  weight,
  bias=None,
  *,
  state_pool,
  read_indices,
  write_indices,
  activation="silu",
  implementation=None,
):
  """One decode token per sequence with conv states in a slot pool.

  Args:
    x_t: [Nb, D]; weight: [D, K]; bias: optional [D].
    state_pool: [slots, D, K-1]; donate it under jit for an in-place update.
    read_indices, write_indices: int32 [Nb] source / destination slots (distinct across
      sequences; a sequence may read and write the same slot).

  Returns:
    (y [Nb, D] in x_t.dtype, new_pool) where the window [state ; x_t] drops its oldest row.
  """
  impl = common.resolve_implementation(implementation)
  d, k = _validate(x_t, weight, bias, activation)
  nb = x_t.shape[0]
  if state_pool.ndim != 3 or state_pool.shape[1:] != (d, k - 1):
    raise ValueError(
      f"state_pool has shape {tuple(state_pool.shape)}; expected [slots, {d}, {k - 1}]"
    )
  for name, idx in (("read_indices", read_indices), ("write_indices", write_indices)):
    if idx.shape != (nb,):
      raise ValueError(f"{name} has shape {tuple(idx.shape)}; expected ({nb},)")
    if not jnp.issubdtype(idx.dtype, jnp.integer):
      raise ValueError(f"{name} has dtype {idx.dtype}; expected an integer dtype")
    if packing.is_concrete(idx):
      lo, hi = int(jnp.min(idx)), int(jnp.max(idx))
      if lo < 0 or hi >= state_pool.shape[0]:
        raise ValueError(
          f"{name} values in [{lo}, {hi}] out of range [0, {state_pool.shape[0] - 1}]"
        )
  if impl == "xla":
    y, new = reference.conv_update_xla(x_t, weight, bias, state_pool[read_indices], activation)
    return y, state_pool.at[write_indices].set(new.astype(state_pool.dtype))
  return pallas_gpu.causal_conv1d_update(
    x_t,
    weight,
    bias,
    state_pool=state_pool,
    read_indices=read_indices,
    write_indices=write_indices,
    activation=activation,
    interpret=impl == "interpret",
  )
