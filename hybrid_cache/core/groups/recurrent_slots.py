"""Worker-side rules of a recurrent group (vLLM §5): where a scheduled chunk reads, writes and
checkpoints its recurrent state, and the engine's chunk rule for our kernels.

`state_slots` runs inside the jitted step; its columns (`SLOT_*`) are packed per recurrent
group into the step results (`outputs.EntryColumns.slots`) and read by the manager into
`EntryResult.recurrent`. The host rules (`kernel_checkpoints`, `copies_after_verify`,
`kernel_chunk_cap`, `check_kernel_chunk`) are the engine's, so that no caller re-derives the
modes. The cache rules of the kind (lookup, allocation, key registration) are in `recurrent`;
the plain-Python twin of `state_slots` is `twin.rules.recurrent_state_slots`.
"""

from __future__ import annotations

import jax.numpy as jnp

from hybrid_cache.core.state import cdiv
from hybrid_cache.core.state import floor_to

# the columns of a `state_slots` result
SLOT_READ, SLOT_WRITE, SLOT_FIRST_CHECKPOINT, SLOT_NUM_CHECKPOINTS = range(4)
SLOT_WIDTH = 4


def state_slots(spec, row, start, n):
  """Where a scheduled chunk [start, start + n) reads and writes this group's recurrent state.

  The state after a prefix [0, p) lives in the block of the column holding token p - 1 (vLLM
  §5.1). With B = `spec.block_size` and end = start + n, per mode (`spec.mode`, the effective
  one: caching off is "none"):
    none  (§2.4.1): one block per request, read (start > 0) and written in place: column 0.
    align (§5.1, §5.2): the running-state column cdiv(end, B) - 1; the step's pre-forward copy
          (`StateCopy`, §5.2) has moved the previous state there, so it is read (start > 0)
          and written.
    all   (§5.4): read column (start - 1) // B, write column (end - 1) // B, and checkpoint
          the state after each of the n // B full blocks of a chunk that starts on a block
          boundary, into columns start // B, ... (the last one is the write column when end is
          a boundary). Our kernels emit a checkpoint every B tokens from a chunk's start, so a
          chunk starting inside a block checkpoints nothing: its only boundary state, when it
          ends on one, is its write block, and it must not cross a boundary (the engine keeps
          its chunks so, `kernel_chunk_cap`). vLLM's kernels write every boundary wherever
          the chunk starts (§5.4); both agree on every chunk that rule lets through.
  A chunk with start == 0 reads no state (-1: start from zeros).

  Args:
    spec: the group's resolved spec (static).
    row: i32[MB], the request's block table of this group after the step's allocation.
    start, n: i32 scalars, tokens computed before the chunk and the chunk's length.

  Returns:
    i32[SLOT_WIDTH] (`SLOT_*` columns: read block or -1, write block, first checkpoint
    column, checkpoint count): the checkpoint blocks are row[first : first + count]. n == 0
    (not scheduled) gives (-1, -1, 0, 0).

  Example (mode all, B=4): row [7, 8, 9], start 4, n 6 -> (7, 9, 1, 1): read the state after
  4 tokens from block 7, checkpoint the state after 8 tokens into block 8, write the state
  after 10 tokens into block 9.
  """
  bs = spec.block_size
  end = start + n
  if spec.mode == "none":
    read_col = write_col = jnp.int32(0)
  elif spec.mode == "align":
    read_col = write_col = cdiv(end, bs) - 1
  else:
    read_col, write_col = (start - 1) // bs, (end - 1) // bs
  count = jnp.int32(0)
  if spec.mode == "all":
    count = jnp.where(start % bs == 0, n // bs, 0)
  mb = row.shape[0]
  read = jnp.where(start > 0, row[jnp.clip(read_col, 0, mb - 1)], -1)
  write = row[jnp.clip(write_col, 0, mb - 1)]
  on = n > 0
  return jnp.stack(
    [
      jnp.where(on, read, -1),
      jnp.where(on, write, -1),
      jnp.where(on, start // bs, 0),
      jnp.where(on, count, 0),
    ]
  ).astype(jnp.int32)


def kernel_checkpoints(spec) -> bool:
  """Whether prefill chunks write checkpoints besides their final state (mode all, §5.4)."""
  return spec.mode == "all"


def copies_after_verify(spec) -> bool:
  """Whether a speculative verify window copies the state at a block boundary reached inside
  its accepted tokens into that boundary's block (vLLM §5.3: align mode only; mode all is
  refused with speculative decoding, mode none caches nothing)."""
  return spec.mode == "align"


def kernel_chunk_cap(spec, num_computed: int, num_tokens: int, budget: int) -> int | None:
  """The engine's cap on a request's next chunk so that our kernels can checkpoint it (host).

  Mode all: our GDN / SSD kernels emit a checkpoint every B tokens from a chunk's start, so a
  prefill chunk that stops before the sequence end must end on a block boundary (then every
  chunk after a block-aligned hit starts on one, and `state_slots` lists every boundary state).
  Returns min(num_tokens - num_computed, budget), floored to end on a multiple of B unless it
  reaches num_tokens; <= 0 = the chunk cannot end on a boundary within `budget` (skip the
  request this step). A waiting request passes num_computed = 0: its prefix hit is aligned to
  the scheduler block (a multiple of B), so a B-multiple cap keeps its end aligned. Other
  modes: None (no cap; align chunks are aligned by the core's split, vLLM §4.3).

  This is an engine rule, not vLLM's: vLLM 0.33's kernels write every block boundary wherever
  a chunk starts (§5.4), and its scheduler aligns chunks only in align mode
  (`Scheduler.need_mamba_block_aligned_split`), so the core's split (vLLM-exact replay) does not
  apply it. Example (B=4): computed 4, 27 tokens, budget 7 -> 4 (ends at 8); budget 30 -> 23.
  """
  if not kernel_checkpoints(spec):
    return None
  remaining = num_tokens - num_computed
  n = min(remaining, budget)
  if n < remaining:
    n = floor_to(num_computed + n, spec.block_size) - num_computed
  return n


def check_kernel_chunk(spec, start: int, n: int) -> None:
  """Raises AssertionError when our kernels cannot checkpoint chunk [start, start + n) (host):
  in mode all, a chunk starting inside a block must not cross a block boundary (see
  `kernel_chunk_cap`, which keeps the engine's chunks so)."""
  bs = spec.block_size
  if kernel_checkpoints(spec) and start % bs and cdiv(start, bs) * bs < start + n:
    raise AssertionError(f"'all' mode chunk [{start}, {start + n}) crosses a block boundary")
