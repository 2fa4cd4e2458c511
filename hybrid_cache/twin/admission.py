"""Admission accounting of the plain-Python twin (§2.1, §2.4.3, §4.2): blocks needed, the fit.

Jitted twins: `core/admission.py` (`blocks_needed`), `core/step.py` (`fits`) and, for a shared
byte budget, `core/byte_budget.py` (`fits`). The per-kind counts are pure rules in
`twin/rules.py` (`generic_blocks_needed`, `mamba_align_blocks_needed`); a recurrent hit block
registered in the current step makes admission impossible (same-step rule, §2.4.6).
"""

from __future__ import annotations

from hybrid_cache.twin import block_pool
from hybrid_cache.twin import byte_budget
from hybrid_cache.twin import rules
from hybrid_cache.twin.state import NULL
from hybrid_cache.twin.state import Request
from hybrid_cache.twin.state import TwinState


def skipped_tokens(s: TwinState, gid: int, computed: int) -> int:
  """Tokens of group `gid` no longer needed once `computed` are computed (§2.1)."""
  g = s.groups[gid]
  if g.kind == "mamba" and s.mode[gid] == "none":
    return 0
  return rules.num_skipped_tokens(g.kind, computed, g.window)


def admission_cap(s: TwinState, gid: int) -> int | None:
  """A window group's cap on the full-sequence count (vLLM's SWA admission cap), else None."""
  g = s.groups[gid]
  if g.kind != "swa":
    return None
  tokens = min(g.window - 1 + s.config.max_num_batched_tokens, s.config.max_model_len)
  return rules.cdiv(tokens, s.bs[gid]) + 1


def blocks_needed(
  s: TwinState,
  req: Request,
  gid: int,
  num_tokens: int,
  num_tokens_main: int,
  hits: list[int],
  total_computed: int,
  cap: bool,
  hit_tokens: int = 0,
) -> int:
  """Blocks group `gid` needs for `num_tokens` (S32 admission counts; `cap`: the full-sequence
  gate's window cap)."""
  bs = s.bs[gid]
  row_len = len(req.rows[gid]) if req.rows else 0
  running = req.num_cached is not None
  ref = lambda b: s.ref[b]  # noqa: E731
  # §2.5: the hit ends inside this group's last hit block -> one more block for the CoW
  cow = s.partial and bool(hits) and hit_tokens % bs != 0
  if s.groups[gid].kind == "mamba":
    last = hits[-1] if hits else NULL
    if not running and last != NULL and s.key[last] in s.cached_this_step:
      return s.config.pool_size + 1  # same-step rule (§2.4.6): impossible count
    if s.mode[gid] == "align":
      return rules.mamba_align_blocks_needed(
        num_tokens_main=num_tokens_main,
        block_size=bs,
        num_spec_blocks=s.spec_s,
        row_len=row_len,
        already_allocated=running,
        hits=hits,
        hit_ref_cnt=ref,
        partial_cow=cow or gid in req.partial,
      )
    num_tokens = num_tokens + bs * s.spec_s
  return rules.generic_blocks_needed(
    num_tokens=num_tokens,
    block_size=bs,
    row_len=row_len,
    running=running,
    hits=hits,
    hit_ref_cnt=ref,
    skipped_tokens=skipped_tokens(s, gid, total_computed),
    admission_cap=admission_cap(s, gid) if cap else None,
    partial_cow=cow,
  )


def fits(s: TwinState, counts: list[int], watermark: int) -> bool:
  """vLLM's admission check (§4.2): the blocks needed (`counts`, per group) plus the
  watermark fit the free blocks; with two pools (`state_slots`) each pool's groups fit that
  pool, the watermark counting pages only; with a shared `byte_budget` they also fit it in
  bytes beside the held blocks (`hybrid_cache.core.byte_budget`)."""
  if not s.config.state_slots:
    return sum(counts) + watermark <= block_pool.num_free(s)
  need = [0, 0]
  for g, c in enumerate(counts):
    need[s.group_pool[g]] += c
  if need[0] + watermark > block_pool.num_free(s, 0) or need[1] > block_pool.num_free(s, 1):
    return False
  if s.config.byte_budget is None:
    return True
  return byte_budget.fits(s, need, watermark)
