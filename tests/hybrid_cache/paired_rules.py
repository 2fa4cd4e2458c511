"""Hypothesis rules shared by the state machines that drive `JaxCacheManager` and a plain-Python
manager with the same calls (`differential_test.py`, `flop_eviction_test.py`).

`paired_rules(prompts)` returns a `RuleBasedStateMachine` base class with the common rules (add,
schedule, append, lookup) and `_both`, which runs one call on `self.jax` and `self.ref` and
asserts equal results (or the same `ValueError`). Subclasses set `self.jax` / `self.ref` in
their `@initialize` rule and add their own rules and invariants.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis.stateful import RuleBasedStateMachine
from hypothesis.stateful import precondition
from hypothesis.stateful import rule

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
