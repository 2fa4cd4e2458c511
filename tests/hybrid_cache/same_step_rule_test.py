"""§2.4.6 same-step rule in every recurrent mode: a state registered this step is not a hit."""

import pytest

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.manager import JaxCacheManager
from hybrid_cache.twin.python_manager import PythonCacheManager
from hybrid_cache.types import ScheduleEntry


@pytest.mark.parametrize("backend", [PythonCacheManager, JaxCacheManager])
def test_recurrent_all_mode_defers_same_step_hit(backend):
  cfg = CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("mamba", mode="all")),
    block_size=4,
    num_blocks=64,
    max_num_batched_tokens=64,
    max_model_len=64,
    max_requests=4,
  )
  m = backend(cfg)
  prefix = list(range(16))
  m.add_request("A", prefix + [100, 101])
  m.add_request("B", prefix + [200, 201, 202])
  step1 = m.schedule([ScheduleEntry("A"), ScheduleEntry("B")])
  a, b = step1.entries
  assert a.scheduled_tokens == 18
  # B sees A's blocks registered in this step (optimistic caching), full attention and the
  # recurrent group agree on 16, but the recurrent state at 16 is not computed yet.
  assert b.hit is not None and b.hit.hit_tokens == 16
  assert b.scheduled_tokens == 0 and b.reason == "allocate_slots_failed"
  step2 = m.schedule([ScheduleEntry("B")])
  (b2,) = step2.entries
  assert b2.admission and b2.hit.hit_tokens == 16 and b2.scheduled_tokens == 3
  assert b2.num_computed_tokens == 19
