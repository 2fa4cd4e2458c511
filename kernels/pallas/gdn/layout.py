"""Packed-sequence chunk layout shared by the chunked XLA path and the Pallas kernels.

Packed tokens ``[T, ...]`` with ``cu_seqlens: int32[N+1]`` are cut into chunks of ``C`` tokens
that never straddle sequences. The number of chunk slots is the static bound
``NC = T // C + N`` (every sequence adds at most one partial chunk); unused slots have length 0
and belong to the dump sequence index ``N``. All arrays are computed on device, so
``cu_seqlens`` may be traced.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class ChunkLayout:
  """Chunk tables (all int32).

  Attributes:
    seq: [NC] sequence of each chunk slot (N for unused slots).
    start: [NC] global token index of the chunk's first token (0 for unused slots).
    length: [NC] valid tokens in the chunk (0..C; 0 for unused slots).
    local: [NC] index of the chunk within its sequence.
    first: [N] first chunk slot of each sequence.
    count: [N] number of chunks of each sequence (ceil(L_n / C)).
    lengths: [N] sequence lengths L_n.
    token_chunk: [T] chunk slot of every token (None unless ``with_tokens``).
    token_pos: [T] position of every token inside its chunk (None unless ``with_tokens``).
  """

  seq: jax.Array
  start: jax.Array
  length: jax.Array
  local: jax.Array
  first: jax.Array
  count: jax.Array
  lengths: jax.Array
  token_chunk: jax.Array | None
  token_pos: jax.Array | None


def num_chunk_slots(num_tokens: int, num_seqs: int, chunk: int) -> int:
  """Static number of chunk slots ``T // C + N``."""
  return num_tokens // chunk + num_seqs


def chunk_layout(
  cu_seqlens: jax.Array, num_tokens: int, chunk: int, with_tokens: bool = True
) -> ChunkLayout:
  """Builds the chunk tables for ``cu_seqlens`` (int32[N+1], cu[0]=0, cu[N]=T).

  ``with_tokens=False`` skips the per-token tables (``token_chunk``/``token_pos`` are None).
  """
  cu = cu_seqlens.astype(jnp.int32)
  n = cu.shape[0] - 1
  nc = num_chunk_slots(num_tokens, n, chunk)
  lengths = cu[1:] - cu[:-1]
  count = (lengths + chunk - 1) // chunk
  ends = jnp.cumsum(count)
  first = ends - count
  slots = jnp.arange(nc, dtype=jnp.int32)
  # compare_all: one fused [NC, N] compare (the default scan method is a device while loop).
  seq = jnp.searchsorted(ends, slots, side="right", method="compare_all").astype(jnp.int32)
  used = seq < n
  seq_c = jnp.minimum(seq, n - 1)
  local = jnp.where(used, slots - first[seq_c], 0)
  start = jnp.where(used, cu[seq_c] + local * chunk, 0)
  length = jnp.where(used, jnp.clip(lengths[seq_c] - local * chunk, 0, chunk), 0)
  token_chunk = token_pos = None
  if with_tokens:
    tok = jnp.arange(num_tokens, dtype=jnp.int32)
    tseq = jnp.clip(jnp.searchsorted(cu, tok, side="right").astype(jnp.int32) - 1, 0, n - 1)
    tloc = tok - cu[tseq]
    token_chunk = (first[tseq] + tloc // chunk).astype(jnp.int32)
    token_pos = (tloc % chunk).astype(jnp.int32)
  return ChunkLayout(
    seq=seq.astype(jnp.int32),
    start=start.astype(jnp.int32),
    length=length.astype(jnp.int32),
    local=local.astype(jnp.int32),
    first=first.astype(jnp.int32),
    count=count.astype(jnp.int32),
    lengths=lengths.astype(jnp.int32),
    token_chunk=token_chunk,
    token_pos=token_pos,
  )
