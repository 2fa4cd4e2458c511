"""Public Gated DeltaNet API: chunked prefill, decode and speculative verify.

Every function L2-normalises q and k in fp32, scales q by ``scale`` (default ``d_k**-0.5``)
and maps value head ``h`` to key head ``h // (H_v // H_k)``. Gates (g = log decay <= 0,
beta) and the recurrent state are fp32. ``implementation`` is ``"xla" | "pallas" |
"interpret"`` or None (see ``kernels.pallas.common.resolve_implementation``).
"""

from __future__ import annotations

import jax.numpy as jnp

from kernels.pallas import common
from kernels.pallas import packing
from kernels.pallas import validation
from kernels.pallas.gdn import reference

CHUNK = reference.CHUNK


def _check_qkv(q, k, v, g, beta, lead):
  """Validates q, k [*lead, H_k, d_k], v [*lead, H_v, d_v], g, beta [*lead, H_v]."""
  nl = len(lead)
  for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
    validation.check_float(name, x)
  if q.ndim != nl + 2:
    raise ValueError(f"q has shape {tuple(q.shape)}; expected rank {nl + 2} ({lead} + [H_k, d_k])")
  if v.ndim != nl + 2:
    raise ValueError(f"v has shape {tuple(v.shape)}; expected rank {nl + 2} ({lead} + [H_v, d_v])")
  validation.check_shape("q", q, tuple(lead) + q.shape[nl:])
  validation.check_shape("k", k, q.shape)
  validation.check_shape("v", v, tuple(lead) + v.shape[nl:])
  h_k, h_v = q.shape[-2], v.shape[-2]
  if h_k <= 0 or h_v % h_k:
    raise ValueError(f"v heads H_v={h_v} must be a positive multiple of q heads H_k={h_k}")
  validation.check_shape("g", g, tuple(lead) + (h_v,))
  validation.check_shape("beta", beta, tuple(lead) + (h_v,))


def _check_pallas_dims(impl, d_k, d_v):
  """The Triton backend needs power-of-2 block shapes (kernels.md §6.3)."""
  if impl == "xla":
    return
  for name, d in (("q/k head dim d_k", d_k), ("v head dim d_v", d_v)):
    if not validation.is_pow2(d, 16):
      raise ValueError(
        f"{name}={d} is not supported by implementation={impl!r}: it must be a power of 2 "
        ">= 16; use implementation='xla'"
      )


def _check_pool_and_slots(q, v, state_pool, read_indices, write_indices=None):
  n = q.shape[0]
  inner = (v.shape[-2], q.shape[-1], v.shape[-1])
  validation.check_pool("state_pool", state_pool, inner, jnp.float32)
  validation.check_slot_indices("read_indices", read_indices, n, state_pool.shape[0])
  if write_indices is not None:
    validation.check_slot_indices("write_indices", write_indices, n, state_pool.shape[0])
    validation.check_decode_slots(read_indices, write_indices)


def _default_scale(scale, d_k):
  return d_k**-0.5 if scale is None else float(scale)


def validate_prefill(
  q, k, v, g, beta, initial_state, cu_seqlens, checkpoint_every, max_checkpoints=None
):
  """Validates prefill arguments; returns (int32 cu_seqlens, N, checkpoint slots M)."""
  if q.ndim != 3:
    raise ValueError(f"q has shape {tuple(q.shape)}; expected [T, H_k, d_k]")
  t = q.shape[0]
  _check_qkv(q, k, v, g, beta, (t,))
  h_v, d_v, d_k = v.shape[1], v.shape[2], q.shape[2]
  cu, n = packing.normalize_cu_seqlens(cu_seqlens, t)
  if initial_state is not None:
    validation.check_shape("initial_state", initial_state, (n, h_v, d_k, d_v))
    validation.check_dtype("initial_state", initial_state, jnp.float32)
  _, m = packing.resolve_checkpoints(checkpoint_every, max_checkpoints, t, cu_seqlens, CHUNK)
  return cu, n, m


