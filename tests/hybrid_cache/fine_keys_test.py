"""`CacheConfig.fine_keys` (beyond vLLM, issue 15): full attention keyed at every hash block.

A full-attention block larger than the hash block gets, when it is cached full, an extra index
entry at each hash-block boundary inside it (`cache_keys.fine_key_entries`, twin
`cache_keys.cache_fine_keys`), so a recurrent state kept at any multiple of the hash block U is
a hit there, not at the KV block below it. Hand-derived hits on both twins, validation, the
differential machine over fine-key configs (jitted core == reference after every operation)
and engine exactness (cached == uncached) with a hit inside a full KV block.
"""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import settings
from hypothesis.stateful import initialize

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.core.invariants import check_invariants
from hybrid_cache.core.layout import layout
from hybrid_cache.factory import make_manager
from hybrid_cache.types import ScheduleEntry
from tests.hybrid_cache.differential_test import _PHASES
from tests.hybrid_cache.differential_test import DifferentialMachine

_COMMON = dict(max_model_len=64, max_requests=5, max_num_batched_tokens=24)
# KV blocks of 8 over a hash block of 4: one inner boundary per KV block (4, 12, ...)
FINE_CONFIGS = (
  # states every 4 tokens (mode all), dense
  CacheConfig(
    groups=(GroupSpec("full", block_size=8), GroupSpec("mamba", block_size=4, mode="all")),
    block_size=8,
    hash_block_size=4,
    fine_keys=True,
    num_blocks=28,
    **_COMMON,
  ),
  # a window group on the hash block, replay boundaries and junctions only
  CacheConfig(
    groups=(
      GroupSpec("full", block_size=8),
      GroupSpec("swa", block_size=4, window=6),
      GroupSpec("mamba", block_size=4, mode="all"),
    ),
    block_size=8,
    hash_block_size=4,
    fine_keys=True,
    num_blocks=36,
    retention_interval=0,
    **_COMMON,
  ),
  # two pools under one byte budget, sparse states
  CacheConfig(
    groups=(GroupSpec("full", block_size=8), GroupSpec("mamba", block_size=4, mode="all")),
    block_size=8,
    hash_block_size=4,
    fine_keys=True,
    num_blocks=24,
    state_slots=30,
    byte_budget=60,
    page_bytes=2,
    slot_bytes=3,
    retention_interval=8,
    **_COMMON,
  ),
  # vLLM's partial hits (align states of 8) plus fine keys on KV blocks of 16 (3 inner keys)
  CacheConfig(
    groups=(GroupSpec("full", block_size=16), GroupSpec("mamba", block_size=8)),
    block_size=16,
    hash_block_size=4,
    fine_keys=True,
    num_blocks=28,
    **_COMMON,
  ),
)


def _serve(m, name: str, tokens: list[int]) -> int:
  """Adds and runs one request to completion, frees it; returns its hit tokens."""
  m.add_request(name, tokens)
  res = m.schedule([ScheduleEntry(name)])
  hit = res.entries[0].hit.hit_tokens
  while m.request_view(name).num_computed_tokens < len(tokens):
    m.schedule([ScheduleEntry(name)])
  m.free(name)
  return hit


@pytest.mark.parametrize("backend", ["reference", "jax"])
@pytest.mark.parametrize("fine", [False, True])
def test_hit_inside_a_full_kv_block(backend, fine):
  """KV blocks of 8, hash block and recurrent block 4, mode all: a 20-token request caches KV
  blocks [0, 8) and [8, 16) full and a state every 4 tokens. A second request sharing its first
  12 tokens hits 12 with fine keys (the inner key of block [8, 16) at 12 and the state at 12),
  and 8 without (full-attention keys at block ends only, hits aligned to 8)."""
  cfg = FINE_CONFIGS[0].replace(fine_keys=fine)
  assert cfg.partial_hits == fine
  m = make_manager(cfg, backend)
  first = list(range(100, 120))
  assert _serve(m, "a", first) == 0
  assert _serve(m, "b", first[:12] + [1, 2, 3, 4, 5]) == (12 if fine else 8)
  if backend == "jax":
    assert check_invariants(cfg, m.state) == []


def test_inner_keys_are_dropped_with_their_block():
  """Evicting a full block drops its inner keys too: after the pool recycles every cached
  block, a request sharing 12 tokens hits nothing (never a stale inner key)."""
  cfg = FINE_CONFIGS[0].replace(num_blocks=12)
  for backend in ("reference", "jax"):
    m = make_manager(cfg, backend)
    first = list(range(100, 120))
    _serve(m, "a", first)
    for i in range(4):  # unrelated requests that recycle the whole pool
      _serve(m, f"x{i}", list(range(200 + 30 * i, 220 + 30 * i)))
    assert _serve(m, "b", first[:12] + [1, 2, 3]) == 0, backend
    if backend == "jax":
      assert check_invariants(cfg, m.state) == []


