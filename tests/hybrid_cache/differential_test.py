"""Differential test: JaxCacheManager vs PythonCacheManager driven by the same random operations.

Configs come from a small fixed set (jit caches are reused across examples); every operation's
result (or ValueError), the pool counters, every active request's view and the state
invariants are compared after each step. `TestDifferentialPinning` draws only the pinning
configs (SPEC B1: window-drop pins, finish pins, demotion). The extended version is marked slow.
"""

from __future__ import annotations

import os

import hypothesis.strategies as st
import pytest
from hypothesis import Phase
from hypothesis import settings
from hypothesis.stateful import initialize
from hypothesis.stateful import invariant
from hypothesis.stateful import precondition
from hypothesis.stateful import rule

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.core.invariants import check_invariants
from hybrid_cache.factory import make_manager
from hybrid_cache.types import ScheduleEntry
from tests.hybrid_cache.paired_rules import NAMES
from tests.hybrid_cache.paired_rules import chain_features
from tests.hybrid_cache.paired_rules import paired_rules

_COMMON = dict(max_model_len=64, max_requests=len(NAMES), max_num_batched_tokens=24)
CONFIGS = (
  CacheConfig(groups=(GroupSpec("full"),), block_size=4, num_blocks=20, **_COMMON),
  CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("mamba")), block_size=4, num_blocks=28, **_COMMON
  ),
  CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("swa", window=8), GroupSpec("mamba")),
    block_size=4,
    num_blocks=40,
    pinning=True,
    **_COMMON,
  ),
  CacheConfig(
    groups=(GroupSpec("full", block_size=8), GroupSpec("swa", block_size=4, window=8)),
    block_size=4,
    num_blocks=32,
    retention_interval=0,
    watermark_blocks=2,
    **_COMMON,
  ),
  CacheConfig(
    groups=(GroupSpec("swa", window=4), GroupSpec("swa", window=4)),
    block_size=2,
    num_blocks=24,
    pinning=True,
    pin_min_drop_size=2,
    **_COMMON,
  ),
  CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("mamba", mode="all"), GroupSpec("swa", window=6)),
    block_size=4,
    num_blocks=36,
    full_sequence_must_fit=False,
    **_COMMON,
  ),
  CacheConfig(
    groups=(
      GroupSpec("full", block_size=8),
      GroupSpec("swa", block_size=4, window=4),
      GroupSpec("mamba", block_size=4),
    ),
    block_size=4,
    num_blocks=40,
    use_eagle=True,
    num_speculative_tokens=1,
    **_COMMON,
  ),
  CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("mamba")),
    block_size=4,
    num_blocks=20,
    enable_prefix_caching=False,
    **_COMMON,
  ),
  # pinning under pressure: finished prefixes fill the pinned tier, admissions demote them
  CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("swa", window=8)),
    block_size=4,
    num_blocks=16,
    pinning=True,
    **_COMMON,
  ),
  # pinning with EAGLE (SWA need + 1), unequal block sizes and a recurrent group
  CacheConfig(
    groups=(
      GroupSpec("full", block_size=8),
      GroupSpec("swa", block_size=4, window=4),
      GroupSpec("mamba", block_size=4),
    ),
    block_size=4,
    num_blocks=30,
    use_eagle=True,
    num_speculative_tokens=1,
    pinning=True,
    **_COMMON,
  ),
  # partial (fine-grained) hits, vLLM §2.5: a recurrent align block larger than the hash block
  # (no SWA group: vLLM does not support SWA with partial hits)
  CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("mamba", block_size=8)),
    block_size=4,
    num_blocks=32,
    **_COMMON,
  ),
  CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("mamba", block_size=8)),
    block_size=4,
    num_blocks=36,
    use_eagle=True,
    num_speculative_tokens=1,
    **_COMMON,
  ),
  # full attention coarser than the hash block: phase-2 probes, FA partial (extra) keys, FA CoW
  CacheConfig(
    groups=(GroupSpec("full", block_size=8), GroupSpec("mamba", block_size=16)),
    block_size=8,
    hash_block_size=4,
    num_blocks=28,
    **_COMMON,
  ),
)
PINNING_CONFIGS = tuple(i for i, c in enumerate(CONFIGS) if c.pinning)

# Shrinking a stateful jax run is slow; set HC_SHRINK=1 to shrink a failure.
_PHASES = tuple(p for p in Phase if os.environ.get("HC_SHRINK") or p != Phase.shrink)