def chunk_gated_delta_rule(
  q,
  k,
  v,
  g,
  beta,
  *,
  initial_state=None,
  cu_seqlens=None,
  checkpoint_every=None,
  max_checkpoints=None,
  scale=None,
  implementation=None,
):
  """Chunked (C=64) gated delta rule over packed sequences.

  Args:
    q, k: [T, H_k, d_k] un-normalised (L2-normalised here in fp32; q scaled by ``scale``).
    v: [T, H_v, d_v]. g (log decay, <= 0), beta: [T, H_v].
    initial_state: [N, H_v, d_k, d_v] fp32, zeros when None.
    cu_seqlens: int32[N+1] packed sequence offsets (one sequence when None); may be traced.
    checkpoint_every: None or a positive multiple of 64; slot j of sequence n holds the state
      after (j+1)*checkpoint_every tokens of that sequence.
    max_checkpoints: static number of checkpoint slots M. Default: the largest count computed
      on host when ``cu_seqlens`` is concrete (or None), else ``T // checkpoint_every``.
      Checkpoints beyond M are dropped and ``counts`` is clipped to M.
    scale: q multiplier, default ``d_k ** -0.5``.
    implementation: "xla" | "pallas" | "interpret" | None.

  Returns:
    o [T, H_v, d_v] (v.dtype), final_state [N, H_v, d_k, d_v] fp32 and
    checkpoints = (states [N, M, H_v, d_k, d_v] fp32, counts int32[N] =
    min(L_n // checkpoint_every, M)); unused slots are zero; M = 0 when checkpoint_every is None.
  """
  impl = common.resolve_implementation(implementation)
  cu, n, m = validate_prefill(
    q, k, v, g, beta, initial_state, cu_seqlens, checkpoint_every, max_checkpoints
  )
  t, h_v, d_v = v.shape
  d_k = q.shape[-1]
  _check_pallas_dims(impl, d_k, d_v)
  if initial_state is None:
    initial_state = jnp.zeros((n, h_v, d_k, d_v), jnp.float32)
  kwargs = dict(
    initial_state=initial_state,
    cu_seqlens=cu,
    checkpoint_every=None if checkpoint_every is None else int(checkpoint_every),
    max_checkpoints=m,
    scale=_default_scale(scale, d_k),
  )
  if impl == "xla":
    return reference.chunk_gated_delta_rule_xla(q, k, v, g, beta, **kwargs)
  from kernels.pallas.gdn import pallas_gpu  # noqa: PLC0415

  return pallas_gpu.chunk_gated_delta_rule_pallas(
    q, k, v, g, beta, interpret=impl == "interpret", **kwargs
  )


def fused_recurrent_gated_delta_rule_decode(
  q, k, v, g, beta, *, state_pool, read_indices, write_indices, scale=None, implementation=None
):
  """One decode token per sequence against a state pool.

  Args:
    q, k: [N, H_k, d_k]; v: [N, H_v, d_v]; g, beta: [N, H_v].
    state_pool: [S, H_v, d_k, d_v] fp32. read_indices, write_indices: int32[N] slots; the
      state of sequence n is read from ``read_indices[n]`` and the updated state written to
      ``write_indices[n]`` (write slots must be distinct, and must not be read by another
      sequence of the batch: a ValueError when the indices are concrete). The Pallas path
      updates the pool in place (donate it).

  Returns:
    (o [N, H_v, d_v] in v.dtype, new_state_pool).
  """
  impl = common.resolve_implementation(implementation)
  if q.ndim != 3:
    raise ValueError(f"q has shape {tuple(q.shape)}; expected [N, H_k, d_k]")
  n = q.shape[0]
  _check_qkv(q, k, v, g, beta, (n,))
  _check_pool_and_slots(q, v, state_pool, read_indices, write_indices)
  _check_pallas_dims(impl, q.shape[-1], v.shape[-1])
  scale = _default_scale(scale, q.shape[-1])
  read_indices = jnp.asarray(read_indices, jnp.int32)
  write_indices = jnp.asarray(write_indices, jnp.int32)
  if impl == "xla":
    return reference.decode_xla(
      q,
      k,
      v,
      g,
      beta,
      state_pool=state_pool,
      read_indices=read_indices,
      write_indices=write_indices,
      scale=scale,
    )
  from kernels.pallas.gdn import pallas_gpu  # noqa: PLC0415

  return pallas_gpu.decode_pallas(
    q,
    k,
    v,
    g,
    beta,
    state_pool=state_pool,
    read_indices=read_indices,
    write_indices=write_indices,
    scale=scale,
    interpret=impl == "interpret",
  )


def gated_delta_rule_verify(
  q, k, v, g, beta, *, state_pool, read_indices, scale=None, implementation=None
):
  """Multi-token verify (speculative decoding) with the state after every draft token.

  Args:
    q, k: [N, K, H_k, d_k]; v: [N, K, H_v, d_v]; g, beta: [N, K, H_v].
    state_pool: [S, H_v, d_k, d_v] fp32 (read only); read_indices: int32[N].

  Returns:
    (o [N, K, H_v, d_v] in v.dtype, states [N, K, H_v, d_k, d_v] fp32), ``states[:, i]`` =
    state after token i; the caller commits the accepted one.
  """
  impl = common.resolve_implementation(implementation)
  if q.ndim != 4:
    raise ValueError(f"q has shape {tuple(q.shape)}; expected [N, K, H_k, d_k]")
  n, kk = q.shape[:2]
  _check_qkv(q, k, v, g, beta, (n, kk))
  _check_pool_and_slots(q, v, state_pool, read_indices)
  _check_pallas_dims(impl, q.shape[-1], v.shape[-1])
  scale = _default_scale(scale, q.shape[-1])
  read_indices = jnp.asarray(read_indices, jnp.int32)
  if impl == "xla":
    return reference.verify_xla(
      q, k, v, g, beta, state_pool=state_pool, read_indices=read_indices, scale=scale
    )
  from kernels.pallas.gdn import pallas_gpu  # noqa: PLC0415

  return pallas_gpu.verify_pallas(
    q,
    k,
    v,
    g,
    beta,
    state_pool=state_pool,
    read_indices=read_indices,
    scale=scale,
    interpret=impl == "interpret",
  )
