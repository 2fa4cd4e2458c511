"""One byte budget as two pools: KV pages and recurrent-state slots (`CacheConfig.state_slots`).

vLLM keeps one pool of equal pages, so a recurrent state is padded to a KV page or a KV page is
inflated to a state's bytes (`../shared/reference/vllm_hybrid_cache.md` §2.6). With a second
pool each costs its own bytes: a page holds one KV block of every attention group, a slot one
state of every recurrent layer. Two ways to size them from one budget:

* `split_byte_budget`: a fixed fraction of the budget as slots (as SGLang's
  `mamba_full_memory_ratio`); the core then runs vLLM's rules inside each pool, each limited
  by its ids.
* `shared_byte_budget`: both draw on the whole budget (`CacheConfig.byte_budget`): ids for
  either to fill it, and the core admits and evicts by bytes (`hybrid_cache.core.byte_budget`).
"""

from __future__ import annotations

import math


def _check_sizes(**sizes: float) -> None:
  """ValueError naming the first size that is not a finite number > 0."""
  for name, v in sizes.items():
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
      raise ValueError(f"{name} must be a finite number > 0, got {v!r}")


def split_byte_budget(
  capacity_bytes: float, page_bytes: float, slot_bytes: float, state_fraction: float
) -> tuple[int, int]:
  """(num_blocks, state_slots) for `CacheConfig`: `state_fraction` of `capacity_bytes` as state
  slots of `slot_bytes`, the rest as pages of `page_bytes`.

  num_blocks = floor((1 - f) * capacity / page) + 1 (the null block 0 costs nothing, as in
  the one-pool sizing `floor(capacity / page) + 1`), state_slots = floor(f * capacity / slot).
  Bytes used: (num_blocks - 1) * page + state_slots * slot <= capacity.

  Raises ValueError (naming the argument and its range) for a non-positive size, a fraction
  outside (0, 1), or a budget that leaves either pool without a usable block.
  """
  _check_sizes(capacity_bytes=capacity_bytes, page_bytes=page_bytes, slot_bytes=slot_bytes)
  f = state_fraction
  if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f < 1:
    raise ValueError(f"state_fraction must be a number in (0, 1), got {f!r}")
  num_blocks = int((1 - f) * capacity_bytes // page_bytes) + 1
  state_slots = int(f * capacity_bytes // slot_bytes)
  if num_blocks < 2:
    raise ValueError(
      f"capacity_bytes * (1 - state_fraction) must be >= page_bytes={page_bytes:g} (one page),"
      f" got {(1 - f) * capacity_bytes:g}"
    )
  if state_slots < 1:
    raise ValueError(
      f"capacity_bytes * state_fraction must be >= slot_bytes={slot_bytes:g} (one state slot),"
      f" got {f * capacity_bytes:g}"
    )
  return num_blocks, state_slots


# the shared budget is kept at most this many units (2^29: sums of block costs stay in int32)
_UNITS_MAX = 1 << 29


def shared_byte_budget(capacity_bytes: float, page_bytes: float, slot_bytes: float) -> dict:
  """`CacheConfig` fields for pages and state slots drawing on one byte budget
  (`CacheConfig.byte_budget`, `hybrid_cache.core.byte_budget`): num_blocks, state_slots,
  byte_budget, page_bytes, slot_bytes.

  Ids are sized so that they never bind before the bytes do: num_blocks = floor(capacity /
  page) + 1 (the null block), state_slots = floor(capacity / slot). The core counts in int32,
  so bytes are expressed in units of 2^k bytes, k the smallest with capacity / 2^k <= 2^29:
  the budget rounds down and each cost up (never more bytes than `capacity_bytes` are used;
  the rounding is at most one unit per block).

  Raises ValueError (naming the argument and its range) for a non-positive size or a budget
  smaller than one page or one slot.
  """
  _check_sizes(capacity_bytes=capacity_bytes, page_bytes=page_bytes, slot_bytes=slot_bytes)
  if capacity_bytes < max(page_bytes, slot_bytes):
    raise ValueError(
      f"capacity_bytes must be >= max(page_bytes, slot_bytes) = {max(page_bytes, slot_bytes):g},"
      f" got {capacity_bytes:g}"
    )
  unit = 1
  while capacity_bytes / unit > _UNITS_MAX:
    unit *= 2
  return {
    "num_blocks": int(capacity_bytes // page_bytes) + 1,
    "state_slots": int(capacity_bytes // slot_bytes),
    "byte_budget": int(capacity_bytes // unit),
    "page_bytes": math.ceil(page_bytes / unit),
    "slot_bytes": math.ceil(slot_bytes / unit),
  }
