"""Packed (varlen) sequence bookkeeping shared by the SSD and conv1d kernels.

Tokens of N sequences are packed along one axis of length T; ``cu_seqlens`` (int32[N+1],
``cu[0] = 0``, non-decreasing, ``cu[N] = T``) gives their boundaries. Sequences may be empty.
All helpers here are jittable with a traced ``cu_seqlens``: only T, N and the chunk size are
static. Values are validated when ``cu_seqlens`` is concrete.

Chunk layout: every sequence is cut into chunks of ``chunk_size`` tokens that never straddle two
sequences; the last chunk of a sequence is padded. Chunks of all sequences are numbered
consecutively (sequence 0 first); there are at most ``num_chunks = (T + N*(C-1)) // C`` of them,
unused trailing chunk ids are pure padding.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


def normalize_cu_seqlens(cu_seqlens, num_tokens: int) -> tuple[jax.Array, int]:
  """Returns (int32[N+1] cu_seqlens, N); None means one sequence of all tokens.

  Raises:
    ValueError: wrong rank, size < 2, or (when concrete) cu[0] != 0, cu[-1] != num_tokens, or
      decreasing entries.
  """
  if cu_seqlens is None:
    return jnp.array([0, num_tokens], jnp.int32), 1
  shape = jnp.shape(cu_seqlens)
  if len(shape) != 1 or shape[0] < 2:
    raise ValueError(f"cu_seqlens must have shape [N+1] with N >= 1, got shape {shape}")
  if not jnp.issubdtype(jnp.result_type(cu_seqlens), jnp.integer):
    raise ValueError(f"cu_seqlens must be integer, got dtype {jnp.result_type(cu_seqlens)}")
  if not isinstance(cu_seqlens, jax.core.Tracer):
    cu = np.asarray(cu_seqlens)
    if cu[0] != 0 or cu[-1] != num_tokens or np.any(np.diff(cu) < 0):
      raise ValueError(
        f"cu_seqlens={cu.tolist()} must start at 0, be non-decreasing and end at the number "
        f"of tokens {num_tokens}"
      )
  return jnp.asarray(cu_seqlens, jnp.int32), shape[0] - 1


def is_concrete(x) -> bool:
  return x is not None and not isinstance(x, jax.core.Tracer)


def token_positions(cu: jax.Array, num_tokens: int) -> tuple[jax.Array, jax.Array]:
  """Returns (seq_id int32[T], position within its sequence int32[T])."""
  t = jnp.arange(num_tokens, dtype=jnp.int32)
  seq = jnp.searchsorted(cu[1:], t, side="right").astype(jnp.int32)
  return seq, t - cu[seq]


def resolve_checkpoints(
  checkpoint_every, max_checkpoints, num_tokens: int, cu, chunk_size: int | None
) -> tuple[int, int]:
  """Validates the checkpoint arguments; returns (every, M) with every = 0 when disabled.

  M (static slots per sequence) defaults to the largest ``L_n // every`` when ``cu`` is concrete
  or None, else ``num_tokens // every``. Same convention as the GDN kernels: checkpoints beyond M
  are dropped and the reported counts are ``min(L_n // every, M)``.
  """
  if checkpoint_every is None:
    if max_checkpoints not in (None, 0):
      raise ValueError(
        f"max_checkpoints={max_checkpoints} needs checkpoint_every; got checkpoint_every=None"
      )
    return 0, 0
  if not isinstance(checkpoint_every, (int, np.integer)) or checkpoint_every <= 0:
    raise ValueError(f"checkpoint_every={checkpoint_every!r} must be a positive int or None")
  if chunk_size is not None and checkpoint_every % chunk_size:
    raise ValueError(
      f"checkpoint_every={checkpoint_every} must be a multiple of chunk_size={chunk_size}"
    )
  if max_checkpoints is None:
    if cu is None:
      max_checkpoints = num_tokens // checkpoint_every
    elif is_concrete(cu):
      max_checkpoints = int(np.max(np.diff(np.asarray(cu)) // checkpoint_every, initial=0))
    else:
      max_checkpoints = num_tokens // checkpoint_every
  if not isinstance(max_checkpoints, (int, np.integer)) or max_checkpoints < 0:
    raise ValueError(f"max_checkpoints={max_checkpoints!r} must be an int >= 0 or None")
  return int(checkpoint_every), int(max_checkpoints)


@dataclasses.dataclass(frozen=True)
class ChunkLayout:
  """Chunk tables for packed sequences (all arrays int32).

  Attributes:
    num_chunks: static bound on the number of chunks (padding chunks included).
    chunk_size: C.
    seq_chunk_start: [N] id of each sequence's first chunk.
    seq_num_chunks: [N] ceil(L_n / C).
    chunk_seq: [num_chunks] owning sequence (N for padding chunks).
    chunk_is_first: [num_chunks] bool, first chunk of its sequence (True for padding chunks).
    gather_index: [num_chunks * C] source token for each chunk slot, T for padding slots.
    token_slot: [T] flat chunk slot (chunk * C + offset) of each token.
  """

  num_chunks: int
  chunk_size: int
  seq_chunk_start: jax.Array
  seq_num_chunks: jax.Array
  chunk_seq: jax.Array
  chunk_is_first: jax.Array
  gather_index: jax.Array
  token_slot: jax.Array


def chunk_layout(cu: jax.Array, num_seqs: int, num_tokens: int, chunk_size: int) -> ChunkLayout:
  """Builds the chunk tables for ``cu`` (int32[N+1]); jittable."""
  c = chunk_size
  num_chunks = max(1, (num_tokens + num_seqs * (c - 1)) // c)
  lengths = cu[1:] - cu[:-1]
  n_chunks = (lengths + c - 1) // c
  chunk_start = jnp.concatenate([jnp.zeros([1], jnp.int32), jnp.cumsum(n_chunks)[:-1]])
  chunk_ids = jnp.arange(num_chunks, dtype=jnp.int32)
  chunk_end = chunk_start + n_chunks
  chunk_seq = jnp.searchsorted(chunk_end, chunk_ids, side="right").astype(jnp.int32)
  valid_chunk = chunk_seq < num_seqs
  seq_c = jnp.minimum(chunk_seq, num_seqs - 1)
  local = chunk_ids - chunk_start[seq_c]
  tok0 = cu[seq_c] + local * c
  offs = jnp.arange(c, dtype=jnp.int32)
  tok = tok0[:, None] + offs[None, :]
  valid = valid_chunk[:, None] & (tok < cu[seq_c + 1][:, None])
  gather_index = jnp.where(valid, tok, num_tokens).reshape(-1)
  seq, pos = token_positions(cu, num_tokens)
  token_slot = (chunk_start[seq] + pos // c) * c + pos % c
  return ChunkLayout(
    num_chunks=num_chunks,
    chunk_size=c,
    seq_chunk_start=chunk_start.astype(jnp.int32),
    seq_num_chunks=n_chunks.astype(jnp.int32),
    chunk_seq=chunk_seq,
    chunk_is_first=(local == 0) | ~valid_chunk,
    gather_index=gather_index,
    token_slot=token_slot.astype(jnp.int32),
  )


def to_chunks(x: jax.Array, layout: ChunkLayout) -> jax.Array:
  """[T, ...] -> [num_chunks, C, ...] with zeros in padding slots."""
  shape = (layout.num_chunks, layout.chunk_size) + x.shape[1:]
  if x.shape[0] == 0:  # no tokens: every slot is padding
    return jnp.zeros(shape, x.dtype)
  out = jnp.take(x, layout.gather_index, axis=0, mode="fill", fill_value=0)
  return out.reshape((layout.num_chunks, layout.chunk_size) + x.shape[1:])


def from_chunks(y: jax.Array, layout: ChunkLayout) -> jax.Array:
  """[num_chunks, C, ...] -> [T, ...] (drops padding slots)."""
  flat = y.reshape((layout.num_chunks * layout.chunk_size,) + y.shape[2:])
  return jnp.take(flat, layout.token_slot, axis=0)
