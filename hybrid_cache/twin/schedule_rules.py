"""What a step schedules and allocates: the align-mode chunk split, admission counts, layout.

vLLM 0.33's scheduler split for recurrent align mode (§4.3, `_mamba_block_aligned_split`), the
blocks a group must take from the free pool to admit a request (§2.1, §2.4.3, reference §7 S32
admission counts) and align mode's block layout (§2.4.3). Pure rules over plain ints and lists
(`rules.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence

from hybrid_cache.twin.block_arith import cdiv
from hybrid_cache.twin.block_arith import floor_to


def checkpoint_position(num_tokens: int, unit: int, eagle: bool) -> int:
  """The last position of a prefill of `num_tokens` whose recurrent state can be reused.

  vLLM 0.33 `get_mamba_prefill_checkpoint_position` (no hash lookahead): a re-sent prompt hits
  at most N-1 tokens, so floor((N-1)/unit)*unit; EAGLE drops one unit after the hit instead:
  floor(N/unit)*unit - unit. Never below 0. Example: N 22, unit 8: 16 (EAGLE: 8).
  """
  if eagle:
    return max(floor_to(num_tokens, unit) - unit, 0)
  return max(floor_to(num_tokens - 1, unit), 0)


def block_aligned_split(
  start: int,
  n: int,
  *,
  num_tokens: int,
  num_prompt_tokens: int,
  block_size: int,
  use_eagle: bool,
  shared_prefix_boundary: int,
  max_chunk_tokens: int = 2**31 - 1,
  partial_hash_block: int | None = None,
  junction_block_size: int | None = None,
  cuts: Sequence[int] = (),
) -> int:
  """Tokens to schedule so that chunk ends land where a recurrent state is cached (align mode).

  vLLM 0.33 `Scheduler._mamba_block_aligned_split` (no backend-internal checkpoints):
  a prefill chunk that ends before the prefill end is floored to the block, unless that
  leaves nothing and the block is wider than `max_chunk_tokens` (the step's chunk limit: the
  per-entry cap when given, else the token budget): such a chunk advances sub-block and
  re-aligns at the next boundary. Then the chunk stops at the earliest of: the next block
  boundary (a chunk starting mid-block), the last cacheable boundary floor((N-1)/B)*B, the
  prompt's partial-tail boundary floor((P-1)/HBS)*HBS with partial hits (when it lies past the
  last cacheable boundary and inside the prompt), the block-floored Marconi junction, and
  (beyond vLLM) any of `cuts`, the positions where a stateful placement keeps a state
  (`placement.chunk_cuts`, e.g. `adaptive`'s continuation point).
  Decode steps (start >= max(P, N-1)) are not split.

  Example (B 9, HBS 3, 27-token prompt, partial hits): 18 (last cacheable boundary), then 6
  (tail boundary 24), then 3: chunks [18, 6, 3].
  """
  prefill_end = max(num_prompt_tokens, num_tokens - 1)
  if start >= prefill_end:
    return n
  lcp = checkpoint_position(num_tokens, block_size, use_eagle)
  end = start + n
  if end < prefill_end:
    aligned = floor_to(end, block_size)
    if aligned > start or block_size <= max_chunk_tokens:
      end = aligned
  stops = [lcp]
  if start % block_size:
    stops.append(cdiv(start, block_size) * block_size)
  if partial_hash_block is not None:
    tail = checkpoint_position(num_prompt_tokens, partial_hash_block, use_eagle)
    if lcp < tail < num_prompt_tokens:
      stops.append(tail)
  b = shared_prefix_boundary
  if start < b < end:  # floored to the block (fine keys, beyond vLLM: `junction_block_size`)
    stops.append(start + floor_to(b - start, junction_block_size or block_size))
  stops.extend(cuts)
  inside = [s for s in stops if start < s < end]
  if inside:
    end = min(inside)
  return max(end - start, 0)


def generic_blocks_needed(
  *,
  num_tokens: int,
  block_size: int,
  row_len: int,
  running: bool,
  hits: Sequence[int],
  hit_ref_cnt: Callable[[int], int],
  skipped_tokens: int,
  admission_cap: int | None = None,
  partial_cow: bool = False,
) -> int:
  """Blocks a full/SWA/non-align recurrent group must take from the free pool.

  `hits` are the new hit block ids (0 = null); a non-null hit with ref count 0 sits in the
  free queue, so touching it consumes free capacity too (counted unless skipped).
  `partial_cow`: a new request whose hit ends inside this group's last hit block needs one
  more block for the copy-on-write (§2.5; ignored for a running request).
  """
  required = cdiv(num_tokens, block_size)
  if admission_cap is not None:
    required = min(required, admission_cap)
  if running:
    return max(required - row_len, 0)
  skip = skipped_tokens // block_size
  new = max(required - max(skip, len(hits) + row_len), 0)
  first = max(0, skip - row_len)
  evictable = sum(1 for b in hits[first:] if b != 0 and hit_ref_cnt(b) == 0)
  return new + evictable + (1 if partial_cow else 0)


def mamba_align_blocks_needed(
  *,
  num_tokens_main: int,
  block_size: int,
  num_spec_blocks: int,
  row_len: int,
  already_allocated: bool,
  hits: Sequence[int],
  hit_ref_cnt: Callable[[int], int],
  partial_cow: bool = False,
) -> int:
  """Align-mode admission count: at most one new block (1+S on the first allocation).

  `partial_cow` (§2.5): a hit ending inside the block, or a pending copy-on-write of the
  request's own partial entry: one more block, and the count is taken even when no new
  position is needed (vLLM `MambaManager.get_num_blocks_to_allocate`).
  """
  req = cdiv(num_tokens_main, block_size) + num_spec_blocks
  n = req - len(hits) - row_len
  cow = 1 if partial_cow else 0
  if cow:
    n = max(n, 0) + 1
  # at most the physical cap: one state block (1+S on the first allocation) + the copy
  n = min(n, (1 if already_allocated else 1 + num_spec_blocks) + cow) if n > 0 else 0
  return n + sum(1 for b in hits if b != 0 and hit_ref_cnt(b) == 0)


FRESH = -1  # placeholder for a freshly allocated block in `mamba_align_layout`


def mamba_align_layout(
  row: Sequence[int],
  *,
  num_tokens_main: int,
  block_size: int,
  num_spec_blocks: int,
  already_allocated: bool,
  came_with_hit: bool,
  pending_cow: bool = False,
) -> tuple[list[int], int | None]:
  """Align-mode allocation (§2.4.3): the new row (FRESH = take a new block) and last_state.

  Returns (row unchanged, None) when nothing must be allocated. With `pending_cow` (§2.5) the
  layout step always runs (the caller takes one more block for the copy-on-write).
  """
  s = num_spec_blocks
  req = cdiv(num_tokens_main, block_size) + s
  row = list(row)
  if req <= len(row) and not pending_cow:
    return row, None
  prev = len(row)
  if already_allocated:
    last_state = prev - 1 - s
  elif came_with_hit:
    last_state = prev - 1
  else:
    last_state = None
  skip_to = req - s - 1
  row.extend([0] * max(0, skip_to - prev))
  if already_allocated:
    for j in range(prev - s, prev):
      if j >= skip_to:
        break
      row.append(row[j])
      row[j] = 0
  row.extend([FRESH] * (req - len(row)))
  if last_state is not None and last_state < 0:
    last_state = None
  return row, last_state
