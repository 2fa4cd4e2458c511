"""Public Gated DeltaNet API: chunked prefill, decode and speculative verify.

Every function L2-normalises q and k in fp32, scales q by ``scale`` (default ``d_k**-0.5``)
and maps value head ``h`` to key head ``h // (H_v // H_k)``. Gates (g = log decay <= 0,
beta) and the recurrent state are fp32. ``implementation`` is ``"xla" | "pallas" |
"interpret"`` or None (see ``kernels.pallas.common.resolve_implementation``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kernels.pallas import common
from kernels.pallas.gdn import reference

CHUNK = reference.CHUNK
_FLOATS = (jnp.float32, jnp.bfloat16, jnp.float16)


def _is_concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


def _check_float(name, x):
  if x.dtype not in _FLOATS:
    raise ValueError(f"{name} has dtype {x.dtype}; allowed: float32, bfloat16, float16")


def _check_shape(name, x, expected):
  if tuple(x.shape) != tuple(expected):
    raise ValueError(f"{name} has shape {tuple(x.shape)}; expected {tuple(expected)}")


def _check_heads(name_q, name_v, h_k, h_v):
  if h_k <= 0 or h_v % h_k:
    raise ValueError(
      f"{name_v} heads H_v={h_v} must be a positive multiple of {name_q} heads H_k={h_k}"
    )


def _check_qkv(q, k, v, g, beta, lead):
  """Validates q, k [*lead, H_k, d_k], v [*lead, H_v, d_v], g, beta [*lead, H_v]."""
  nl = len(lead)
  for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
    _check_float(name, x)
  if q.ndim != nl + 2:
    raise ValueError(f"q has shape {tuple(q.shape)}; expected rank {nl + 2} ({lead} + [H_k, d_k])")
  if v.ndim != nl + 2:
    raise ValueError(f"v has shape {tuple(v.shape)}; expected rank {nl + 2} ({lead} + [H_v, d_v])")
  _check_shape("q", q, tuple(lead) + q.shape[nl:])
  _check_shape("k", k, q.shape)
  _check_shape("v", v, tuple(lead) + v.shape[nl:])
  h_k, h_v = q.shape[-2], v.shape[-2]
  _check_heads("q", "v", h_k, h_v)
  _check_shape("g", g, tuple(lead) + (h_v,))
  _check_shape("beta", beta, tuple(lead) + (h_v,))


def _check_indices(name, idx, n, num_slots):
  idx = jnp.asarray(idx)
  if idx.ndim != 1 or idx.shape[0] != n:
    raise ValueError(f"{name} has shape {tuple(idx.shape)}; expected ({n},)")
  if not jnp.issubdtype(idx.dtype, jnp.integer):
    raise ValueError(f"{name} has dtype {idx.dtype}; expected an integer dtype")
  if _is_concrete(idx) and n:
    a = np.asarray(idx)
    if a.min() < 0 or a.max() >= num_slots:
      raise ValueError(
        f"{name} has values in [{a.min()}, {a.max()}]; allowed range [0, {num_slots - 1}]"
      )


def _check_pool(state_pool, h_v, d_k, d_v):
  if state_pool.ndim != 4 or tuple(state_pool.shape[1:]) != (h_v, d_k, d_v):
    raise ValueError(
      f"state_pool has shape {tuple(state_pool.shape)}; expected (num_slots, {h_v}, {d_k}, {d_v})"
    )
  if state_pool.dtype != jnp.float32:
    raise ValueError(f"state_pool has dtype {state_pool.dtype}; expected float32")


def _check_pallas_dims(impl, d_k, d_v):
  """The Triton backend needs power-of-2 block shapes (kernels.md §6.3)."""
  if impl == "xla":
    return
  for name, d in (("q/k head dim d_k", d_k), ("v head dim d_v", d_v)):
    if d < 16 or d & (d - 1):
      raise ValueError(
        f"{name}={d} is not supported by implementation={impl!r}: it must be a power of 2 "
        ">= 16; use implementation='xla'"
      )


def _default_scale(scale, d_k):
  return d_k**-0.5 if scale is None else float(scale)


def resolve_max_checkpoints(
  num_tokens: int, cu_seqlens, checkpoint_every: int | None, max_checkpoints: int | None
) -> int:
  """Static checkpoint slot count M (see ``chunk_gated_delta_rule``)."""
  if checkpoint_every is None:
    return 0
  if max_checkpoints is not None:
    if int(max_checkpoints) < 0:
      raise ValueError(f"max_checkpoints={max_checkpoints} must be >= 0")
    return int(max_checkpoints)
  if cu_seqlens is None:
    return num_tokens // checkpoint_every
  if _is_concrete(cu_seqlens):
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    return int(np.max(np.diff(cu) // checkpoint_every, initial=0))
  return num_tokens // checkpoint_every


def validate_prefill(q, k, v, g, beta, initial_state, cu_seqlens, checkpoint_every):
  """Validates prefill arguments; returns the (possibly defaulted) cu_seqlens and N."""
  if q.ndim != 3:
    raise ValueError(f"q has shape {tuple(q.shape)}; expected [T, H_k, d_k]")
  t = q.shape[0]
  _check_qkv(q, k, v, g, beta, (t,))
  h_v, d_v, d_k = v.shape[1], v.shape[2], q.shape[2]
  if cu_seqlens is None:
    cu_seqlens = jnp.asarray([0, t], jnp.int32)
  else:
    cu_seqlens = jnp.asarray(cu_seqlens)
    if cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 2:
      raise ValueError(f"cu_seqlens has shape {tuple(cu_seqlens.shape)}; expected [N+1], N >= 1")
    if not jnp.issubdtype(cu_seqlens.dtype, jnp.integer):
      raise ValueError(f"cu_seqlens has dtype {cu_seqlens.dtype}; expected int32")
    if _is_concrete(cu_seqlens):
      cu = np.asarray(cu_seqlens)
      if cu[0] != 0 or cu[-1] != t or np.any(np.diff(cu) < 0):
        raise ValueError(
          f"cu_seqlens={cu.tolist()} must start at 0, be non-decreasing and end at T={t}"
        )
    cu_seqlens = cu_seqlens.astype(jnp.int32)
  n = cu_seqlens.shape[0] - 1
  if initial_state is not None:
    _check_shape("initial_state", initial_state, (n, h_v, d_k, d_v))
    if initial_state.dtype != jnp.float32:
      raise ValueError(f"initial_state has dtype {initial_state.dtype}; expected float32")
  if checkpoint_every is not None:
    if (
      not isinstance(checkpoint_every, (int, np.integer))
      or checkpoint_every <= 0
      or checkpoint_every % CHUNK
    ):
      raise ValueError(
        f"checkpoint_every={checkpoint_every!r} must be a positive multiple of the chunk size "
        f"{CHUNK}"
      )
  return cu_seqlens, n


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
  cu, n = validate_prefill(q, k, v, g, beta, initial_state, cu_seqlens, checkpoint_every)
  t, h_v, d_v = v.shape
  d_k = q.shape[-1]
  _check_pallas_dims(impl, d_k, d_v)
  m = resolve_max_checkpoints(t, cu_seqlens, checkpoint_every, max_checkpoints)
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
      sequence of the batch). The Pallas path updates the pool in place (donate it).

  Returns:
    (o [N, H_v, d_v] in v.dtype, new_state_pool).
  """
  impl = common.resolve_implementation(implementation)
  if q.ndim != 3:
    raise ValueError(f"q has shape {tuple(q.shape)}; expected [N, H_k, d_k]")
  n = q.shape[0]
  _check_qkv(q, k, v, g, beta, (n,))
  _check_pool(state_pool, v.shape[1], q.shape[2], v.shape[2])
  _check_indices("read_indices", read_indices, n, state_pool.shape[0])
  _check_indices("write_indices", write_indices, n, state_pool.shape[0])
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
  _check_pool(state_pool, v.shape[2], q.shape[3], v.shape[3])
  _check_indices("read_indices", read_indices, n, state_pool.shape[0])
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
