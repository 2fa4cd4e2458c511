"""Per-kind KV cache group rules (vLLM §2): full attention, sliding window, recurrent.

Each kind's module implements the same rules, dispatched once through `rules(spec)`; outside
this package the core reads them (or the `Layout` fields derived from them) and compares no
kind or mode.

Lookup (vLLM §2.2-§2.5, §3):

  find_hit(lay, spec, need, cached, cap, drop)       the longest hit (L, lo) of one group
  valid_ends(spec, need, cached, cs, aligned, lead)  where a hit may end (the closed form)
  hit_lo(spec, hi, need)                             first hit-mask position (closed form)
  eagle_cap(spec, cur, drop, max_len)                the finder's cap in the EAGLE fixed point
  fine_valid(lay, spec, fine_cached, cached)         partial-hit valid ends (not full attention)
  fine_hit(lay, spec, g, hit, found, cached, fine, fa, pos)   partial-hit mask and blocks

Admission and allocation (§2.1-§2.5):

  blocks_needed(spec, d)                             (blocks, refused) for a `BlockDemand`
  own_partial(spec, state, r, g, is_new)             i32 copy-on-write block of an own entry
  own_cow(spec, state, r, g, is_new)                 bool: the same, in `allocate_slots`
  place_blocks(spec, p)                              where fresh blocks go (`Placement`)
  skipped_blocks(spec, tokens)                       leading blocks no longer needed
  frees_skipped(spec)                                whether a running request releases blocks
  before_skipped_free(lay, state, spec, row, drop, k, j0)      pins among the dropped (swa)
  after_skipped_free(state, spec, r, g, row, c)      releases beyond the skipped (align state)
  finish_pin_mask(spec, keyed, pos)                  blocks a finished request pins (SPEC B1)

Key registration (§1.7, §2.3.4, §2.4.7, §2.5):

  eagle_lookahead(spec), cache_mask(spec, pos, align, retention, boundaries)
  tail_boundary(prompt, hbs, eagle), tail_block(spec, t, n), tail_needs_key(state, blk, t,
  cond), tail_pending(spec, g, i, ids, t, prim, extra, step, nb, acc)   the prompt-tail entry
  (full attention and recurrent only: `tail_boundaries`)

Layout (`layout.derive_layout`, derived once per config):

  KEEPS_PREFIX, RECURRENT                            static properties of the kind
  hit_need(spec)                                     `SpecGroup.need`
  disables_caching(spec), without_caching(spec)      recurrent mode none turns caching off
  is_align(spec)                                     recurrent mode align (`Layout.align_bs`)
  caches_prompt_tail(spec, partial)                  `Layout.tail_groups`
  takes_fine_keys(spec, hbs)                         `Layout.fine_key_groups` (fine keys)

Host-side cost model of FLOP-aware eviction (SPEC B2, NumPy):

  prefix_flops(spec, tokens, linear, quadratic), block_flops(spec, end, linear, quadratic),
  layer_costs(model, spec, block_size, share, lin_quad), MLP_PRIORITY (`carries_mlp`)

plus each kind's own helpers (`find`, `retention_mask`). The worker-side rules of recurrent
groups (state slots, the engine's kernel chunk rule) are not dispatched: `recurrent_slots`.
"""

from hybrid_cache.core.groups import full_attention
from hybrid_cache.core.groups import recurrent
from hybrid_cache.core.groups import sliding_window

RULES = {"full": full_attention, "swa": sliding_window, "mamba": recurrent}

# the kinds that register the prompt-tail partial entry (vLLM `_cache_partial_tail_block`)
TAIL_RULES = (full_attention, recurrent)


def rules(spec):
  """The module of rules for `spec.kind` ("full", "swa" or "mamba")."""
  return RULES[spec.kind]


def carries_mlp(kinds) -> list[bool]:
  """Per group (`kinds`: each group's rules module), whether its layers' costs include the
  cost model's MLP layers: the groups of the present kind with the lowest `MLP_PRIORITY`."""
  first = min(k.MLP_PRIORITY for k in kinds)
  return [first == k.MLP_PRIORITY for k in kinds]


def tail_boundaries(prompt, hbs: int, eagle: bool) -> dict:
  """{rules module: prompt-tail boundary t} of every kind that registers the prompt-tail entry
  (`TAIL_RULES`, in that order), for a prompt of `prompt` tokens (§2.5)."""
  return {kind: kind.tail_boundary(prompt, hbs, eagle) for kind in TAIL_RULES}
