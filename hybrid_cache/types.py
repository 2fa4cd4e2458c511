"""Host-side records and the manager protocol shared by every implementation of the core.

Two implementations answer `CacheManager`: the jitted core (`hybrid_cache.manager.
JaxCacheManager`, pure functions over one `CacheState` pytree) and the plain-Python twin
(`hybrid_cache.twin.python_manager.PythonCacheManager`). The replay CLI, the engine, the
simulator and the differential tests talk only to this protocol, so both are driven by
the same calls and must give equal answers (block ids included in the `vllm` profile).

Field names follow `shared/reference/scenario_format.md`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple
from typing import Protocol

from hybrid_cache.config import CacheConfig
from hybrid_cache.hashing import RequestExtras


@dataclasses.dataclass(frozen=True)
class HitInfo:
  """What a lookup found.

  hit_tokens: reconciled hit (capped at num_tokens - 1, aligned to scheduler_block_size).
  per_group_hit_tokens: each group looked up alone (same cap and alignment).
  hit_blocks_per_group: non-null blocks of the reconciled hit, per group.
  shared_prefix_boundary: longest single-group hit during reconciliation when it exceeds
    the reconciled one (Marconi junction), else 0.
  """

  hit_tokens: int
  per_group_hit_tokens: tuple[int, ...]
  hit_blocks_per_group: tuple[int, ...]
  shared_prefix_boundary: int


@dataclasses.dataclass(frozen=True)
class StateCopy:
  """A recurrent-state copy the model runner must do before the forward pass (SPEC A11).

  Copy the state of every layer of recurrent group `group` from block `src_block` to
  block `dst_block`; `conv_shift` = tokens the conv window shifts (num_accepted - 1).
  """

  req: str
  group: int
  src_block: int
  dst_block: int
  conv_shift: int = 0


class RecurrentSlots(NamedTuple):
  """Where a scheduled chunk reads and writes one recurrent group's state (SPEC A6, A11).

  The model runner reads the state after the chunk's first token count from block `read`
  (-1 = no state yet: start from zeros), writes the state after the chunk to block `write`
  and, in mode "all", the state after each full block of the chunk to `checkpoints` (in token
  order). Blocks are the group's pool ids, after the step's `StateCopy`s. The rule, per mode:
  `hybrid_cache.core.groups.recurrent_slots.state_slots` (vLLM §5.1-5.4). A NamedTuple (immutable,
  fields by name) rather than a frozen dataclass: the manager builds one per scheduled entry
  and recurrent group, and it is built in about half the time.
  """

  group: int
  read: int
  write: int
  checkpoints: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class EntryResult:
  """One request's outcome in one scheduler step.

  `recurrent`: when tokens were scheduled, one `RecurrentSlots` per recurrent group (in group
  order), else ().
  """

  req: str
  admission: bool
  hit: HitInfo | None  # set when this step admitted (or tried to admit) the request
  scheduled_tokens: int
  reason: str | None  # "allocate_slots_failed" | "no_token_budget" | None
  num_computed_tokens: int
  new_block_ids: tuple[tuple[int, ...], ...]  # per group, blocks appended this step
  recurrent: tuple[RecurrentSlots, ...] = ()


@dataclasses.dataclass(frozen=True)
class StepResult:
  """A scheduler step: one entry per requested entry, in order, plus the copy plan (the
  copies to make before the forward pass, in order; each names its request)."""

  entries: tuple[EntryResult, ...]
  state_copies: tuple[StateCopy, ...] = ()


@dataclasses.dataclass(frozen=True)
class PoolStats:
  """The pool after an action (null block excluded everywhere)."""

  num_free_blocks: int
  num_used_blocks: int
  num_free_cached_blocks: int
  cached_blocks_per_group: tuple[int, ...]
  num_pinned_blocks: int = 0


@dataclasses.dataclass(frozen=True)
class RequestView:
  """A request as the manager holds it."""

  req: str
  status: str  # "waiting" | "running" | "preempted"
  num_computed_tokens: int
  num_tokens: int
  num_prompt_tokens: int
  block_ids: tuple[tuple[int, ...], ...]  # per group, position-indexed (0 = null)

  @property
  def num_real_blocks(self) -> tuple[int, ...]:
    return tuple(sum(1 for b in row if b != 0) for row in self.block_ids)


@dataclasses.dataclass(frozen=True)
class ScheduleEntry:
  """Ask to schedule `req` this step with at most `max_tokens` tokens (None = no cap)."""

  req: str
  max_tokens: int | None = None


class CacheManager(Protocol):
  """The host-level API of the cache core (see module docstring)."""

  config: CacheConfig

  def add_request(
    self, req: str, tokens: Sequence[int], extras: RequestExtras | None = None
  ) -> None:
    """Registers a waiting request (validates name and tokens; state untouched on error)."""

  def lookup(self, tokens: Sequence[int], extras: RequestExtras | None = None) -> HitInfo:
    """Read-only longest-hit lookup for a fresh request with these tokens."""

  def schedule(self, entries: Sequence[ScheduleEntry]) -> StepResult:
    """One scheduler step over `entries` in list order (admits waiting ones)."""

  def append_tokens(self, req: str, tokens: Sequence[int]) -> None:
    """Appends sampled tokens to a running request (extends its hash chain)."""

  def free(self, req: str) -> None:
    """Releases the request's blocks (tail first) and forgets it."""

  def preempt(self, req: str) -> None:
    """Frees the blocks, resets computed tokens to 0; the request waits for re-admission."""

  def reset_prefix_cache(self) -> bool:
    """Drops every hash if no block is held; returns whether it did."""

  def pool_stats(self) -> PoolStats:
    """Pool counters after the last action."""

  def request_view(self, req: str) -> RequestView:
    """The request's status, counts and block tables."""

  def active_requests(self) -> tuple[str, ...]:
    """Names of the requests the manager holds, in arrival order."""
