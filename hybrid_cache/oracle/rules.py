"""Pure per-group rules of vLLM 0.33's hybrid prefix cache (reference §2–§5).

Everything here is a small function over plain ints and lists, so the rules can be tested
one by one (reference §7: S06 scan table, S07 freeing sequence, S21/S22 masks, S30 copies,
S32 admission counts) and shared by the oracle's rule modules (`coordinator`, `admission`,
`allocate`, `cache_keys`, `release`, `step`).

Conventions: a "hit entry list" is position-indexed; entry i is `None` (null block) or the
tuple of block ids of the member groups of one spec group for group-block i. `cached(i)`
returns such a tuple or None when block i misses in any member group.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence

Entry = tuple[int, ...] | None
CachedFn = Callable[[int], Entry]


def cdiv(a: int, b: int) -> int:
  return -(-a // b)


def floor_to(x: int, m: int) -> int:
  return (x // m) * m


# ---------------------------------------------------------------------------------------------
# Skipped tokens and freeing (§2.1, §2.3.3, §2.4.4)
# ---------------------------------------------------------------------------------------------


def num_skipped_tokens(kind: str, computed: int, window: int | None = None) -> int:
  """Tokens whose cache is no longer needed once `computed` tokens are computed (>= 0)."""
  if kind == "full":
    return 0
  if kind == "swa":
    assert window is not None
    return max(0, computed - window + 1)
  if kind == "mamba":
    return max(0, computed - 1)
  raise ValueError(f"kind must be one of ('full', 'swa', 'mamba'), got {kind!r}")


def skipped_indices(row: Sequence[int], num_skipped_blocks: int) -> list[int]:
  """Indices `remove_skipped_blocks` nulls and frees, in freeing order (deeper first).

  Walks k-1, k-2, ..., 0 with k = min(num_skipped_blocks, len(row)) and stops at the first
  entry that is already null (0).
  """
  out = []
  for i in range(min(num_skipped_blocks, len(row)) - 1, -1, -1):
    if row[i] == 0:
      break
    out.append(i)
  return out


def finish_pin_indices(kind: str, keyed: Sequence[int], need: int) -> list[int]:
  """Row indices a finishing request pins (SPEC B1, `pinning` on): what keeps its prefix hittable.

  `keyed` are the row indices of the request's held blocks that carry a key (increasing).
  Full attention pins every keyed block (the whole hashed prefix). A sliding-window group pins
  the keyed blocks among the `need` positions ending at its deepest keyed block (the window an
  SWA hit at that boundary needs); a recurrent group pins its deepest keyed state (`need` = 1).

  Example: SWA need 2, keyed [0, 1, 5, 6, 7] -> [6, 7]; full, keyed [0, 1, 2] -> [0, 1, 2].
  """
  if not keyed:
    return []
  if kind == "full":
    return list(keyed)
  lo = keyed[-1] + 1 - need
  return [i for i in keyed if i >= lo]


# ---------------------------------------------------------------------------------------------
# Lookups (§2.2, §2.3.2, §2.4.2)
# ---------------------------------------------------------------------------------------------


def find_full(
  cached: CachedFn, block_size: int, max_length: int, drop_eagle: bool, alignment: int
) -> tuple[list[Entry], int]:
  """Full attention: longest run of hits from block 0; EAGLE drops one block; aligned down."""
  entries: list[Entry] = []
  for i in range(max_length // block_size):
    e = cached(i)
    if e is None:
      break
    entries.append(e)
  length = len(entries) * block_size
  if drop_eagle and length > 0:
    length -= block_size
  length = floor_to(length, alignment)
  return entries[: cdiv(length, block_size)], length


def find_full_fine(
  cached: CachedFn,
  cached_fine: CachedFn,
  block_size: int,
  hash_block_size: int,
  max_length: int,
  num_fine: int,
  drop_eagle: bool,
) -> tuple[list[Entry], int]:
  """Full attention with partial hits (§2.5, vLLM `FullAttentionManager.find_longest_cache_hit`).

  Only for block_size > hash_block_size (alignment = hash block). Phase 1: the run of cached
  full blocks from block 0. Phase 2: inside the next block, the hash boundaries
  `[first, min(first + k - 1, max_length // HBS, num_fine))` (k = block/hash block, first = run*k)
  are probed from high to low; the first cached fine key (a partial entry, `cached_fine(i)` for
  the prefix of (i+1)*HBS tokens) adds its block and ends the hit at (i+1)*HBS. EAGLE drops one
  hash block; the entry list keeps cdiv(hit, block_size) blocks.
  """
  entries: list[Entry] = []
  for i in range(max_length // block_size):
    e = cached(i)
    if e is None:
      break
    entries.append(e)
  length = len(entries) * block_size
  k = block_size // hash_block_size
  first = len(entries) * k
  top = min(first + k - 1, max_length // hash_block_size, num_fine)
  for i in range(top - 1, first - 1, -1):
    e = cached_fine(i)
    if e is not None:
      entries.append(e)
      length = (i + 1) * hash_block_size
      break
  if drop_eagle and length > 0:
    length -= hash_block_size
  length = floor_to(length, hash_block_size)
  return entries[: cdiv(length, block_size)], length


def find_mamba_fine(
  cached_fine: CachedFn, block_size: int, hash_block_size: int, max_length: int, num_fine: int
) -> tuple[list[Entry], int]:
  """Recurrent lookup with partial hits (§2.5): the rightmost cached hash boundary wins.

  Scans fine indices `min(max_length // HBS, num_fine) - 1 .. 0`; a hit at fine index i sits in
  block i // k: `[None] * (i // k) + [entry]`, length (i+1)*HBS. No EAGLE drop.
  """
  k = block_size // hash_block_size
  for i in range(min(max_length // hash_block_size, num_fine) - 1, -1, -1):
    e = cached_fine(i)
    if e is not None:
      return [None] * (i // k) + [e], (i + 1) * hash_block_size
  return [], 0


def swa_need(window: int, block_size: int, drop_eagle: bool) -> int:
  """Contiguous blocks an SWA resume point needs: ceil((W-1)/B), +1 with the EAGLE drop."""
  return cdiv(window - 1, block_size) + (1 if drop_eagle else 0)


def find_swa(
  cached: CachedFn,
  block_size: int,
  window: int,
  max_length: int,
  drop_eagle: bool,
  alignment: int,
) -> tuple[list[Entry], int]:
  """Sliding window: right-to-left scan for `need` contiguous cached blocks (§2.3.2).

  A run may only start (at its right edge) on an aligned position; the run touching block 0
  counts even when shorter than `need`. Entries left of the run are None.
  """
  need = swa_need(window, block_size, drop_eagle)
  n = max_length // block_size
  entries: list[Entry] = [None] * n
  run = 0
  found = False
  for i in range(n - 1, -1, -1):
    e = cached(i)
    if e is not None:
      if run == 0 and block_size != alignment:
        end = i if drop_eagle else i + 1
        if (end * block_size) % alignment != 0:
          continue
      entries[i] = e
      run += 1
      if run >= need:
        del entries[i + run :]
        found = True
        break
    else:
      run = 0
  if not found:
    del entries[run:]
    while entries and (len(entries) * block_size) % alignment != 0:
      entries.pop()
  if drop_eagle and entries:
    entries.pop()
    while entries and (len(entries) * block_size) % alignment != 0:
      entries.pop()
  return entries, len(entries) * block_size


def find_mamba(
  cached: CachedFn, block_size: int, max_length: int, alignment: int
) -> tuple[list[Entry], int]:
  """Recurrent: the rightmost cached block whose right edge is aligned; one real block."""
  for i in range(max_length // block_size - 1, -1, -1):
    if ((i + 1) * block_size) % alignment != 0:
      continue
    e = cached(i)
    if e is not None:
      return [None] * i + [e], (i + 1) * block_size
  return [], 0


# ---------------------------------------------------------------------------------------------
# Retention masks (§2.3.4, §2.4.7, §6.2)
# ---------------------------------------------------------------------------------------------


def swa_cacheable(
  i: int,
  *,
  block_size: int,
  need: int,
  alignment_tokens: int,
  eagle: bool,
  retention_interval: int | None,
  boundaries: Iterable[int] = (),
) -> bool:
  """Whether SWA block i may be registered (`need` includes the EAGLE +1).

  `alignment_tokens`: vLLM's hit alignment (the hash block with partial hits, else the
  scheduler block): the dense segment and the grid boundaries are floored to.
  """
  shift = 1 if eagle else 0
  segment = alignment_tokens if retention_interval is None else retention_interval
  if segment > 0:
    per = segment // block_size
    if need >= per:
      return True
    if i >= shift and (i - shift) % per >= per - need:
      return True
  if retention_interval is None:
    return False
  for b in boundaries:
    if b <= 0:
      continue
    end = floor_to(b, alignment_tokens) // block_size + shift
    if end - need <= i < end:
      return True
  return False


def mamba_cacheable(
  i: int,
  *,
  block_size: int,
  alignment_tokens: int,
  retention_interval: int | None,
  boundaries: Iterable[int] = (),
) -> bool:
  """Whether recurrent block i may be registered (dense, 0 = boundaries only, or k·B).

  `alignment_tokens`: vLLM's hit alignment, the grid boundaries are floored to.
  """
  r = retention_interval
  if r is None:
    return True
  if r > 0:
    per = r // block_size
    if per <= 1:
      return True
    if (i + 1) % per == 0:
      return True
  for b in boundaries:
    if b <= 0:
      continue
    if i == floor_to(b, alignment_tokens) // block_size - 1:
      return True
  return False


# ---------------------------------------------------------------------------------------------
# Scheduler split (§4.3)
# ---------------------------------------------------------------------------------------------


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
) -> int:
  """Tokens to schedule so that chunk ends land where a recurrent state is cached (align mode).

  vLLM 0.33 `Scheduler._mamba_block_aligned_split` (no backend-internal checkpoints):
  a prefill chunk that ends before the prefill end is floored to the block, unless that
  leaves nothing and the block is wider than `max_chunk_tokens` (the step's chunk limit: the
  per-entry cap when given, else the token budget): such a chunk advances sub-block and
  re-aligns at the next boundary. Then the chunk stops at the earliest of: the next block
  boundary (a chunk starting mid-block), the last cacheable boundary floor((N-1)/B)*B, the
  prompt's partial-tail boundary floor((P-1)/HBS)*HBS with partial hits (when it lies past the
  last cacheable boundary and inside the prompt), the block-floored Marconi junction.
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
  inside = [s for s in stops if start < s < end]
  if inside:
    end = min(inside)
  return max(end - start, 0)


# ---------------------------------------------------------------------------------------------
# Admission counts (§2.1, §2.4.3)
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Worker-side recurrent state slots and copies (§5.1-5.4)
# ---------------------------------------------------------------------------------------------


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
