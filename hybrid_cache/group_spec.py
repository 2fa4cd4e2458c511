"""One KV-cache group of the cache core: its spec (`GroupSpec`) and its resolved form.

A group is the layers sharing one KV-cache spec, as vLLM's KV-cache groups: full attention,
sliding window or recurrent ("mamba": Mamba2, GDN, linear attention, with vLLM's caching mode
"none", "align" or "all"). `GroupSpec` is what a configuration states (the block size may be left
to the config's default, the kind given by an alias); `ResolvedGroup` is what the core computes
with (`config.CacheConfig.resolved_groups`: block size and EAGLE flag resolved). Both are frozen
and hashable, like `config.CacheConfig`.
"""

from __future__ import annotations

import dataclasses

from hybrid_cache.config_checks import _check_int

GROUP_KINDS = ("full", "swa", "mamba")
_KIND_ALIASES = {
  "full": "full",
  "full_attention": "full",
  "attention": "full",
  "swa": "swa",
  "sliding_window": "swa",
  "mamba": "mamba",
  "recurrent": "mamba",
  "gdn": "mamba",
  "mamba2": "mamba",
}
RECURRENT_MODES = ("none", "align", "all")


@dataclasses.dataclass(frozen=True)
class GroupSpec:
  """One KV-cache group (layers sharing a spec).

  Attributes:
    kind: "full" (full attention), "swa" (sliding window) or "mamba" (any recurrent
      layer: Mamba2, GDN, linear attention).
    block_size: tokens per block; None = the config's default `block_size`.
    window: sliding window in tokens (swa only, >= 1).
    mode: recurrent caching mode (mamba only): "none", "align" or "all".
    eagle: this group holds EAGLE/MTP draft layers (lookup drops one unit).
  """

  kind: str
  block_size: int | None = None
  window: int | None = None
  mode: str = "align"
  eagle: bool = False

  def __post_init__(self):
    kind = _KIND_ALIASES.get(self.kind) if isinstance(self.kind, str) else None
    if kind is None:
      raise ValueError(f"groups[].type must be one of {GROUP_KINDS}, got {self.kind!r}")
    object.__setattr__(self, "kind", kind)
    if self.block_size is not None:
      _check_int("groups[].block_size", self.block_size, minimum=1)
    if kind == "swa":
      if self.window is None:
        raise ValueError("groups[].window is required for a swa group (tokens, >= 1)")
      _check_int("groups[].window", self.window, minimum=1)
    elif self.window is not None:
      raise ValueError(f"groups[].window is only valid for swa groups, got {self.window!r}")
    if self.mode not in RECURRENT_MODES:
      raise ValueError(f"groups[].mode must be one of {RECURRENT_MODES}, got {self.mode!r}")


@dataclasses.dataclass(frozen=True)
class ResolvedGroup:
  """A group with its block size resolved (what the core computes with)."""

  kind: str
  block_size: int
  window: int | None
  mode: str
  eagle: bool

  @property
  def window_blocks(self) -> int:
    """Blocks that cover the W - 1 tokens a window needs before a position: ceil((W-1)/B)."""
    assert self.window is not None
    return -(-(self.window - 1) // self.block_size)

  @property
  def swa_need(self) -> int:
    """Contiguous blocks an SWA hit needs before the resume point: ceil((W-1)/B) (+1 EAGLE)."""
    return self.window_blocks + (1 if self.eagle else 0)