FAMILIES = (tuple(range(100, 116)), tuple(range(200, 212)), (7,) * 10)

prompts = st.builds(
  lambda fam, cut, suffix: list(FAMILIES[fam][:cut]) + suffix,
  st.integers(0, len(FAMILIES) - 1),
  st.integers(0, 16),
  st.lists(st.integers(0, 5), min_size=1, max_size=14),
)


class DifferentialMachine(paired_rules(prompts)):
  """Drives both managers with the same calls and compares everything they report."""

  @initialize(ci=st.integers(0, len(CONFIGS) - 1))
  def setup(self, ci):
    self.config = CONFIGS[ci]
    self.jax = make_manager(self.config, "jax")
    self.ref = make_manager(self.config, "reference")

  @precondition(lambda self: self._active())
  @rule(data=st.data())
  def free(self, data):
    name = data.draw(st.sampled_from(list(self._active())))
    self._both(lambda m: m.free(name))

  @precondition(lambda self: self._active())
  @rule(data=st.data())
  def serve_and_free(self, data):
    """Runs one request alone until its tokens are computed (or it stalls), then finishes it."""
    name = data.draw(st.sampled_from(list(self._active())))
    for _ in range(8):
      view = self.ref.request_view(name)
      if view.num_computed_tokens >= view.num_tokens:
        break
      kind, res = self._both(lambda m: m.schedule([ScheduleEntry(name)]))
      if kind != "ok" or res.entries[0].scheduled_tokens == 0:
        break
    self._both(lambda m: m.free(name))

  @precondition(lambda self: self._active())
  @rule(data=st.data())
  def preempt(self, data):
    name = data.draw(st.sampled_from(list(self._active())))
    self._both(lambda m: m.preempt(name))

  @rule()
  def reset(self):
    self._both(lambda m: m.reset_prefix_cache())

  @invariant()
  def same_views_and_clean_state(self):
    if not hasattr(self, "jax"):
      return
    assert self.jax.pool_stats() == self.ref.pool_stats()
    assert self.jax.active_requests() == self.ref.active_requests()
    for r in self._active():
      assert self.jax.request_view(r) == self.ref.request_view(r)
    assert chain_features(self.jax) == chain_features(self.ref)
    assert check_invariants(self.config, self.jax.state) == []


TestDifferential = DifferentialMachine.TestCase
TestDifferential.settings = settings(
  max_examples=12, stateful_step_count=25, deadline=None, phases=_PHASES
)


class PinningMachine(DifferentialMachine):
  """Only the pinning configs: window-drop pins, finish pins and demotion under pressure."""

  @initialize(ci=st.sampled_from(PINNING_CONFIGS))
  def setup(self, ci):
    super().setup(ci)


TestDifferentialPinning = PinningMachine.TestCase
TestDifferentialPinning.settings = settings(
  max_examples=8, stateful_step_count=30, deadline=None, phases=_PHASES
)


class BatchAdmissionMachine(DifferentialMachine):
  """Adds steps that admit every request at once: five waiting or preempted requests, padded
  to 8 entries, in one step of waiting requests only, which the 1-3
  entry steps above never reach."""

  @rule(data=st.data())
  def admit_batch(self, data):
    for name in self._active():
      if data.draw(st.booleans()):
        self._both(lambda m, name=name: m.free(name))
      else:
        self._both(lambda m, name=name: m.preempt(name))
    active = self._active()
    for name in NAMES:
      if name not in active:
        tokens = data.draw(prompts)
        self._both(lambda m, name=name, tokens=tokens: m.add_request(name, tokens))
    order = data.draw(st.permutations(NAMES))
    caps = data.draw(
      st.lists(st.one_of(st.none(), st.integers(1, 20)), min_size=len(NAMES), max_size=len(NAMES))
    )
    self._both(lambda m: m.schedule([ScheduleEntry(r, c) for r, c in zip(order, caps)]))


TestDifferentialBatchAdmission = BatchAdmissionMachine.TestCase
TestDifferentialBatchAdmission.settings = settings(
  max_examples=10, stateful_step_count=20, deadline=None, phases=_PHASES
)


class ExtendedMachine(DifferentialMachine):
  pass


TestDifferentialExtended = pytest.mark.slow(ExtendedMachine.TestCase)
TestDifferentialExtended.settings = settings(
  max_examples=150, stateful_step_count=40, deadline=None
)
