"""One entry of a scheduler step in the plain-Python twin (vLLM §4, §5).

Jitted twins: `core/step.py` (`schedule_entry`) and `core/split.py`. A waiting request is looked
up (`coordinator.lookup`), its chunk limited by the token budget, `max_tokens`, `max_model_len`
and the block-aligned split with the Marconi junction (§4.3/4, `rules.block_aligned_split`),
then `allocate.allocate_slots` runs; the result carries the align-mode pre-forward state copies
(§5.2, `rules.pre_forward_copy`) and each recurrent group's state slots (§5.1-5.4).
"""

from __future__ import annotations

from hybrid_cache.twin import allocate
from hybrid_cache.twin import coordinator
from hybrid_cache.twin import rules
from hybrid_cache.twin.state import Request
from hybrid_cache.twin.state import TwinState
from hybrid_cache.types import EntryResult
from hybrid_cache.types import RecurrentSlots
from hybrid_cache.types import ScheduleEntry
from hybrid_cache.types import StateCopy


def split(s: TwinState, req: Request, start: int, n: int, max_chunk: int) -> int:
  """The chunk of n tokens from `start`, cut by the block-aligned split (align groups only)."""
  if s.split_bs is None:
    return n
  cut = getattr(s.placement, "chunk_cuts", None)
  return rules.block_aligned_split(
    start,
    n,
    num_tokens=len(req.tokens),
    num_prompt_tokens=req.num_prompt_tokens,
    block_size=s.split_bs,
    use_eagle=s.config.use_eagle,
    shared_prefix_boundary=req.boundary,
    max_chunk_tokens=max_chunk,
    partial_hash_block=s.hbs if s.partial else None,
    junction_block_size=s.config.junction_block_size,
    cuts=() if cut is None else cut(s, req, req.num_cached is None),
  )


def state_copies(s: TwinState, req: Request, computed_before: int, n: int) -> list[StateCopy]:
  """The align groups' pre-forward state copies of the chunk (§5.2)."""
  out = []
  for gid in range(len(s.groups)):
    if s.mode[gid] != "align":
      continue
    copy, curr = rules.pre_forward_copy(req.state_col.get(gid), computed_before, n, s.bs[gid])
    req.state_col[gid] = curr
    if copy is not None:
      row = req.rows[gid]
      out.append(StateCopy(req.name, gid, row[copy[0]], row[copy[1]], 0))
  return out


def state_slots(s: TwinState, req: Request, start: int, n: int) -> tuple[RecurrentSlots, ...]:
  """Each recurrent group's read / write / checkpoint blocks for the chunk (§5.1-5.4)."""
  out = []
  for gid, mode in enumerate(s.mode):
    if mode is not None:
      read, write, ckpts = rules.recurrent_state_slots(mode, req.rows[gid], start, n, s.bs[gid])
      out.append(RecurrentSlots(gid, read, write, ckpts))
  return tuple(out)


def schedule_one(s: TwinState, entry: ScheduleEntry, budget: int):
  """(EntryResult, state copies, tokens scheduled) of one entry with `budget` tokens left."""
  req = s.reqs[entry.req]
  ng = len(s.groups)
  no_new = tuple(() for _ in range(ng))
  waiting = req.status in ("waiting", "preempted")
  cfg_budget = s.config.max_num_batched_tokens
  cap = entry.max_tokens if entry.max_tokens is not None else budget
  # the split's chunk limit: the entry's cap, else the configured budget (not what is left)
  max_chunk = entry.max_tokens if entry.max_tokens is not None else cfg_budget

  def result(admission, hit, n, reason, new=no_new, slots=()):
    return EntryResult(req.name, admission, hit, n, reason, req.num_computed, new, slots)

  if waiting:
    if budget <= 0:
      return result(False, None, 0, "no_token_budget"), [], 0
    info, hit_rows = coordinator.lookup(s, req.fine_hashes, len(req.tokens))
    req.boundary = info.shared_prefix_boundary if s.config.marconi_junction else 0
    hit = info.hit_tokens
    n = min(len(req.tokens) - hit, cap, budget)
    n = split(s, req, hit, n, max_chunk)
    if n <= 0:
      return result(True, info, 0, "no_token_budget"), [], 0
    new = allocate.allocate_slots(s, req, n, hit, hit_rows)
    if new is None:
      return result(True, info, 0, "allocate_slots_failed"), [], 0
    req.status = "running"
    req.num_computed = hit
    copies = state_copies(s, req, hit, n)
    slots = state_slots(s, req, hit, n)
    req.num_computed = hit + n
    return result(True, info, n, None, tuple(tuple(r) for r in new), slots), copies, n
  n = min(len(req.tokens) - req.num_computed, cap, budget)
  # a running request never reaches max_model_len (vLLM's running loop: the last position
  # is left for the token it samples)
  n = min(n, s.config.max_model_len - req.num_computed - 1)
  if n > 0:
    n = split(s, req, req.num_computed, n, max_chunk)
  if n <= 0:
    return result(False, None, 0, "no_token_budget"), [], 0
  new = allocate.allocate_slots(s, req, n, 0, None)
  if new is None:
    return result(False, None, 0, "allocate_slots_failed"), [], 0
  copies = state_copies(s, req, req.num_computed, n)
  slots = state_slots(s, req, req.num_computed, n)
  req.num_computed += n
  return result(False, None, n, None, tuple(tuple(r) for r in new), slots), copies, n
