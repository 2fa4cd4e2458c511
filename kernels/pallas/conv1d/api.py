"""Public causal depthwise conv1d ops (Mamba2 / GDN short conv) with conv state.

``implementation``: None (Pallas on GPU, else XLA), ``"xla"``, ``"pallas"`` or ``"interpret"``.
State semantics (kernels.md §1.5): the conv state after p tokens is the last K-1 *inputs*
(pre-conv, pre-activation) [x_{p-K+1}, ..., x_{p-1}], laid out [D, K-1] oldest first.
"""

from __future__ import annotations

from kernels.pallas import common
from kernels.pallas import packing
from kernels.pallas import validation
from kernels.pallas.conv1d import pallas_gpu
from kernels.pallas.conv1d import reference


def _validate(x, weight, bias, activation):
  """Checks x [T, D] (or [Nb, D]), weight [D, K >= 2], bias [D] (all float), activation."""
  for name, v in (("x", x), ("weight", weight), ("bias", bias)):
    validation.check_float(name, v)
  if x.ndim != 2:
    raise ValueError(f"x must have shape [T, D], got {tuple(x.shape)}")
  d = x.shape[1]
  if weight.ndim != 2 or weight.shape[0] != d or weight.shape[1] < 2:
    raise ValueError(f"weight has shape {tuple(weight.shape)}; expected [{d}, K] with K >= 2")
  if bias is not None:
    validation.check_shape("bias", bias, (d,))
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
  if conv_state is not None:
    validation.check_shape("conv_state", conv_state, (n_seq, d, k - 1))
    validation.check_float("conv_state", conv_state)
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
      sequences; a sequence may read and write the same slot; a ValueError when concrete
      indices break this).

  Returns:
    (y [Nb, D] in x_t.dtype, new_pool) where the window [state ; x_t] drops its oldest row.
  """
  impl = common.resolve_implementation(implementation)
  d, k = _validate(x_t, weight, bias, activation)
  nb = x_t.shape[0]
  validation.check_pool("state_pool", state_pool, (d, k - 1))
  validation.check_float("state_pool", state_pool)
  validation.check_slot_indices("read_indices", read_indices, nb, state_pool.shape[0])
  validation.check_slot_indices("write_indices", write_indices, nb, state_pool.shape[0])
  validation.check_decode_slots(read_indices, write_indices)
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
