"""Hypothesis rules shared by the state machines that drive `JaxCacheManager` and a plain-Python
manager with the same calls (`differential_test.py`, `flop_eviction_test.py`, `policies_test.py`).

`paired_rules(prompts)` returns a `RuleBasedStateMachine` base class with the common rules (add,
schedule, append, lookup) and `_both`, which runs one call on `self.jax` and `self.ref` and
asserts equal results (or the same `ValueError`). Subclasses set `self.jax` / `self.ref` in
their `@initialize` rule and add their own rules and invariants.
"""

from __future__ import annotations

import hypothesis.strategies as st
import jax
import numpy as np
from hypothesis.stateful import RuleBasedStateMachine
from hypothesis.stateful import invariant
from hypothesis.stateful import precondition
from hypothesis.stateful import rule

from hybrid_cache import policies
from hybrid_cache.core import access_history as core_access_history
from hybrid_cache.core.invariants import check_invariants
from hybrid_cache.core.state import BIG
from hybrid_cache.types import ScheduleEntry

NAMES = ("a", "b", "c", "d", "e")


def paired_rules(prompts: st.SearchStrategy) -> type[RuleBasedStateMachine]:
  """Base machine whose `add` / `lookup` rules draw prompts (lists of ints) from `prompts`."""

  class PairedRules(RuleBasedStateMachine):
    def _both(self, fn):
      outs = []
      for m in (self.jax, self.ref):
        try:
          outs.append(("ok", fn(m)))
        except ValueError as e:
          outs.append(("error", type(e).__name__))
      assert outs[0] == outs[1], f"jax {outs[0]} != reference {outs[1]}"
      return outs[0]

    def _active(self):
      return self.ref.active_requests()

    @rule(name=st.sampled_from(NAMES), tokens=prompts)
    def add(self, name, tokens):
      self._both(lambda m: m.add_request(name, tokens))

    @precondition(lambda self: self._active())
    @rule(data=st.data())
    def schedule(self, data):
      chosen = data.draw(
        st.lists(st.sampled_from(list(self._active())), min_size=1, max_size=3, unique=True)
      )
      caps = data.draw(
        st.lists(
          st.one_of(st.none(), st.integers(1, 20)), min_size=len(chosen), max_size=len(chosen)
        )
      )
      entries = [ScheduleEntry(r, c) for r, c in zip(chosen, caps)]
      self._both(lambda m: m.schedule(entries))

    @precondition(lambda self: self._active())
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 5), min_size=1, max_size=3))
    def append(self, data, tokens):
      name = data.draw(st.sampled_from(list(self._active())))
      self._both(lambda m: m.append_tokens(name, tokens))

    @rule(tokens=prompts)
    def lookup(self, tokens):
      self._both(lambda m: m.lookup(tokens))

  return PairedRules


def free_queue(m) -> list[int]:
  """The normal free queue of either backend, head (next victim) first."""
  if hasattr(m, "free_queue"):
    return list(m.free_queue())
  qk = exact_free_keys(m.state)
  ids = np.nonzero(qk < BIG)[0]
  return [int(b) for b in ids[np.argsort(qk[ids], kind="stable")]]


def exact_free_keys(state) -> np.ndarray:
  """i32[NB]: a state's free-queue keys with the lazy part of a re-keyed queue ordered
  (NumPy, what the jitted `scheduler.free_queue_keys` returns, without a compile per config):
  the blocks keyed in [`order_exact`, `order_lazy` + NB) by (rank, recency)."""
  if state.queue_order.shape[0] == 0:  # `lru`: the keys are the order
    return np.array(jax.device_get(state.free_key))
  qk, order, counters = (
    np.array(a) for a in jax.device_get((state.free_key, state.queue_order, state.counters))
  )
  host = state.replace(queue_order=order, counters=counters)  # the rows read below, on the host
  if int(host.order_exact) >= BIG:
    return qk
  lo, hi = int(host.order_exact), int(host.order_lazy) + qk.shape[0]
  ids = np.nonzero((qk >= lo) & (qk < hi))[0]
  rank, rec = np.asarray(host.free_rank)[ids], np.asarray(host.free_recency)[ids]
  qk[ids[np.lexsort((rec, rank))]] = lo + np.arange(len(ids))
  return qk


def chain_features(m) -> dict[int, tuple[int, ...]]:
  """Keyed block -> (group, token end, hits, chain start, eviction stamp, ranked priority) of
  its key, on either backend (what an eviction policy's `FreeBlocks` reads besides the recency,
  and what raises the eviction clock). Hits and chain start only if the policy reads them
  (`policies.reads_chain`: only then does the core keep them), stamp and ranked priority only
  with an eviction clock (`policies.reads_clock`); at least (group, token end)."""
  eviction = m.config.eviction
  width = 6 if policies.reads_clock(eviction) else 4 if policies.reads_chain(eviction) else 2
  if hasattr(m, "chain_features"):
    return {b: f[:width] for b, f in m.chain_features().items()}
  s = jax.device_get(m.state)
  names = ("block_group", "key_end", "key_hits", "chain_start", "evict_stamp", "evict_ranked")
  names = names[:width]
  cols = [np.asarray(getattr(s, a)) for a in names]
  ids = np.nonzero(cols[0] >= 0)[0]
  return {int(b): tuple(int(c[b]) for c in cols) for b in ids}


