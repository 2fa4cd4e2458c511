"""Compile keys share programs across configs; the registry bounds the live ones (issue 13).

Compilations are counted as in `experiments.bench_compile` (JAX's backend-compile event).
"""

from __future__ import annotations

import jax
import pytest

from experiments.bench_compile import CompileCounter
from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.core import compile_cache
from hybrid_cache.core.invariants import assert_invariants
from hybrid_cache.factory import make_manager
from hybrid_cache.replay import replay as replay_lib
from hybrid_cache.types import ScheduleEntry

BASE = {
  "block_size": 4,
  "num_blocks": 40,
  "groups": [{"type": "full"}, {"type": "swa", "window": 6}],
  "max_model_len": 100,
  "max_num_batched_tokens": 16,
  "retention_interval": 0,
  "full_sequence_must_fit": True,
  "max_requests": 4,
}
# differs only in runtime parameters and in shapes inside the same buckets (num_blocks 40 and
# 57 pad to 64, max_model_len 100 and 120 to 32 blocks of 4)
OTHER = BASE | {
  "num_blocks": 57,
  "max_model_len": 120,
  "max_num_batched_tokens": 12,
  "retention_interval": None,
  "full_sequence_must_fit": False,
  "watermark_blocks": 3,
  "pinning": False,
  "pin_min_drop_size": 2,
  "marconi_junction": False,
}


def _scenario(cfg: dict) -> dict:
  return {
    "name": "compile_cache",
    "config": cfg,
    "prompts": {"A": {"range": [0, 30]}, "B": {"concat": [{"range": [0, 16]}, [90, 91, 92]]}},
    "actions": [
      {"op": "prefill", "req": "A"},
      {"op": "prefill", "req": "B"},
      {"op": "free", "req": "A"},
      {"op": "free", "req": "B"},
      {"op": "lookup", "req": "A"},
      {"op": "state"},
    ],
  }


@pytest.fixture
def counter():
  c = CompileCounter()
  yield c
  c.close()


def test_compile_key_ignores_runtime_fields_and_buckets_shapes():
  a = CacheConfig.from_dict(BASE)
  b = CacheConfig.from_dict(OTHER)
  assert a != b
  assert compile_cache.compile_key(a) == compile_cache.compile_key(b)
  key = compile_cache.compile_key(a)
  assert key.num_blocks == 64 and key.max_blocks_per_request == 32
  assert compile_cache.compile_key(key) is key  # idempotent
  # static fields still tell configs apart
  for change in ({"block_size": 2}, {"num_blocks": 65}, {"max_requests": 8}, {"pinning": True}):
    c = CacheConfig.from_dict(BASE | change)
    assert compile_cache.compile_key(c) != key, change
  # FLOP-aware eviction normalises its efficiency table over the real table width
  fa = CacheConfig.from_dict(BASE | {"eviction": "flop_aware"})
  assert compile_cache.compile_key(fa).max_model_len == 100


def test_configs_differing_in_runtime_fields_share_programs(counter):
  first = replay_lib.replay(_scenario(BASE), backend="jax")
  assert counter.count > 0
  before = counter.count
  got = replay_lib.replay(_scenario(OTHER), backend="jax")
  assert counter.count == before  # no new compilation
  # the shared programs read each config's own parameters: the reference agrees on both
  for cfg, out in ((BASE, first), (OTHER, got)):
    ref = replay_lib.replay(_scenario(cfg), backend="reference")
    assert replay_lib.first_difference(ref, out) is None
    assert out["config"] == ref["config"]  # the user's config, not the compile key
  # the two configs do behave differently (budget 16 vs 12: other chunks)
  assert first["results"][0]["chunks"] != got["results"][0]["chunks"]


def test_one_program_per_entry_point_across_batch_sizes_and_releases():
  """Batches of 1, 3 and 8 entries, admissions and running requests, a preemption and a finish:
  `schedule_step` and `release_request` each compile once for the key (issue 29); the results
  equal the twin's."""
  from hybrid_cache.core import scheduler  # noqa: PLC0415

  cfg = CacheConfig.from_dict(BASE | {"max_requests": 8, "max_num_batched_tokens": 64})
  managers = [make_manager(cfg, backend) for backend in ("jax", "reference")]
  results = [[], []]
  for m, out in zip(managers, results):
    for i in range(8):
      m.add_request(f"r{i}", list(range(100 * i, 100 * i + 9)))
    for batch in (["r0"], ["r0", "r1", "r2"], [f"r{i}" for i in range(8)]):
      res = m.schedule([ScheduleEntry(r, max_tokens=3) for r in batch])
      out.append([(e.scheduled_tokens, e.num_computed_tokens, e.reason) for e in res.entries])
    m.preempt("r1")
    m.free("r2")
    res = m.schedule([ScheduleEntry("r1")])
    out.append([(e.scheduled_tokens, e.num_computed_tokens, e.reason) for e in res.entries])
  assert results[0] == results[1]
  assert scheduler.schedule_step.cache_size(cfg) == 1
  assert scheduler.release_request.cache_size(cfg) == 1
  assert compile_cache.step_entries(1) == compile_cache.step_entries(8) == 8
  assert compile_cache.step_entries(9) == compile_cache.step_entries(64) == 64
  assert compile_cache.step_entries(65) == 512


def test_padded_pool_counts_only_real_blocks():
  cfg = CacheConfig.from_dict(OTHER)
  m = make_manager(cfg, "jax")
  assert m.state.ref_cnt.shape == (64,)
  assert m.config is cfg
  assert m.pool_stats().num_free_blocks == 56
  m.add_request("A", list(range(30)))
  m.schedule([ScheduleEntry("A")])
  st = m.pool_stats()
  assert st.num_free_blocks + st.num_used_blocks == 56
  assert_invariants(cfg, m.state)
  m.free("A")
  assert m.reset_prefix_cache()
  assert_invariants(cfg, m.state)


def test_registry_bounds_live_keys_and_releases_their_programs():
  configs = [CacheConfig(groups=(GroupSpec("full"),), num_blocks=2**k) for k in range(3, 7)]
  make = lambda key: jax.jit(lambda x: x + key.num_blocks)  # noqa: E731
  prev = compile_cache.set_max_live_keys(2)
  try:
    fns = []
    for cfg in configs:
      f = compile_cache.jitted(cfg, "compile_cache_test.add", make)
      assert int(f(1)) == 1 + cfg.num_blocks
      assert f._cache_size() == 1
      fns.append(f)
    live = compile_cache.live_keys()
    assert len(live) == 2
    assert live == tuple(compile_cache.compile_key(c) for c in configs[-2:])
    # the evicted keys' programs were released
    assert [f._cache_size() for f in fns] == [0, 0, 1, 1]
    assert compile_cache.cache_size(configs[0], "compile_cache_test.add") == 0
    # using an evicted config again recompiles (and evicts the least recently used one)
    again = compile_cache.jitted(configs[0], "compile_cache_test.add", make)
    assert int(again(1)) == 1 + configs[0].num_blocks
    assert compile_cache.live_keys()[-1] == compile_cache.compile_key(configs[0])
    assert fns[2]._cache_size() == 0
  finally:
    compile_cache.set_max_live_keys(prev)
  with pytest.raises(ValueError, match="max live keys"):
    compile_cache.set_max_live_keys(0)
