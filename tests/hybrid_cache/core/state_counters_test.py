"""Recurrent-state admission/eviction counters and the key's token end (`CacheState.key_end`)."""

from __future__ import annotations

import numpy as np

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.factory import make_manager
from hybrid_cache.types import ScheduleEntry

CFG = CacheConfig(
  groups=(GroupSpec("full"), GroupSpec("mamba")), block_size=4, num_blocks=12, max_model_len=64
)


def _prefill(m, name, tokens):
  m.add_request(name, tokens)
  while m.request_view(name).num_computed_tokens < len(tokens):
    res = m.schedule([ScheduleEntry(name, None)])
    assert res.entries[0].scheduled_tokens > 0


def test_counters_count_recurrent_keys_registered_and_evicted():
  m = make_manager(CFG, "jax")
  # 13 tokens: align chunks 12 (lcp = floor(12/4)*4 = 12) then 1; the state at 12 is the only
  # recurrent key; the full group registers blocks 0-2.
  _prefill(m, "a", list(range(13)))
  assert int(m.state.states_admitted) == 1
  assert int(m.state.states_evicted) == 0
  group = np.asarray(m.state.block_group)
  end = np.asarray(m.state.key_end)
  assert sorted(end[group == 0].tolist()) == [4, 8, 12]
  assert end[group == 1].tolist() == [12]
  assert (end[group < 0] == -1).all()
  m.free("a")
  # a disjoint request that needs every block evicts all cached keys, the state among them
  _prefill(m, "b", list(range(100, 133)))
  assert int(m.state.states_evicted) == 1
  end = np.asarray(m.state.key_end)
  group = np.asarray(m.state.block_group)
  assert (end[group < 0] == -1).all()
  assert (end[group >= 0] > 0).all()