def access_history(m) -> dict[int, tuple[int, int]]:
  """Keyed block -> (last, penultimate access step) of its key, on either backend (what LRU-2
  reads); {} unless the policy reads the access history (`policies.reads_history`: only then
  does the core keep it)."""
  if not policies.reads_history(m.config.eviction):
    return {}
  if hasattr(m, "access_history"):
    return m.access_history()
  s = jax.device_get(m.state)
  cols = [np.asarray(s.block_group), np.asarray(s.key_last), np.asarray(s.key_penult)]
  return {int(b): (int(cols[1][b]), int(cols[2][b])) for b in np.nonzero(cols[0] >= 0)[0]}


def kv_owners(m) -> dict[int, int]:
  """Keyed block -> its KV owner (`core.kv_owner`), owned blocks only, on either backend; {}
  unless the policy reads the access history (only then does the core keep owners)."""
  if not policies.reads_history(m.config.eviction):
    return {}
  if hasattr(m, "kv_owners"):
    return m.kv_owners()
  s = jax.device_get(m.state)
  group, owner = np.asarray(s.block_group), np.asarray(s.kv_owner)
  return {int(b): int(owner[b]) for b in np.nonzero((group >= 0) & (owner >= 0))[0]}


def ghosts(m) -> dict[tuple[int, int], tuple[int, int]]:
  """The access history's ghost table, (group, entry) -> (last access, tag), non-empty entries
  only, on either backend; {} unless the policy reads the access history."""
  if not policies.reads_history(m.config.eviction):
    return {}
  if hasattr(m, "access_history"):
    return {at: v for at, v in m._state.ghosts.items() if v != (0, 0)}
  s = jax.device_get(m.state)
  _, t0, l0 = core_access_history._base(s)
  row, n = np.asarray(s.policy_state)[0], s.tables.shape[1] * core_access_history.TABLE
  tags, lasts = row[t0 : t0 + n], row[l0 : l0 + n]
  return {
    divmod(int(e), core_access_history.TABLE): (int(lasts[e]), int(tags[e]))
    for e in np.nonzero((tags != 0) | (lasts != 0))[0]
  }


def access_inherit(m) -> list[int]:
  """The jitted backend's inherited access per request slot (`core.access_history`)."""
  s = jax.device_get(m.state)
  r = s.tables.shape[0]
  off = core_access_history._base(s)[0]
  return [int(v) for v in np.asarray(s.policy_state)[0, off : off + r]]


def eviction_clock(m) -> int:
  """The eviction clock (GreedyDual's L) on either backend; 0 without a clock policy."""
  if hasattr(m, "eviction_clock"):
    return m.eviction_clock()
  return int(jax.device_get(m.state).evict_clock)


def eviction_rules(prompts: st.SearchStrategy) -> type[RuleBasedStateMachine]:
  """`paired_rules` plus the rules of the eviction machines: `serve` (one request run alone
  until computed, then freed unless kept: how keyed blocks reach the free queue between
  steps), `finish`, and an invariant comparing the pool counters, the free-queue order, the
  keyed blocks' chain features (`chain_features`), access history (`access_history`) and KV
  owners (`kv_owners`), and
  the jitted state's invariants (`self.config` is set by the subclass's `@initialize`)."""

  class EvictionRules(paired_rules(prompts)):
    @precondition(lambda self: self._active())
    @rule(data=st.data(), preempt=st.booleans())
    def finish(self, data, preempt):
      name = data.draw(st.sampled_from(list(self._active())))
      self._both(lambda m: m.preempt(name) if preempt else m.free(name))

    @rule(name=st.sampled_from(NAMES), tokens=prompts, keep=st.booleans())
    def serve(self, name, tokens, keep):
      if name not in self._active():
        self._both(lambda m: m.add_request(name, tokens))
      for _ in range(8):
        view = self.ref.request_view(name)
        if view.num_computed_tokens >= view.num_tokens:
          break
        self._both(lambda m: m.schedule([ScheduleEntry(name)]))
        if self.ref.request_view(name).num_computed_tokens == view.num_computed_tokens:
          break
      if not keep:
        self._both(lambda m: m.free(name))

    @invariant()
    def same_pool_and_queue(self):
      if not hasattr(self, "jax"):
        return
      assert self.jax.pool_stats() == self.ref.pool_stats()
      assert free_queue(self.jax) == free_queue(self.ref)
      assert chain_features(self.jax) == chain_features(self.ref)
      assert eviction_clock(self.jax) == eviction_clock(self.ref)
      assert access_history(self.jax) == access_history(self.ref)
      assert kv_owners(self.jax) == kv_owners(self.ref)
      assert ghosts(self.jax) == ghosts(self.ref)
      assert check_invariants(self.config, self.jax.state) == []

  return EvictionRules
