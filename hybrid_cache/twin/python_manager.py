"""The plain-Python twin of the cache core: vLLM 0.33's hybrid prefix cache, exactly.

`PythonCacheManager(config)` answers `hybrid_cache.types.CacheManager` with dicts, lists and
an explicit ordered free queue (readability over speed). It is the twin the jitted core
(`hybrid_cache.manager.JaxCacheManager`) is compared with, call by call, block ids included.

This class is the host edge only (the twin of `manager.py`): it validates requests, hashes
tokens and holds one `TwinState` (`twin/state.py`); every rule is a free function over that
state in the module named after its jitted twin in `core/`:

  pool, free queue, pinned tier (§1.6, SPEC B1)    `block_pool`
  lookup, coordinator fixed point (§2.2-§3.2)      `coordinator`
  blocks needed, admission check (§4.2)            `admission` (+ `byte_budget`)
  allocate_slots, skipped blocks, CoW (§2.1-§2.5)  `allocate`
  key registration, retention (§1.7, §2.3.4)       `cache_keys`
  finish / preempt, pinning (§1.6, SPEC B1)        `release`
  one entry: lookup, split, allocate (§4, §5)      `step`
  a step, reset, pool stats                        `scheduler`
  pure per-kind rules over ints and lists          `rules`, `eviction`, `policies/`

Example::

  m = PythonCacheManager(CacheConfig(groups=(GroupSpec("full"), GroupSpec("mamba")),
                                     block_size=4, num_blocks=64))
  m.add_request("A", list(range(22)))
  m.schedule([ScheduleEntry("A")]).entries[0].scheduled_tokens  # 20 (align split)
"""

from __future__ import annotations

from collections.abc import Sequence

from hybrid_cache import hashing
from hybrid_cache import policies
from hybrid_cache.config import CacheConfig
from hybrid_cache.hashing import NO_EXTRAS
from hybrid_cache.hashing import RequestExtras
from hybrid_cache.twin import block_pool
from hybrid_cache.twin import coordinator
from hybrid_cache.twin import release
from hybrid_cache.twin import scheduler
from hybrid_cache.twin.state import Request
from hybrid_cache.twin.state import init_state
from hybrid_cache.types import HitInfo
from hybrid_cache.types import PoolStats
from hybrid_cache.types import RequestView
from hybrid_cache.types import ScheduleEntry
from hybrid_cache.types import StepResult


