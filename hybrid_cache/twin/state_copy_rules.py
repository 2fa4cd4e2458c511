"""Worker-side recurrent state slots and copies (§5.1-§5.4): where a chunk reads and writes.

vLLM 0.33's state columns per mode (none, align, all), the pre-forward copy of align mode and
the post-forward copy of speculative decoding (reference §7 S30 copies). Pure rules over plain
ints and lists (`rules.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

from hybrid_cache.twin.block_arith import cdiv
from hybrid_cache.twin.block_arith import floor_to


def recurrent_state_slots(
  mode: str, row: Sequence[int], start: int, n: int, block_size: int
) -> tuple[int, int, tuple[int, ...]]:
  """(read block or -1, write block, checkpoint blocks) of a chunk [start, start + n) (n >= 1).

  The state after p tokens sits in the column of token p - 1 (§5.1). none: the request's one
  block (column 0). align: the running-state column of the chunk's end, read too, since the
  pre-forward copy (§5.2) moved the previous state there. all (§5.4): read after `start`, write
  after `end`, and, for a chunk starting on a block boundary (our kernels checkpoint every B
  tokens from the chunk start), the state at each boundary start + B, start + 2B, ... <= end.
  Nothing is read when start == 0.
  """
  end = start + n
  if mode == "none":
    read_col = write_col = 0
  elif mode == "align":
    read_col = write_col = (end - 1) // block_size
  else:
    read_col, write_col = (start - 1) // block_size, (end - 1) // block_size
  ckpts: tuple[int, ...] = ()
  if mode == "all" and start % block_size == 0:
    ckpts = tuple(row[b // block_size - 1] for b in range(start + block_size, end + 1, block_size))
  return (row[read_col] if start > 0 else -1), row[write_col], ckpts


def pre_forward_copy(
  prev_col: int | None, num_computed: int, num_scheduled: int, block_size: int
) -> tuple[tuple[int, int] | None, int]:
  """(copy (src_col, dst_col) or None, curr_col) before the forward pass (§5.2).

  `prev_col` is the column used last step, or None for a new/resumed request (then the
  prefix-hit column `(num_computed-1)//B`, -1 when nothing is computed).
  """
  prev = prev_col if prev_col is not None else (num_computed - 1) // block_size
  if num_computed == 0 and prev_col is None:
    prev = -1
  curr = cdiv(num_computed + num_scheduled, block_size) - 1
  if prev != -1 and prev != curr:
    return (prev, curr), curr
  return None, curr


def post_forward_copy(
  *,
  num_computed: int,
  num_scheduled: int,
  num_draft: int,
  num_accepted: int,
  block_size: int,
  src_col: int,
) -> tuple[tuple[int, int, int] | None, int]:
  """Spec-decode post-forward copy (§5.3): ((src_col+bias, dest, bias) or None, accepted)."""
  running = num_computed + num_scheduled - num_draft
  new = running + num_accepted - 1
  aligned = floor_to(new, block_size)
  if aligned < running:
    return None, num_accepted
  bias = aligned - running
  dest = aligned // block_size - 1
  accepted = 1 if src_col == dest else num_accepted
  if src_col == dest and bias == 0:
    return None, accepted
  return (src_col + bias, dest, bias), accepted
