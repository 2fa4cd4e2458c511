"""Packed (varlen) sequence bookkeeping shared by the GDN, SSD and conv1d kernels.

Tokens of N sequences are packed along one axis of length T; ``cu_seqlens`` (int32[N+1],
``cu[0] = 0``, non-decreasing, ``cu[N] = T``) gives their boundaries. Sequences may be empty.
All helpers here are jittable with a traced ``cu_seqlens``: only T, N and the chunk size are
static. Values are validated when ``cu_seqlens`` is concrete.

Chunk layout: every sequence is cut into chunks of ``chunk_size`` tokens that never straddle two
sequences; the last chunk of a sequence is padded. Chunks of all sequences are numbered
consecutively (sequence 0 first); there are at most ``max_chunks = (T + N*(C-1)) // C`` of them
(callers may ask for more slots); unused trailing chunk slots are pure padding.
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


def max_chunks(num_tokens: int, num_seqs: int, chunk_size: int) -> int:
  """Tight static bound ``max(1, (T + N*(C-1)) // C)`` on the number of chunks."""
  return max(1, (num_tokens + num_seqs * (chunk_size - 1)) // chunk_size)


@dataclasses.dataclass(frozen=True)
class ChunkLayout:
  """Chunk tables for packed sequences (all arrays int32 unless noted).

  Attributes:
    chunk_size: C (static).
    num_tokens: T (static).
    seq: [NC] owning sequence of each chunk slot (N for unused padding slots).
    start: [NC] global index of the chunk's first token (0 for unused slots).
    length: [NC] valid tokens in the chunk (0..C; 0 for unused slots).
    local: [NC] index of the chunk within its sequence (0 for unused slots).
    first: [N] chunk slot of each sequence's first chunk.
    count: [N] chunks of each sequence, ceil(L_n / C).
    lengths: [N] sequence lengths L_n.
    token_chunk: [T] chunk slot of every token (None unless built ``with_tokens``).
    token_pos: [T] position of every token inside its chunk (None unless ``with_tokens``).
  """

  chunk_size: int
  num_tokens: int
  seq: jax.Array
  start: jax.Array
  length: jax.Array
  local: jax.Array
  first: jax.Array
  count: jax.Array
  lengths: jax.Array
  token_chunk: jax.Array | None
  token_pos: jax.Array | None

  @property
  def num_chunks(self) -> int:
    """NC, the static number of chunk slots (padding slots included)."""
    return self.seq.shape[0]

  @property
  def chunk_is_first(self) -> jax.Array:
    """[NC] bool: first chunk of its sequence (True for padding slots)."""
    return (self.local == 0) | (self.seq >= self.first.shape[0])

  @property
  def gather_index(self) -> jax.Array:
    """[NC * C] source token of each chunk row, T for padding rows."""
    offs = jnp.arange(self.chunk_size, dtype=jnp.int32)
    tok = self.start[:, None] + offs[None, :]
    return jnp.where(offs[None, :] < self.length[:, None], tok, self.num_tokens).reshape(-1)

  @property
  def token_slot(self) -> jax.Array:
    """[T] flat chunk row (chunk * C + offset) of every token; needs ``with_tokens``."""
    return self.token_chunk * self.chunk_size + self.token_pos


def chunk_layout(
  cu: jax.Array,
  num_tokens: int,
  chunk_size: int,
  *,
  num_chunks: int | None = None,
  with_tokens: bool = True,
) -> ChunkLayout:
  """Builds the chunk tables for ``cu`` (int32[N+1], cu[0]=0, cu[N]=T); jittable.

  ``num_chunks`` (static) defaults to ``max_chunks(T, N, C)``; a larger value adds unused
  padding slots. ``with_tokens=False`` skips the per-token tables.
  """
  c = chunk_size
  cu = cu.astype(jnp.int32)
  n = cu.shape[0] - 1
  nc = max_chunks(num_tokens, n, c) if num_chunks is None else num_chunks
  lengths = cu[1:] - cu[:-1]
  count = (lengths + c - 1) // c
  ends = jnp.cumsum(count)
  first = ends - count
  slots = jnp.arange(nc, dtype=jnp.int32)
  # compare_all: one fused [NC, N] compare (the default scan method is a device while loop).
  seq = jnp.searchsorted(ends, slots, side="right", method="compare_all").astype(jnp.int32)
  used = seq < n
  seq_c = jnp.minimum(seq, n - 1)
  local = jnp.where(used, slots - first[seq_c], 0)
  token_chunk = token_pos = None
  if with_tokens:
    tseq, tloc = token_positions(cu, num_tokens)
    token_chunk = (first[tseq] + tloc // c).astype(jnp.int32)
    token_pos = (tloc % c).astype(jnp.int32)
  i32 = lambda a: a.astype(jnp.int32)  # noqa: E731
  return ChunkLayout(
    chunk_size=c,
    num_tokens=num_tokens,
    seq=seq,
    start=i32(jnp.where(used, cu[seq_c] + local * c, 0)),
    length=i32(jnp.where(used, jnp.clip(lengths[seq_c] - local * c, 0, c), 0)),
    local=i32(local),
    first=i32(first),
    count=i32(count),
    lengths=i32(lengths),
    token_chunk=token_chunk,
    token_pos=token_pos,
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