def test_layout_sizes_the_index_for_the_inner_keys():
  base = layout(FINE_CONFIGS[3].replace(fine_keys=False))
  fine = layout(FINE_CONFIGS[3])
  assert fine.fine_key_groups == (0,) and base.fine_key_groups == ()
  assert fine.buckets == 2 * base.buckets  # 16 / 4 keys per KV block, at half the load


@pytest.mark.parametrize(
  "kw,field",
  [
    (dict(groups=(GroupSpec("full", block_size=4), GroupSpec("mamba", block_size=4))), "fine_keys"),
    (
      dict(
        groups=(
          GroupSpec("full", block_size=8),
          GroupSpec("swa", block_size=8, window=4),
          GroupSpec("mamba", block_size=4),
        )
      ),
      "groups[1].block_size",
    ),
    (dict(fine_keys=1), "fine_keys"),
  ],
)
def test_validation_names_the_field(kw, field):
  base = dict(
    groups=(GroupSpec("full", block_size=8), GroupSpec("mamba", block_size=4)),
    hash_block_size=4,
    fine_keys=True,
    num_blocks=16,
  )
  with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
    CacheConfig(**(base | kw))


def test_round_trips_through_the_scenario_format():
  cfg = FINE_CONFIGS[1]
  d = cfg.to_dict()
  assert d["fine_keys"] is True
  assert CacheConfig.from_dict({**d, "max_requests": 5}).fine_keys


class FineKeysMachine(DifferentialMachine):
  """The differential machine (jitted core vs reference, every view and the invariants after
  each operation) over the fine-key configs."""

  @initialize(ci=st.integers(0, len(FINE_CONFIGS) - 1))
  def setup(self, ci):
    self.config = FINE_CONFIGS[ci]
    self.jax = make_manager(self.config, "jax")
    self.ref = make_manager(self.config, "reference")


TestFineKeysDifferential = FineKeysMachine.TestCase
TestFineKeysDifferential.settings = settings(
  max_examples=10, stateful_step_count=25, deadline=None, phases=_PHASES
)


# ---------------------------------------------------------------------------------------------
# engine: cached == uncached with a hit inside a full KV block

PREFIX = 72


def _engine_workload() -> list[list[int]]:
  """A 112-token prompt that fills the KV block [64, 80), then three prompts sharing its first
  72 tokens: the second one's junction at 72 keeps a state there (recurrent blocks of 8), so
  the third and fourth hit 72, inside that full KV block (its inner key at 72)."""
  rng = np.random.RandomState(15)
  prefix = rng.randint(0, 256, PREFIX).tolist()
  first = prefix + rng.randint(0, 256, 40).tolist()
  return [first] + [prefix + rng.randint(0, 256, 21).tolist() for _ in range(3)]


@pytest.mark.parametrize(
  "preset", ["qwen35_tiny", pytest.param("nemotron_h_tiny", marks=pytest.mark.slow)]
)
def test_engine_exact_with_hits_inside_kv_blocks(preset):
  from hybrid_cache.engine.config import cache_config_for
  from hybrid_cache.engine.engine import Engine

  def serve(manager: str, **cache):
    kw = dict(block_size=16, num_blocks=96, max_model_len=256, max_requests=4)
    cfg = cache_config_for(preset, max_num_batched_tokens=32, **kw, **cache)
    eng = Engine(
      preset,
      cfg,
      seed=0,
      cache_manager=manager,
      token_buckets=(32,),
      seq_buckets=(8,),
      max_num_seqs=1,
    )
    return eng.generate(_engine_workload(), 3, return_logits=True), eng

  want, _ = serve("reference", enable_prefix_caching=False)
  got, eng = serve("jax", recurrent_block_size=8, hash_block_size=8, fine_keys=True)
  assert eng.cache_config.partial_hits
  assert [o.num_cached_tokens for o in got] == [0, 64, PREFIX, PREFIX]
  assert eng.stats.kv_page_copies > 0  # the hit block [64, 80) was copied before the write
  for g, w in zip(got, want, strict=True):
    assert g.finished and w.finished, (g.error, w.error)
    assert g.output_tokens == w.output_tokens
    rel = float(np.max(np.abs(g.logits - w.logits)) / np.max(np.abs(w.logits)))
    assert rel <= 1e-5, (g.request_id, rel)