class PythonCacheManager:
  """The plain-Python `CacheManager` (see module docstring)."""

  def __init__(self, config: CacheConfig):
    self.config = config
    self._state = init_state(config)

  def set_eviction_alpha(self, alpha: float) -> None:
    """FLOP-aware eviction weight alpha in [0, 100] (ValueError otherwise, or if not flop_aware)."""
    if self.config.eviction != "flop_aware":
      raise ValueError(f"eviction must be 'flop_aware' to set alpha, got {self.config.eviction!r}")
    self._state.evict.set_alpha(alpha)

  def set_eviction_weighting(self, name: str) -> None:
    """Eviction `tuned`'s weighting, "greedy_dual" or "lru2", from the next step (ValueError
    otherwise, or if the eviction is not `tuned`)."""
    if self.config.eviction != "tuned":
      raise ValueError(f"eviction must be 'tuned' to set a weighting, got {self.config.eviction!r}")
    self._state.evict.weighting = policies.tuned_weighting(name)

  # ------------------------------------------------------------------------------------------
  # CacheManager protocol
  # ------------------------------------------------------------------------------------------

  def _validate_tokens(self, tokens: Sequence[int], field: str) -> list[int]:
    arr = hashing.validate_tokens(tokens, field)
    return [int(t) for t in arr]

  def add_request(
    self, req: str, tokens: Sequence[int], extras: RequestExtras | None = None
  ) -> None:
    s = self._state
    if not isinstance(req, str) or not req:
      raise ValueError(f"req must be a non-empty string, got {req!r}")
    if req in s.reqs:
      raise ValueError(f"req {req!r} is already active; free it before reusing the name")
    toks = self._validate_tokens(tokens, "tokens")
    if not toks:
      raise ValueError(f"tokens of {req!r} must be a non-empty prompt, got length 0")
    if len(toks) > self.config.max_model_len:
      raise ValueError(
        f"tokens of {req!r} must have length in [1, max_model_len={self.config.max_model_len}],"
        f" got {len(toks)}"
      )
    extras = extras or NO_EXTRAS
    fine = hashing.block_hashes(toks, s.hbs, extras)
    s.reqs[req] = Request(req, toks, len(toks), extras, fine)

  def lookup(self, tokens: Sequence[int], extras: RequestExtras | None = None) -> HitInfo:
    toks = self._validate_tokens(tokens, "tokens")
    if not toks:
      raise ValueError("tokens must be a non-empty prompt, got length 0")
    fine = hashing.block_hashes(toks, self._state.hbs, extras or NO_EXTRAS)
    return coordinator.lookup(self._state, fine, len(toks))[0]

  def schedule(self, entries: Sequence[ScheduleEntry]) -> StepResult:
    reqs = self._state.reqs
    seen = set()
    for i, e in enumerate(entries):
      if e.req not in reqs:
        raise ValueError(
          f"entries[{i}].req must name an active request, got {e.req!r}; active: {sorted(reqs)}"
        )
      if e.req in seen:
        raise ValueError(f"entries[{i}].req {e.req!r} appears twice in one step")
      seen.add(e.req)
      if e.max_tokens is not None and (
        isinstance(e.max_tokens, bool) or not isinstance(e.max_tokens, int) or e.max_tokens < 1
      ):
        raise ValueError(f"entries[{i}].max_tokens must be an integer >= 1, got {e.max_tokens!r}")
    return scheduler.schedule_step(self._state, entries)

  def append_tokens(self, req: str, tokens: Sequence[int]) -> None:
    r = self._get(req)
    toks = self._validate_tokens(tokens, "tokens")
    if len(r.tokens) + len(toks) > self.config.max_model_len:
      raise ValueError(
        f"tokens appended to {req!r} would make its length {len(r.tokens) + len(toks)}, "
        f"allowed at most max_model_len={self.config.max_model_len}"
      )
    r.tokens.extend(toks)
    r.fine_hashes = hashing.extend_block_hashes(r.fine_hashes, r.tokens, self._state.hbs, r.extras)

  def _get(self, req: str) -> Request:
    reqs = self._state.reqs
    if req not in reqs:
      raise ValueError(f"req must name an active request, got {req!r}; active: {sorted(reqs)}")
    return reqs[req]

  def free(self, req: str) -> None:
    r = self._get(req)
    release.release(self._state, r, finished=True)
    del self._state.reqs[req]

  def preempt(self, req: str) -> None:
    r = self._get(req)
    release.release(self._state, r, finished=False)
    r.num_computed = 0
    r.boundary = 0
    r.status = "preempted"

  def reset_prefix_cache(self) -> bool:
    return scheduler.reset_prefix_cache(self._state)

  def pool_stats(self) -> PoolStats:
    return scheduler.pool_stats(self._state)

  def request_view(self, req: str) -> RequestView:
    r = self._get(req)
    rows = r.rows or [[] for _ in self._state.groups]
    return RequestView(
      req=r.name,
      status=r.status,
      num_computed_tokens=r.num_computed,
      num_tokens=len(r.tokens),
      num_prompt_tokens=r.num_prompt_tokens,
      block_ids=tuple(tuple(row) for row in rows),
    )

  def active_requests(self) -> tuple[str, ...]:
    return tuple(self._state.reqs)

  # ------------------------------------------------------------------------------------------
  # test-only helpers
  # ------------------------------------------------------------------------------------------

  def evict_hash(
    self, tokens: Sequence[int], group: int, block_index: int, extras: RequestExtras | None = None
  ) -> int:
    """Test only: drops key (hash of group-block `block_index` of `tokens`, group).

    Mirrors vLLM's tests that pop a key from the hash map. Returns how many blocks lost it.
    """
    s = self._state
    fine = hashing.block_hashes(list(tokens), s.hbs, extras or NO_EXTRAS)
    hashes = coordinator.group_hashes(s, fine, s.bs[group])
    key = (hashes[block_index], group)
    ids = s.index.pop(key, [])
    for b in ids:
      if s.key[b] == key:
        s.key[b] = None
      elif key in s.extra.get(b, ()):
        s.extra[b].remove(key)
    return len(ids)

  def cached_positions(self, tokens: Sequence[int], group: int) -> set[int]:
    """Test only: group-block indices of `tokens` whose key is in the index for `group`."""
    s = self._state
    req = next((r for r in s.reqs.values() if r.tokens == list(tokens)), None)
    fine = req.fine_hashes if req is not None else hashing.block_hashes(list(tokens), s.hbs)
    hashes = coordinator.group_hashes(s, fine, s.bs[group])
    return {i for i, h in enumerate(hashes) if (h, group) in s.index}

  def evict_blocks(self, block_ids: Sequence[int]) -> None:
    """Drops the keys of these blocks (vLLM's `KVCacheManager.evict_blocks`); test helper."""
    for b in block_ids:
      block_pool.evict_key(self._state, b)

  def chain_features(self) -> dict[int, tuple[int, int, int, int, int, int]]:
    """Test only: keyed block -> (group, token end, hits, chain start, eviction stamp, ranked
    priority) of its primary key (the last four kept for every policy; the core has hits and
    chain start only under `policies.reads_chain`, stamp and ranked priority only under
    `policies.reads_clock`)."""
    s = self._state
    return {
      b: (key[1], s.key_end[b], s.hits[b], s.chain[b], s.stamp[b], s.ranked[b])
      for b, key in enumerate(s.key)
      if key is not None
    }

  def access_history(self) -> dict[int, tuple[int, int]]:
    """Test only: keyed block -> (last, penultimate access step) of its primary key (kept for
    every policy; the core has them only under `policies.reads_history`)."""
    s = self._state
    return {b: (s.last[b], s.penult[b]) for b, key in enumerate(s.key) if key is not None}

  def kv_owners(self) -> dict[int, int]:
    """Test only: keyed block -> its KV owner (`twin.kv_owner`), owned blocks only (kept for
    every policy, recorded only under `policies.reads_history`)."""
    s = self._state
    return {b: o for b, (key, o) in enumerate(zip(s.key, s.owner)) if key is not None and o >= 0}

  def eviction_clock(self) -> int:
    """Test only: the eviction clock (GreedyDual's L; the core's `CacheState.evict_clock`)."""
    return self._state.evict_clock

  def ref_count(self, block: int) -> int:
    """Test only: the block's reference count."""
    return self._state.ref[block]

  def free_queue(self) -> tuple[int, ...]:
    """Test only: the normal free queue, head first."""
    return tuple(self._state.free)
