"""Recurrent-state admission/eviction counters and the key's token end (`block_aux` column 2)."""

from __future__ import annotations

import numpy as np

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.manager import JaxCacheManager
from hybrid_cache.core.state import AUX_END
from hybrid_cache.core.state import C_REC_ADMITTED
from hybrid_cache.core.state import C_REC_EVICTED
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
  m = JaxCacheManager(CFG)
  # 13 tokens: align chunks 12 (lcp = floor(12/4)*4 = 12) then 1; the state at 12 is the only
  # recurrent key; the full group registers blocks 0-2.
  _prefill(m, "a", list(range(13)))
  c = np.asarray(m.state.counters)
  assert c[C_REC_ADMITTED] == 1
  assert c[C_REC_EVICTED] == 0
  group = np.asarray(m.state.block_group)
  end = np.asarray(m.state.block_aux)[:, AUX_END]
  assert sorted(end[group == 0].tolist()) == [4, 8, 12]
  assert end[group == 1].tolist() == [12]
  assert (end[group < 0] == -1).all()
  m.free("a")
  # a disjoint request that needs every block evicts all cached keys, the state among them
  _prefill(m, "b", list(range(100, 133)))
  c = np.asarray(m.state.counters)
  assert c[C_REC_EVICTED] == 1
  end = np.asarray(m.state.block_aux)[:, AUX_END]
  group = np.asarray(m.state.block_group)
  assert (end[group < 0] == -1).all()
  assert (end[group >= 0] > 0).all()
