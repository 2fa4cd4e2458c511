"""One byte budget as two pools: KV pages and recurrent-state slots (`CacheConfig.state_slots`).

vLLM keeps one pool of equal pages, so a recurrent state is padded to a KV page or a KV page is
inflated to a state's bytes (`../shared/reference/vllm_hybrid_cache.md` §2.6). With a second
pool each costs its own bytes: a page holds one KV block of every attention group, a slot one
state of every recurrent layer. The split between the two is a fixed fraction of the budget
(as SGLang's `mamba_full_memory_ratio`); the core then runs vLLM's rules inside each pool.
"""

from __future__ import annotations

import math


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
  for name, v in (
    ("capacity_bytes", capacity_bytes),
    ("page_bytes", page_bytes),
    ("slot_bytes", slot_bytes),
  ):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
      raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
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
