"""One entry of a scheduler step: the loop body of `scheduler.schedule_step` (vLLM §4).

A waiting request is looked up (coordinator), the chunk is limited by the token budget,
`max_tokens`, `max_model_len` and the block-aligned split (`split`), then `allocate_slots` runs
with the full-sequence gate and the watermark for admissions. Entries run sequentially, so a
later entry sees the keys an earlier one registered in the same step (§2.4.6).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from hybrid_cache import policies
from hybrid_cache.core import admission
from hybrid_cache.core import byte_budget
from hybrid_cache.core import coordinator
from hybrid_cache.core import groups
from hybrid_cache.core.allocate import allocate_slots
from hybrid_cache.core.allocate import remove_skipped
from hybrid_cache.core.block_pool import free_counts
from hybrid_cache.core.fresh_state import policy_columns
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.split import split
from hybrid_cache.core.state import BIG
from hybrid_cache.core.state import STATUS_EMPTY
from hybrid_cache.core.state import STATUS_RUNNING
from hybrid_cache.core.state import STATUS_WAITING
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import QueueCounts
from hybrid_cache.core.state import ReqGroup
from hybrid_cache.core.state import ReqInfo

# An entry's skip reason (its `reason` output, `outputs.ENTRY_SCALARS`; the manager maps the
# codes to `EntryResult.reason`): none (scheduled, or a padding entry); `allocate_slots`
# refused the chunk (free blocks, the full-sequence gate or the watermark); the chunk came out
# empty (n == 0: no token budget left for it).
REASON_NONE, REASON_ALLOC, REASON_BUDGET = 0, 1, 2


# ---------------------------------------------------------------------------------------------
# one entry, one step


def lookup_or_zero(lay, state, r, is_new, keys=None):
  info = ReqInfo(state.req_info[r])
  g_n, mb = lay.num_groups, lay.max_blocks

  def yes(_):
    return coordinator.lookup(lay, state, state.req_hashes[r], info.tokens, keys)

  def no(_):
    z = jnp.int32(0)
    return dict(
      hit=z,
      alone=jnp.zeros((g_n,), jnp.int32),
      hit_mask=jnp.zeros((g_n, mb), bool),
      found=jnp.full((g_n, mb), -1, jnp.int32),
      spb=z,
    )

  return jax.lax.cond(is_new, yes, no, None)


class StepInput(NamedTuple):
  """One entry of a step (the input of `scheduler.schedule_step`).

  Attributes:
    slot: i32, the request's slot.
    max_tokens: i32, the entry's token cap (-1 = none).
    valid: bool, False for padding entries.
    keys: (query keys, their index buckets) of the slot's hashes (`coordinator.query_keys`,
      computed once per entry and shared by its lookup and insert), or None.
  """

  slot: jax.Array
  max_tokens: jax.Array
  valid: jax.Array
  keys: tuple[jax.Array, jax.Array] | None = None


class StepCarry(NamedTuple):
  """The carry of `scheduler.schedule_step`'s loop, from entry to entry.

  Attributes:
    state: the cache state.
    budget: i32, tokens left in the step's budget.
    queued: i32[2], free blocks in the normal queue and in the pinned tier
      (`QueueCounts`); i32[2, 2] with two pools (pages, state slots;
      `block_pool.free_counts`).
  """

  state: CacheState
  budget: jax.Array
  queued: jax.Array


def placement_cuts(lay: Layout, state: CacheState, r, admitted, info, tokens) -> tuple:
  """The chunk cuts (i32 token positions, `BIG` = none) of a stateful placement policy with
  `chunk_cuts` (`hybrid_cache.policies`, seam `placement`) for request slot `r`: where it keeps
  a state, so that an align-mode chunk ends there (`split.split`). () for other policies and
  without an align-mode recurrent group (nothing is traced then). `info`: the slot's
  `ReqInfo` row."""
  placement = policies.core_policy("placement", lay.config.placement)
  if not lay.align_bs or not hasattr(placement, "chunk_cuts"):
    return ()
  off = policy_columns(lay.config, lay)[0]
  table = state.policy_state[:, off : off + placement.state_size(lay)]
  return placement.chunk_cuts(lay, table, r, admitted, info.prompt, tokens)


def schedule_entry(lay: Layout, carry, x):
  """One entry of a step (the body of `scheduler.schedule_step`'s loop over its entries).

  One variant serves every step (issue 29). It replaced an admit-only variant (no entry
  running: neither the `remove_skipped` cond nor the lookup's cond, whose state copies XLA:CPU
  pays per entry), a second program per compile key (~3.5 s cold). The one-program step (this
  variant in `scheduler.schedule_step`'s loop; the two changes were not measured apart) on
  `experiments/bench_scheduler.py`, 5 interleaved rounds, idle, 2026-11-29, µs per request:
  batch 64 admissions 52.1 -> 63.2 (1.21x), batch 16 89.3 -> 89.2, batch 1 555 -> 505.
  """
  state, budget, queued = carry.state, carry.budget, carry.queued
  r, max_tok, valid, keys = x.slot, x.max_tokens, x.valid, x.keys
  info = ReqInfo(state.req_info[r])
  status = info.status
  has_budget = budget > 0
  is_new = valid & (status == STATUS_WAITING) & has_budget
  lk = lookup_or_zero(lay, state, r, is_new, keys)
  hit = jnp.where(is_new, lk["hit"], 0)
  spb_new = jnp.where(state.marconi_junction != 0, lk["spb"], 0)
  spb = jnp.where(is_new, spb_new, info.spb)
  num_tokens = info.tokens
  start = info.computed + hit
  remaining = num_tokens - start
  cap = jnp.where(max_tok >= 0, max_tok, BIG)
  n0 = jnp.maximum(jnp.minimum(jnp.minimum(remaining, budget), cap), 0)
  # a running request never reaches max_model_len (vLLM's running loop leaves the last
  # position for the token it samples)
  mml = state.max_model_len
  n0 = jnp.where(is_new, n0, jnp.maximum(jnp.minimum(n0, mml - start - 1), 0))
  max_chunk = jnp.where(max_tok >= 0, max_tok, state.max_batched_tokens)
  cuts = placement_cuts(lay, state, r, is_new, info, num_tokens)
  n = split(lay, start, n0, num_tokens, info.prompt, spb, max_chunk, cuts)
  active = valid & (status != STATUS_EMPTY)
  attempt = active & (n > 0)

  # skip mask per group: hits before the out-of-window / superseded prefix are not kept
  pos = jnp.arange(lay.max_blocks)
  hit_ids = []
  for g, spec in enumerate(lay.groups):
    skip = groups.rules(spec).skipped_blocks(spec, hit)
    keep = lk["hit_mask"][g] & (pos >= skip) & is_new
    hit_ids.append(jnp.where(keep, lk["found"][g], 0))
  hit_ids = jnp.stack(hit_ids)

  # allocate_slots without `lax.cond` over the state (XLA:CPU copies the state leaves a cond
  # passes through): every write below is masked by `attempt` / `ok`
  c = info.computed

  def release_skipped(state_and_queued):
    s = remove_skipped(lay, state_and_queued[0], r, c)
    return s, free_counts(lay, s)

  # only a running request (status RUNNING) continues with `~is_new`
  state, queued = jax.lax.cond(attempt & ~is_new, release_skipped, lambda sq: sq, (state, queued))
  main = start + n
  need_tokens = jnp.minimum(main + lay.lookahead, state.max_model_len)
  count, impossible = admission.blocks_needed(
    lay, state, r, is_new, hit, hit_ids, need_tokens, main
  )
  # free blocks (= block_pool.num_free(state)); with two pools each pool's count fits its own
  # free blocks, and the watermark counts pages only (`CacheConfig.state_slots`)
  free = QueueCounts(queued).free + QueueCounts(queued).pinned
  if lay.state_pool:
    pages = jnp.asarray([1, 0], jnp.int32)
    # with a shared byte budget, also in bytes beside the held blocks (`core/byte_budget.py`)
    held = byte_budget.held_bytes(state) if lay.byte_budget else None

    def fits(need, watermark=None):
      ok = jnp.all(need + (0 if watermark is None else watermark * pages) <= free)
      if lay.byte_budget:
        ok &= byte_budget.fits(state, held, need, 0 if watermark is None else watermark)
      return ok
  else:

    def fits(need, watermark=None):
      return (need if watermark is None else need + watermark) <= free

  ok = attempt & ~impossible & fits(count)
  full_main = num_tokens  # full_sequence_must_fit (a runtime parameter)
  full_need = jnp.minimum(num_tokens, state.max_model_len)
  fcount, _ = admission.blocks_needed(
    lay, state, r, is_new, hit, hit_ids, full_need, full_main, swa_cap=True
  )
  others = (state.req_status == STATUS_RUNNING) & (jnp.arange(lay.max_requests) != r)
  watermark = jnp.where(jnp.any(others), state.watermark_blocks, 0)
  # the watermark applies to the full-sequence gate too (vLLM `allocate_slots`: both counts
  # are checked against the free blocks less the watermark)
  ok &= ~is_new | fits(fcount, watermark) | (state.full_sequence_must_fit == 0)
  ok &= ~is_new | fits(count, watermark)
  spb_row = jnp.where(attempt & (ok | ~is_new), spb, info.spb)
  state = state.replace(req_info=ReqInfo(state.req_info)[r].set(spb=spb_row))
  lens_now = ReqGroup(state.req_group)[r].length
  bss = jnp.asarray(lay.block_sizes)
  hit_len = (hit + bss - 1) // bss if lay.partial else hit // bss
  lens_before = jnp.where(attempt & is_new, hit_len, lens_now)
  alloc = allocate_slots(lay, state, r, is_new, hit, hit_ids, n, ok, queued, keys)
  state, queued = alloc.state, alloc.queued
  inf = state.req_info[r]
  done = ReqInfo(inf).set(computed=start + n, status=STATUS_RUNNING)
  state = state.replace(req_info=state.req_info.at[r].set(jnp.where(ok, done, inf)))
  computed = ReqInfo(state.req_info)[r].computed
  scheduled = jnp.where(ok, n, 0)
  reason = jnp.where(
    attempt & ~ok, REASON_ALLOC, jnp.where(valid & (n == 0), REASON_BUDGET, REASON_NONE)
  )
  out = dict(
    admission=is_new,
    hit=hit,
    alone=lk["alone"],
    hit_blocks=jnp.sum(lk["hit_mask"], axis=1).astype(jnp.int32),
    spb=lk["spb"],
    scheduled=scheduled,
    reason=reason,
    computed=computed,
    lens_before=lens_before,
    lens_after=ReqGroup(state.req_group)[r].length,
    row=state.tables[r],
  )
  if lay.partial:
    out["cows"] = alloc.cows  # i32[G, 2]: this entry's copy-on-write (source, copy) per group
  return carry._replace(state=state, budget=budget - scheduled, queued=queued), out
