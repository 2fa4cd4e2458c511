"""What a checkpoint cache's units cost in bytes (`CacheSizes`) and save in FLOPs (`FlopsTable`).

Part of the checkpoint cache (`checkpoint_cache.py`, issue 15, item 2). Bytes are exact, one
capacity for both kinds: checkpoints cost `ckpt_bytes` each (never padded to a page) and KV is
allocated in pages of B tokens (`block_size`). A page is shared by the branches that agree on
all of its cached tokens; branches that diverge inside a page each hold a copy, and a branch
that ends inside a page holds a whole page. With N_j = the present nodes in which page j ends
plus the present leaves that end inside a page, KV bytes = kv_bytes_per_token * B * sum N_j
(`UnitCache._chain_pages`). B = 1 is token-exact KV. A checkpoint is the recurrent state after
its unit, plus the sliding-window KV of the last `swa_window` tokens when the model has
sliding-window layers.

FLOPs: a hit at depth d units saves F(d U), F = `CostModel.prefill_flops`, tabulated per
depth once for every cache of a replay (`flops_table`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hybrid_cache.sim.cost_model import CostModel


@dataclasses.dataclass(frozen=True)
class CacheSizes:
  """Byte model of a cache (see the module docstring)."""

  capacity: int
  unit: int
  block_size: int
  kv_page_bytes: int  # kv_bytes_per_token * block_size
  ckpt_bytes: int  # recurrent state (+ one window of sliding-window KV); 0 = attention only

  @classmethod
  def of(cls, model: CostModel, capacity_bytes: float, unit: int, block_size: int):
    for name, v in (("unit", unit), ("block_size", block_size)):
      if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if not (capacity_bytes > 0 and np.isfinite(capacity_bytes)):
      raise ValueError(f"capacity_bytes must be finite and > 0, got {capacity_bytes!r}")
    ckpt = int(model.state_bytes) + int(model.swa_kv_bytes_per_token) * int(model.swa_window)
    return cls(
      int(capacity_bytes),
      int(unit),
      int(block_size),
      int(model.kv_bytes_per_token) * int(block_size),
      ckpt,
    )

  @property
  def recurrent(self) -> bool:
    """A hit needs a checkpoint at its depth (recurrent or sliding-window layers)."""
    return self.ckpt_bytes > 0


class FlopsTable:
  """`int(model.prefill_flops(d * unit))` for d = 0, 1, ..., extended on demand; one table is
  shared by every cache of a replay (`flops_table`)."""

  def __init__(self, model: CostModel, unit: int):
    self.model, self.unit = model, unit
    self.values: list[int] = []

  def extend(self, depth: int) -> list[int]:
    """The table, holding at least depths 0..depth."""
    v = self.values
    while len(v) <= depth:
      v.append(int(self.model.prefill_flops(len(v) * self.unit)))
    return v


_TABLES: dict[tuple[CostModel, int], FlopsTable] = {}


def flops_table(model: CostModel, unit: int) -> FlopsTable:
  """The shared `FlopsTable` of (model, unit)."""
  t = _TABLES.get((model, unit))
  if t is None:
    t = _TABLES[(model, unit)] = FlopsTable(model, unit)
  return t


__all__ = ["CacheSizes", "FlopsTable", "flops_table"]
