"""What a group keeps, frees and pins: skipped tokens, the retention masks, the finish pins.

vLLM 0.33's `remove_skipped_blocks` (§2.1, §2.3.3, §2.4.4: a window or recurrent group frees
what no later step reads, reference §7 S07 freeing sequence), its retention masks (§2.3.4,
§2.4.7, §6.2: which blocks may be registered, S21/S22 masks) and the pinned tier's pins (SPEC
B1). Pure rules over plain ints and lists (`rules.py`).
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence

from hybrid_cache.twin.block_arith import floor_to


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
