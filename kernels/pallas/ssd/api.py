"""Public Mamba2 (SSD) ops: chunked prefill with checkpoints, decode, multi-token verify.

``implementation``: None (Pallas on GPU, else XLA), ``"xla"`` (pure-JAX chunked reference),
``"pallas"`` (compiled Pallas, Triton backend) or ``"interpret"`` (the Pallas kernel under
``interpret=True``, for CPU tests). See ``reference.py`` for the recurrence.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.pallas import common
from kernels.pallas import packing
from kernels.pallas import validation
from kernels.pallas.ssd import pallas_gpu
from kernels.pallas.ssd import reference


def _validate_common(x, dt, A, B, C, D, dt_bias, lead: tuple[int, ...]):
  """Checks x [*lead, H, P], dt [*lead, H], A [H], B/C [*lead, G, N], D/dt_bias [H] (float)."""
  nl = len(lead)
  for name, v in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D)):
    validation.check_float(name, v)
  validation.check_float("dt_bias", dt_bias)
  if x.ndim != nl + 2:
    raise ValueError(f"x must have rank {nl + 2} [..., H, P], got shape {tuple(x.shape)}")
  h, p = x.shape[nl:]
  validation.check_shape("dt", dt, lead + (h,))
  validation.check_shape("A", A, (h,))
  if B.ndim != nl + 2 or B.shape[:nl] != lead:
    validation.check_shape("B", B, lead + ("G", "N"))
  validation.check_shape("C", C, B.shape)
  g, n = B.shape[nl:]
  if g < 1 or h % g:
    raise ValueError(f"B/C groups G={g} must divide the number of heads H={h}")
  for name, v in (("D", D), ("dt_bias", dt_bias)):
    if v is not None:
      validation.check_shape(name, v, (h,))
  return h, p, g, n


def chunk_scan(
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
  implementation=None,
):
  """Chunked Mamba2 SSD prefill over packed sequences, with state checkpoints.

  Args:
    x: [T, H, P] inputs (bf16 or fp32), P = head dim; tokens of all sequences packed.
    dt: [T, H] raw time steps; processed in fp32 as softplus(dt + dt_bias) (see dt_softplus).
    A: [H] fp32, negative (A = -exp(A_log)).
    B: [T, G, N] input projections; head h uses group h // (H // G).
    C: [T, G, N] output projections.
    D: optional [H] skip weight (y += D * x).
    dt_bias: optional [H] added to dt before softplus.
    dt_softplus: apply softplus to dt + dt_bias.
    initial_state: optional [N_seq, H, P, N] fp32 state entering each sequence (zeros when
      None).
    cu_seqlens: optional int32 [N_seq + 1] sequence boundaries (cu[0]=0, cu[-1]=T); None means
      one sequence. May be traced under jit.
    checkpoint_every: None or a positive multiple of chunk_size: also return the state after
      every checkpoint_every tokens of each sequence.
    max_checkpoints: static slots M per sequence. Default: the largest L_n // checkpoint_every
      when cu_seqlens is concrete (or None), else T // checkpoint_every. Checkpoints beyond M
      are dropped and counts is clipped to M (same convention as the GDN kernels).
    chunk_size: tokens per chunk (power of two >= 16 for the Pallas path).
    implementation: None | "xla" | "pallas" | "interpret".

  Returns:
    (y [T, H, P] in x.dtype, final_state [N_seq, H, P, N] fp32,
     (states [N_seq, M, H, P, N] fp32, counts int32 [N_seq])): states[n, j] is the state after
    (j+1)*checkpoint_every tokens of sequence n, counts[n] = min(L_n // checkpoint_every, M), unused
    slots are zero (M = 0 when checkpoint_every is None).

  Raises:
    ValueError: bad shapes, chunk_size, checkpoint arguments, cu_seqlens or implementation.
  """
  impl = common.resolve_implementation(implementation)
  if x.ndim != 3:
    raise ValueError(f"x must have shape [T, H, P], got {tuple(x.shape)}")
  t_total = x.shape[0]
  h, p, _, n = _validate_common(x, dt, A, B, C, D, dt_bias, (t_total,))
  if not isinstance(chunk_size, int) or chunk_size < 1:
    raise ValueError(f"chunk_size={chunk_size!r} must be a positive int")
  if impl != "xla" and not validation.is_pow2(chunk_size, 16):
    raise ValueError(f"chunk_size={chunk_size} must be a power of two >= 16 for Pallas")
  _, n_seq = packing.normalize_cu_seqlens(cu_seqlens, t_total)
  packing.resolve_checkpoints(checkpoint_every, max_checkpoints, t_total, cu_seqlens, chunk_size)
  if initial_state is not None:
    validation.check_shape("initial_state", initial_state, (n_seq, h, p, n))
    validation.check_dtype("initial_state", initial_state, jnp.float32)
  kwargs = dict(
    D=D,
    dt_bias=dt_bias,
    dt_softplus=dt_softplus,
    initial_state=initial_state,
    cu_seqlens=cu_seqlens,
    checkpoint_every=checkpoint_every,
    max_checkpoints=max_checkpoints,
    chunk_size=chunk_size,
  )
  if impl == "xla":
    return reference.ssd_chunked(x, dt, A, B, C, **kwargs)
  return pallas_gpu.ssd_chunk_scan(x, dt, A, B, C, interpret=impl == "interpret", **kwargs)


def _validate_pool(state_pool, h, p, n, read_indices, write_indices, batch):
  validation.check_pool("state_pool", state_pool, (h, p, n), jnp.float32)
  validation.check_slot_indices("read_indices", read_indices, batch, state_pool.shape[0])
  if write_indices is not None:
    validation.check_slot_indices("write_indices", write_indices, batch, state_pool.shape[0])
    validation.check_decode_slots(read_indices, write_indices)


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
  implementation=None,
):
  """One decode token per sequence, reading and writing states in a slot pool.

  Args:
    x: [Nb, H, P]; dt: [Nb, H]; A: [H]; B, C: [Nb, G, N]; D, dt_bias: optional [H].
    state_pool: [slots, H, P, N] fp32; donate it under jit for an in-place update.
    read_indices: int32 [Nb] slot holding each sequence's state before the token.
    write_indices: int32 [Nb] slot receiving the state after the token (may equal the read
      slot of the same sequence; must not equal another sequence's read or write slot: a
      ValueError when the indices are concrete).

  Returns:
    (y [Nb, H, P] in x.dtype, new_pool [slots, H, P, N] fp32).
  """
  impl = common.resolve_implementation(implementation)
  if x.ndim != 3:
    raise ValueError(f"x must have shape [Nb, H, P], got {tuple(x.shape)}")
  nb = x.shape[0]
  h, p, _, n = _validate_common(x, dt, A, B, C, D, dt_bias, (nb,))
  _validate_pool(state_pool, h, p, n, read_indices, write_indices, nb)
  if impl == "xla":
    dtp = reference.process_dt(dt, dt_bias, dt_softplus)
    f32 = lambda a: None if a is None else a.astype(jnp.float32)
    state = state_pool[read_indices].astype(jnp.float32)
    y, new = reference.ssd_step(state, f32(x), dtp, f32(A), f32(B), f32(C), f32(D))
    pool = state_pool.at[write_indices].set(new.astype(state_pool.dtype))
    return y.astype(x.dtype), pool
  return pallas_gpu.ssd_decode(
    x,
    dt,
    A,
    B,
    C,
    D=D,
    dt_bias=dt_bias,
    dt_softplus=dt_softplus,
    state_pool=state_pool,
    read_indices=read_indices,
    write_indices=write_indices,
    interpret=impl == "interpret",
  )


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
  implementation=None,
):
  """Multi-token step (speculative verify): S tokens per sequence, all per-token states out.

  Args:
    x: [Nb, S, H, P]; dt: [Nb, S, H]; B, C: [Nb, S, G, N]; A, D, dt_bias: [H].
    state_pool: [slots, H, P, N] fp32 (read only); read_indices: int32 [Nb].

  Returns:
    (y [Nb, S, H, P] in x.dtype, states [Nb, S, H, P, N] fp32 where states[:, i] is the state
     after token i; the caller commits the accepted one into the pool).
  """
  impl = common.resolve_implementation(implementation)
  if x.ndim != 4:
    raise ValueError(f"x must have shape [Nb, S, H, P], got {tuple(x.shape)}")
  nb, s = x.shape[:2]
  h, p, _, n = _validate_common(x, dt, A, B, C, D, dt_bias, (nb, s))
  _validate_pool(state_pool, h, p, n, read_indices, None, nb)
  if impl == "xla":
    return _verify_xla(x, dt, A, B, C, D, dt_bias, dt_softplus, state_pool, read_indices)
  return pallas_gpu.ssd_verify(
    x,
    dt,
    A,
    B,
    C,
    D=D,
    dt_bias=dt_bias,
    dt_softplus=dt_softplus,
    state_pool=state_pool,
    read_indices=read_indices,
    interpret=impl == "interpret",
  )


def _verify_xla(x, dt, A, B, C, D, dt_bias, dt_softplus, state_pool, read_indices):
  f32 = lambda a: None if a is None else a.astype(jnp.float32)
  dtp = reference.process_dt(dt, dt_bias, dt_softplus)
  state = state_pool[read_indices].astype(jnp.float32)

  def step(st, inp):
    xt, dtt, bt, ct = inp
    y, st = reference.ssd_step(st, xt, dtt, f32(A), bt, ct, f32(D))
    return st, (y, st)

  sw = lambda a: jnp.swapaxes(a, 0, 1)
  _, (y, states) = jax.lax.scan(step, state, (sw(f32(x)), sw(dtp), sw(f32(B)), sw(f32(C))))
  return sw(y).astype(x.dtype), sw(states)
