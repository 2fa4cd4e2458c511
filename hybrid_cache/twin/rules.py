"""Pure per-group rules of vLLM 0.33's hybrid prefix cache (reference §2–§5).

Everything here is a small function over plain ints and lists, so the rules can be tested
one by one (reference §7: S06 scan table, S07 freeing sequence, S21/S22 masks, S30 copies,
S32 admission counts) and shared by the twin's rule modules (`coordinator`, `admission`,
`allocate`, `cache_keys`, `release`, `step`), which call them as `rules.<name>`. Each family has
its own file, re-exported here:

  lookup_rules.py       which blocks a lookup hits, per kind (§2.2-§2.5: `find_full`,
                        `find_full_fine`, `find_swa`, `find_mamba`, `find_mamba_fine`).
  retention_rules.py    what a group frees (skipped tokens, §2.1, §2.3.3, §2.4.4), may register
                        (retention masks, §2.3.4, §2.4.7, §6.2) and pins at finish (SPEC B1).
  schedule_rules.py     the align-mode chunk split (§4.3), admission counts (§2.1, §2.4.3) and
                        align mode's block layout.
  state_copy_rules.py   worker-side recurrent state slots and copies (§5.1-§5.4).
  block_arith.py        `cdiv`, `floor_to`.

Conventions: a "hit entry list" is position-indexed; entry i is `None` (null block) or the
tuple of block ids of the member groups of one spec group for group-block i. `cached(i)`
returns such a tuple or None when block i misses in any member group.
"""

from __future__ import annotations

from hybrid_cache.twin.block_arith import cdiv
from hybrid_cache.twin.block_arith import floor_to
from hybrid_cache.twin.lookup_rules import CachedFn
from hybrid_cache.twin.lookup_rules import Entry
from hybrid_cache.twin.lookup_rules import find_full
from hybrid_cache.twin.lookup_rules import find_full_fine
from hybrid_cache.twin.lookup_rules import find_mamba
from hybrid_cache.twin.lookup_rules import find_mamba_fine
from hybrid_cache.twin.lookup_rules import find_swa
from hybrid_cache.twin.lookup_rules import swa_need
from hybrid_cache.twin.retention_rules import finish_pin_indices
from hybrid_cache.twin.retention_rules import mamba_cacheable
from hybrid_cache.twin.retention_rules import num_skipped_tokens
from hybrid_cache.twin.retention_rules import skipped_indices
from hybrid_cache.twin.retention_rules import swa_cacheable
from hybrid_cache.twin.schedule_rules import FRESH
from hybrid_cache.twin.schedule_rules import block_aligned_split
from hybrid_cache.twin.schedule_rules import checkpoint_position
from hybrid_cache.twin.schedule_rules import generic_blocks_needed
from hybrid_cache.twin.schedule_rules import mamba_align_blocks_needed
from hybrid_cache.twin.schedule_rules import mamba_align_layout
from hybrid_cache.twin.state_copy_rules import post_forward_copy
from hybrid_cache.twin.state_copy_rules import pre_forward_copy
from hybrid_cache.twin.state_copy_rules import recurrent_state_slots

__all__ = [
  "FRESH",
  "CachedFn",
  "Entry",
  "block_aligned_split",
  "cdiv",
  "checkpoint_position",
  "find_full",
  "find_full_fine",
  "find_mamba",
  "find_mamba_fine",
  "find_swa",
  "finish_pin_indices",
  "floor_to",
  "generic_blocks_needed",
  "mamba_align_blocks_needed",
  "mamba_align_layout",
  "mamba_cacheable",
  "num_skipped_tokens",
  "post_forward_copy",
  "pre_forward_copy",
  "recurrent_state_slots",
  "skipped_indices",
  "swa_cacheable",
  "swa_need",
]
