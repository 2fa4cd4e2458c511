"""`JaxCacheManager`: the host wrapper of the jitted core (implements `types.CacheManager`).

The core runs on the host's CPU device whatever the default device is (its state is committed
there, so every jitted call runs there): on a GPU or TPU machine the model runs on the
accelerator and the cache core beside it on the CPU, as vLLM's manager runs in host Python,
without small scatter/gather programs and a device-to-host read per step on the accelerator.

Host work only: validate requests, compute chained hashes (`hashing.py`, extended on append), map
request names to state slots, queue the request rows that `add_request` / `append_tokens` write
and apply them in one jitted call before the next device call (`_flush`), pad schedule batches
to powers of 8 (`compile_cache.step_entries`), pull each call's results once with `np.asarray`,
and build the `types` records: the recurrent state slots of each scheduled chunk (computed by
the core, `recurrent_slots.state_slots`) and the recurrent state-copy plan (vLLM §5.2) derived
from the returned block tables.

Example::

  m = JaxCacheManager(CacheConfig(groups=(GroupSpec("full"), GroupSpec("mamba")),
                                  block_size=4, num_blocks=64))
  m.add_request("A", list(range(22)))
  m.schedule([ScheduleEntry("A")]).entries[0].scheduled_tokens  # 20 (align split)
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence

import jax
import numpy as np

from hybrid_cache import hashing
from hybrid_cache.config import CacheConfig
from hybrid_cache.core import compile_cache
from hybrid_cache.core import outputs
from hybrid_cache.core import scheduler
from hybrid_cache.core.fresh_state import init_state
from hybrid_cache.core.groups import recurrent_slots
from hybrid_cache.core.groups import rules as group_rules
from hybrid_cache.core.layout import layout
from hybrid_cache.core.policies import flop_aware
from hybrid_cache.core.policies import tuned
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.step import REASON_ALLOC
from hybrid_cache.core.step import REASON_BUDGET
from hybrid_cache.core.step import REASON_NONE
from hybrid_cache.types import EntryResult
from hybrid_cache.types import HitInfo
from hybrid_cache.types import PoolStats
from hybrid_cache.types import RecurrentSlots
from hybrid_cache.types import RequestView
from hybrid_cache.types import ScheduleEntry
from hybrid_cache.types import StateCopy
from hybrid_cache.types import StepResult

_REASONS = {  # the core's skip-reason codes (`step.REASON_*`) as `EntryResult.reason`
  REASON_NONE: None,
  REASON_ALLOC: "allocate_slots_failed",
  REASON_BUDGET: "no_token_budget",
}
_SLOT_ORDER = (  # `recurrent_slots.state_slots` columns in `RecurrentSlots` order
  recurrent_slots.SLOT_READ,
  recurrent_slots.SLOT_WRITE,
  recurrent_slots.SLOT_FIRST_CHECKPOINT,
  recurrent_slots.SLOT_NUM_CHECKPOINTS,
)


@dataclasses.dataclass
class _Req:
  name: str
  slot: int
  tokens: list[int]
  extras: hashing.RequestExtras
  hashes: np.ndarray
  num_prompt: int
  status: str = "waiting"
  num_computed: int = 0
  state_idx: dict[int, int] = dataclasses.field(default_factory=dict)
  # host mirror of the slot's block table (i32[G, MB]) and table lengths (list of ints) as the
  # last step left them (only a step changes them; release clears them), so `request_view`
  # needs no device read
  row: np.ndarray | None = None
  lens: list[int] | None = None


class JaxCacheManager:
  """Jitted cache core behind the host `CacheManager` protocol (see module docstring)."""

  def __init__(self, config: CacheConfig):
    if not isinstance(config, CacheConfig):
      raise ValueError(f"config must be a CacheConfig, got {type(config).__name__}")
    self.config = config
    self._lay = layout(config)
    self._columns = outputs.entry_columns(self._lay)
    # request rows written since the last device call, by slot (`_write`, `_flush`)
    self._pending: dict[int, _Req] = {}
    self._state: CacheState = jax.device_put(init_state(config), jax.devices("cpu")[0])
    self._reqs: dict[str, _Req] = {}
    self._free_slots = list(range(config.max_requests - 1, -1, -1))
    self._stats = self._to_stats(scheduler.pool_stats(config, self.state))
    # align-mode recurrent groups (index, block size): the ones with pre-forward state copies
    self._align_groups = tuple(
      (g, spec.block_size)
      for g, spec in enumerate(self._lay.groups)
      if group_rules(spec).is_align(spec) and self._lay.caching
    )
    self._empty_ids = ((),) * self._lay.num_groups
    # the entry scalars `schedule` reads, by name (`outputs.ENTRY_SCALARS`), in its order
    self._scalars = operator.itemgetter(
      *(
        self._columns.scalar(k)
        for k in ("admission", "hit", "spb", "scheduled", "reason", "computed")
      )
    )
    # (group, offset of its 4 state-slot columns in `EntryColumns.slots`) per recurrent group
    # per recurrent group: (group, columns of its read, write, first checkpoint, count)
    self._slot_cols = tuple(
      (g, *(self._columns.slots.start + recurrent_slots.SLOT_WIDTH * j + k for k in _SLOT_ORDER))
      for j, g in enumerate(self._lay.recurrent_groups)
    )

  # ---- helpers ----
  def _to_stats(self, packed) -> PoolStats:
    return self._stats_from_row(np.asarray(packed).tolist())

  @staticmethod
  def _stats_from_row(p: list[int]) -> PoolStats:
    """PoolStats from the `outputs.pack_stats` row as a list of ints."""
    s = outputs.unpack_stats(p)
    return PoolStats(
      num_free_blocks=s["num_free"],
      num_used_blocks=s["num_used"],
      num_free_cached_blocks=s["num_free_cached"],
      cached_blocks_per_group=tuple(s["cached_per_group"]),
      num_pinned_blocks=s["num_pinned"],
    )

  def _hash_row(self, hashes: np.ndarray) -> np.ndarray:
    row = np.zeros((self._lay.max_hashes, 2), np.uint32)
    row[: len(hashes)] = hashes
    return row

  def _check_tokens(self, tokens, field="tokens") -> list[int]:
    arr = hashing.validate_tokens(tokens, field)
    if arr.size == 0:
      raise ValueError(f"{field} must hold at least 1 token, got 0")
    return [int(t) for t in arr]

  def _get(self, req: str) -> _Req:
    if req not in self._reqs:
      raise ValueError(f"req {req!r} is not an active request; active: {sorted(self._reqs)}")
    return self._reqs[req]

  @property
  def state(self) -> CacheState:
    """The cache core's state, every request row written so far included (`_flush`)."""
    self._flush()
    return self._state

  @state.setter
  def state(self, value: CacheState) -> None:
    self._state = value

  def _write(self, r: _Req) -> None:
    """Queues r's row (tokens, prompt, hashes) for the core. Registering a request changes no
    pool counter (`self._stats` stays valid) and nothing reads the row before the next device
    call, which writes every queued row in one call first (`state`, `_flush`): the engine
    appends a token to each running request every step, and one jitted call per request was
    most of its commit time (8 requests: ~2 ms a step on the CPU)."""
    self._pending[r.slot] = r

  def _flush(self) -> None:
    """Writes the queued rows (`_write`) in one jitted call (`scheduler.write_requests_only`,
    padded to a power of two <= max_requests: one compilation per size)."""
    if not self._pending:
      return
    pending = list(self._pending.values())
    self._pending.clear()
    k = min(1 << (len(pending) - 1).bit_length(), self.config.max_requests)
    slots = np.full((k,), -1, np.int32)
    hashes = np.zeros((k, self._lay.max_hashes, 2), np.uint32)
    tokens = np.zeros((k,), np.int32)
    prompts = np.zeros((k,), np.int32)
    for i, r in enumerate(pending):
      slots[i], tokens[i], prompts[i] = r.slot, len(r.tokens), r.num_prompt
      hashes[i, : len(r.hashes)] = r.hashes
    self._state = scheduler.write_requests_only(
      self.config, self._state, slots, hashes, tokens, prompts
    )

  # ---- protocol ----
  def add_request(self, req, tokens, extras=None) -> None:
    if not isinstance(req, str) or not req:
      raise ValueError(f"req must be a non-empty string, got {req!r}")
    if req in self._reqs:
      raise ValueError(f"req {req!r} is already active; free it before reusing the name")
    toks = self._check_tokens(tokens)
    if len(toks) > self.config.max_model_len:
      raise ValueError(
        f"tokens has {len(toks)} tokens; must be <= max_model_len={self.config.max_model_len}"
      )
    if not self._free_slots:
      raise ValueError(f"max_requests={self.config.max_requests} requests are already active")
    extras = extras or hashing.NO_EXTRAS
    hashes = hashing.block_hashes(toks, self._lay.hash_block_size, extras)
    r = _Req(req, self._free_slots.pop(), toks, extras, hashes, len(toks))
    self._write(r)
    self._reqs[req] = r

  def lookup(self, tokens, extras=None) -> HitInfo:
    toks = self._check_tokens(tokens)
    if len(toks) > self.config.max_model_len:
      raise ValueError(
        f"tokens has {len(toks)} tokens; must be <= max_model_len={self.config.max_model_len}"
      )
    h = hashing.block_hashes(toks, self._lay.hash_block_size, extras or hashing.NO_EXTRAS)
    packed = scheduler.lookup_only(self.config, self.state, self._hash_row(h), np.int32(len(toks)))
    lk = outputs.unpack_lookup(packed, self._lay.num_groups)
    return HitInfo(
      hit_tokens=lk["hit"],
      per_group_hit_tokens=lk["alone"],
      hit_blocks_per_group=lk["hit_blocks"],
      shared_prefix_boundary=lk["spb"],
    )

  def schedule(self, entries: Sequence[ScheduleEntry]) -> StepResult:
    entries = list(entries)
    reqs = self._reqs
    rs, seen = [], set()
    for i, e in enumerate(entries):
      if not isinstance(e, ScheduleEntry):
        raise ValueError(f"entries[{i}] must be a ScheduleEntry, got {e!r}")
      r = reqs.get(e.req) if e.req in reqs else self._get(e.req)
      if e.req in seen:
        raise ValueError(f"entries[{i}].req {e.req!r} appears twice in one step")
      seen.add(e.req)
      mt = e.max_tokens
      if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
        raise ValueError(f"entries[{i}].max_tokens must be None or an integer >= 1, got {mt!r}")
      rs.append(r)
    n = len(entries)
    size = compile_cache.step_entries(n)
    slots = np.zeros(size, np.int32)
    max_tok = np.full(size, -1, np.int32)
    valid = np.zeros(size, bool)
    slots[:n] = [r.slot for r in rs]
    max_tok[:n] = [-1 if e.max_tokens is None else min(e.max_tokens, 2**31 - 2) for e in entries]
    valid[:n] = True
    self.state, packed = scheduler.schedule_step(self.config, self.state, slots, max_tok, valid)
    # np.asarray, not jax.device_get: same array, ~10x less host overhead on CPU
    packed = np.asarray(packed)
    g_n, mb = self._lay.num_groups, self._lay.max_blocks
    self._stats = self._stats_from_row(packed[-1, : outputs.stats_width(g_n)].tolist())
    # the packed columns (`outputs.EntryColumns`); the leading columns go to Python lists
    # once (per-element NumPy conversions dominate)
    cols = self._columns
    head = packed[:n, : cols.row.start].tolist()
    rows = packed[:n, cols.row].reshape(n, g_n, mb)
    cow_copies, cows = [], None
    if self._lay.partial:  # copy-on-write copies of partial hits (§2.5), group by group
      cows = packed[:n, cols.cow_copies]  # [n, G] each group's copy (0 = none)
      srcs = packed[:n, cols.cow_sources]  # and its source
      for g in range(g_n):
        for i in range(n):
          src, dst = int(srcs[i, g]), int(cows[i, g])
          if dst:
            cow_copies.append(StateCopy(entries[i].req, g, src, dst))
    ga, gb = cols.vector("alone"), cols.vector("hit_blocks")
    gc_, gd = cols.vector("lens_before"), cols.vector("lens_after")
    scalars = self._scalars
    results, copies = [], []
    empty = self._empty_ids
    align = self._align_groups
    slot_cols = self._slot_cols
    for i, e in enumerate(entries):
      r = rs[i]
      h = head[i]
      adm, hit, spb, sched, reason, computed = scalars(h)
      row = rows[i]
      after = h[gd]
      if sched:
        before = h[gc_]
        new_ids = tuple(
          tuple(row[g, before[g] : after[g]].tolist()) if after[g] > before[g] else ()
          for g in range(g_n)
        )
        if cows is not None:  # a new request's copy-on-write block is returned first (§2.5)
          new_ids = tuple(
            ((int(cows[i, g]),) + ids) if adm and cows[i, g] else ids
            for g, ids in enumerate(new_ids)
          )
        if align:
          copies.extend(self._copies(r, computed - sched, sched, row))
        r.status = "running"
        slots = tuple(
          [
            RecurrentSlots(
              g,
              h[rc],
              h[wc],
              tuple(row[g, h[fc] : h[fc] + h[nc]].tolist()) if h[nc] else (),
            )
            for g, rc, wc, fc, nc in slot_cols
          ]
        )
      else:
        new_ids = empty
        slots = ()
      r.row, r.lens = row, after
      r.num_computed = computed
      results.append(
        EntryResult(
          req=e.req,
          admission=bool(adm),
          hit=HitInfo(
            hit_tokens=hit,
            per_group_hit_tokens=tuple(h[ga]),
            hit_blocks_per_group=tuple(h[gb]),
            shared_prefix_boundary=spb,
          )
          if adm
          else None,
          scheduled_tokens=sched,
          reason=_REASONS[reason],
          num_computed_tokens=computed,
          new_block_ids=new_ids,
          recurrent=slots,
        )
      )
    return StepResult(entries=tuple(results), state_copies=tuple(cow_copies + copies))

  def _copies(self, r: _Req, start: int, sched: int, row) -> list[StateCopy]:
    """Pre-forward recurrent state copies (vLLM §5.2) for align-mode groups."""
    out = []
    for g, bs in self._align_groups:
      prev = r.state_idx.get(g, (start - 1) // bs if start > 0 else -1)
      curr = -(-(start + sched) // bs) - 1
      r.state_idx[g] = curr
      if prev != -1 and prev != curr:
        out.append(StateCopy(r.name, g, int(row[g, prev]), int(row[g, curr])))
    return out

  def append_tokens(self, req, tokens) -> None:
    r = self._get(req)
    toks = self._check_tokens(tokens)
    if len(r.tokens) + len(toks) > self.config.max_model_len:
      raise ValueError(
        f"tokens would grow {req!r} to {len(r.tokens) + len(toks)} tokens; must be <= "
        f"max_model_len={self.config.max_model_len}"
      )
    r.tokens = r.tokens + toks
    r.hashes = hashing.extend_block_hashes(r.hashes, r.tokens, self._lay.hash_block_size, r.extras)
    self._write(r)

  def _release(self, req: str, preempt: bool) -> None:
    r = self._get(req)
    self.state, s = scheduler.release_request(
      self.config, self.state, np.int32(r.slot), np.bool_(preempt)
    )
    self._stats = self._to_stats(s)
    r.state_idx.clear()
    r.row = r.lens = None
    if preempt:
      r.status, r.num_computed = "preempted", 0
    else:
      del self._reqs[req]
      self._free_slots.append(r.slot)

  def free(self, req) -> None:
    self._release(req, preempt=False)

  def preempt(self, req) -> None:
    self._release(req, preempt=True)

  def reset_prefix_cache(self) -> bool:
    self.state, ok, s = scheduler.reset_prefix_cache(self.config, self.state)
    self._stats = self._to_stats(s)
    return bool(ok)

  def pool_stats(self) -> PoolStats:
    return self._stats

  def refresh_stats(self) -> None:
    """Recomputes the pool counters from `self.state` (after replacing it, e.g. a restore)."""
    self._stats = self._to_stats(scheduler.pool_stats(self.config, self.state))

  def set_eviction_alpha(self, alpha: float) -> None:
    """FLOP-aware eviction weight alpha in [0, 100] (ValueError otherwise, or if not flop_aware)."""
    if self.config.eviction != "flop_aware":
      raise ValueError(f"eviction must be 'flop_aware' to set alpha, got {self.config.eviction!r}")
    self.state = flop_aware.set_alpha(self.state, alpha)

  def set_eviction_weighting(self, name: str) -> None:
    """Eviction `tuned`'s weighting, "greedy_dual" or "lru2", from the next step (ValueError
    otherwise, or if the eviction is not `tuned`)."""
    if self.config.eviction != "tuned":
      raise ValueError(f"eviction must be 'tuned' to set a weighting, got {self.config.eviction!r}")
    self.state = tuned.set_weighting(self.state, name)

  def request_view(self, req) -> RequestView:
    r = self._get(req)
    g_n = self._lay.num_groups
    if r.row is None:  # never scheduled since it was added or released: an empty table
      block_ids = ((),) * g_n
    else:
      block_ids = tuple(tuple(r.row[g, : r.lens[g]].tolist()) for g in range(g_n))
    return RequestView(
      req=req,
      status=r.status,
      num_computed_tokens=r.num_computed,
      num_tokens=len(r.tokens),
      num_prompt_tokens=r.num_prompt,
      block_ids=block_ids,
    )

  def active_requests(self) -> tuple[str, ...]:
    return tuple(self._reqs)
