"""Per-kind KV cache group rules (vLLM §2): full attention, sliding window, recurrent.

Each kind's module implements the same functions, dispatched once through `rules(spec)`:

  find_hit(lay, spec, need, cached, cap, drop)       the longest hit (L, lo) of one group
  valid_ends(spec, need, cached, cs, aligned, lead)  where a hit may end (the closed form)
  skipped_blocks(spec, tokens)                       leading blocks no longer needed
  finish_pin_mask(spec, keyed, pos)                  blocks a finished request pins (SPEC B1)
  frees_skipped(spec)                                whether a running request releases blocks
  before_skipped_free(config, state, spec, row, drop, k, j0)   pins among the dropped (swa)
  after_skipped_free(state, spec, r, g, row, c)      releases beyond the skipped (align state)

plus each kind's own helpers (`find`, `retention_mask`).
"""

from hybrid_cache.core.groups import full_attention
from hybrid_cache.core.groups import recurrent
from hybrid_cache.core.groups import sliding_window

RULES = {"full": full_attention, "swa": sliding_window, "mamba": recurrent}


def rules(spec):
  """The module of rules for `spec.kind` ("full", "swa" or "mamba")."""
  return RULES[spec.kind]
