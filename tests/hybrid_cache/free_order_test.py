"""`free_order`: where freed blocks re-enter the free queue (vLLM §1.6), both cores alike.

"scratch_first" (vLLM 0.33, #43447): a freed block without a hash goes to the queue head and is
reused first. "all_tail" (before #43447): every freed block goes to the tail in the order freed.
"""

from __future__ import annotations

import pytest

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.manager import JaxCacheManager
from hybrid_cache.twin.python_manager import PythonCacheManager
from hybrid_cache.types import ScheduleEntry


@pytest.mark.parametrize("manager", [PythonCacheManager, JaxCacheManager])
@pytest.mark.parametrize("order,expected", [("scratch_first", (2,)), ("all_tail", (3,))])
def test_freed_unhashed_block_is_reused_first_only_in_scratch_first(manager, order, expected):
  cfg = CacheConfig(groups=(GroupSpec("full"),), block_size=4, num_blocks=8, free_order=order)
  m = manager(cfg)
  m.add_request("a", list(range(6)))  # blocks 1 (full, hashed) and 2 (partial, no hash)
  (a,) = m.schedule([ScheduleEntry("a")]).entries
  assert a.new_block_ids == ((1, 2),)
  m.free("a")  # tail first: 2 then 1
  m.add_request("b", [100, 101])
  (b,) = m.schedule([ScheduleEntry("b")]).entries
  assert b.new_block_ids == (expected,)
  assert m.pool_stats().num_free_cached_blocks == 1  # block 1 keeps its hash either way


def test_bad_free_order_names_the_field():
  with pytest.raises(ValueError, match=r"free_order must be one of .* got 'lifo'"):
    CacheConfig(groups=(GroupSpec("full"),), num_blocks=8, free_order="lifo")
