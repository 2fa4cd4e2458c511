"""The policy seam (`hybrid_cache.policies`): every registered eviction policy's two twins agree,
and the README's worked example (`deepest_first`) is registered, ordered as documented, run by
the simulator and checked by the differential machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import Phase
from hypothesis import settings
from hypothesis.stateful import initialize
from hypothesis.stateful import invariant

from hybrid_cache import policies
from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.factory import make_manager
from hybrid_cache.types import ScheduleEntry
from tests.hybrid_cache.paired_rules import NAMES
from tests.hybrid_cache.paired_rules import chain_features
from tests.hybrid_cache.paired_rules import eviction_clock
from tests.hybrid_cache.paired_rules import eviction_rules
from tests.hybrid_cache.paired_rules import free_queue

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# flop_aware has its own machine and hand-derived tests (flop_eviction_test.py)
GENERIC = tuple(p for p in policies.EVICTION_POLICIES if p not in ("lru", "flop_aware"))


def _serve(m, name, tokens):
  m.add_request(name, tokens)
  for _ in range(8):
    v = m.request_view(name)
    if v.num_computed_tokens >= v.num_tokens:
      break
    m.schedule([ScheduleEntry(name)])
  m.free(name)


@pytest.mark.parametrize("name", policies.EVICTION_POLICIES)
def test_every_registered_policy_has_both_twins(name):
  core, twin = policies.core_eviction(name), policies.twin_eviction(name)
  if name == "lru":
    assert core is None and twin is None
  else:
    assert callable(core.priority) and callable(twin.priority)
  CacheConfig(groups=(GroupSpec("full"),), num_blocks=8, eviction=name)  # accepted by name


def test_unknown_policy_names_the_field():
  with pytest.raises(ValueError, match="eviction must be one of .*'deepest_first'.*got 'mru'"):
    CacheConfig(groups=(GroupSpec("full"),), num_blocks=8, eviction="mru")


@pytest.mark.parametrize("backend", ["jax", "reference"])
def test_deepest_first_evicts_the_deepest_key_first(backend):
  """Full attention, block 4, fresh queue [1..9]. A (5 tokens) takes 1 (key ends at 4) and 2
  (partial, no key); freeing puts key-less blocks at the head, keyed ones at the tail:
  [2, 3..9, 1]. B (9 tokens) takes 2, 3, 4 (keys end at 4 and 8; 4 partial) and is freed tail
  first: [4..9, 1, 3, 2] = LRU's order. At the next step deepest_first keeps the key-less
  blocks in front, then block 3 (end 8), then the keys ending at 4, least recently freed first
  (1, then 2)."""
  orders = {}
  for eviction in ("lru", "deepest_first"):
    cfg = CacheConfig(
      groups=(GroupSpec("full"),),
      block_size=4,
      num_blocks=10,
      max_model_len=32,
      max_requests=2,
      eviction=eviction,
    )
    m = make_manager(cfg, backend)
    _serve(m, "A", list(range(5)))
    _serve(m, "B", list(range(100, 109)))
    m.schedule([])  # the re-ordering runs at the start of a step
    orders[eviction] = free_queue(m)
  assert orders["lru"] == [4, 5, 6, 7, 8, 9, 1, 3, 2]
  assert orders["deepest_first"] == [4, 5, 6, 7, 8, 9, 3, 1, 2]


# ---------------------------------------------------------------------------------------------
# jitted == twin on random operations, for every registered (non-flop) eviction policy

_COMMON = dict(max_model_len=64, max_requests=len(NAMES), max_num_batched_tokens=24)
CONFIGS = (
  dict(groups=(GroupSpec("full"), GroupSpec("mamba")), block_size=4, num_blocks=16),
  dict(
    groups=(GroupSpec("full"), GroupSpec("swa", window=8), GroupSpec("mamba", mode="all")),
    block_size=4,
    num_blocks=36,
    pinning=True,
  ),
)
FAMILIES = (tuple(range(100, 116)), tuple(range(200, 212)), (7,) * 10)
prompts = st.builds(
  lambda fam, cut, suffix: list(FAMILIES[fam][:cut]) + suffix,
  st.integers(0, len(FAMILIES) - 1),
  st.integers(0, 16),
  st.lists(st.integers(0, 5), min_size=1, max_size=10),
)
_PHASES = tuple(p for p in Phase if os.environ.get("HC_SHRINK") or p != Phase.shrink)


class EvictionMachine(eviction_rules(prompts)):
  """Drives the jitted core and the twin under one registered eviction policy; compares every
  result, the pool counters, the free-queue order and the state invariants."""

  @initialize(ci=st.integers(0, len(CONFIGS) - 1), name=st.sampled_from(GENERIC))
  def setup(self, ci, name):
    self.config = CacheConfig(eviction=name, **CONFIGS[ci], **_COMMON)
    self.jax = make_manager(self.config, "jax")
    self.ref = make_manager(self.config, "reference")


TestEvictionMachine = EvictionMachine.TestCase
TestEvictionMachine.settings = settings(
  max_examples=10, stateful_step_count=30, phases=_PHASES, deadline=None
)


# ---------------------------------------------------------------------------------------------
# the simulator finds every registered policy by name


def _write_trace(path):
  """Sessions that share a 2-block system prompt and grow their history by one 512-token block
  per turn (Mooncake rows: one hash id per 512-token block)."""
  rows, t = [], 0
  for turn in range(4):
    for s in range(6):
      ids = [1, 2] + [1000 * (s + 1) + k for k in range(turn + 1)]
      rows.append(
        {"timestamp": t, "input_length": 512 * len(ids) - 100, "output_length": 8, "hash_ids": ids}
      )
      t += 10
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)


@pytest.mark.parametrize("name", GENERIC)
def test_simulator_runs_every_registered_policy(tmp_path, name):
  trace = tmp_path / "trace.jsonl"
  _write_trace(trace)
  out = {}
  for policy in ("vllm_default", name):
    cmd = [
      sys.executable,
      "-m",
      "hybrid_cache.sim",
      "--trace",
      str(trace),
      "--format",
      "mooncake",
      "--model",
      "marconi_7b",
      "--capacity-bytes",
      "3e9",
      "--policy",
      policy,
      "--block-size",
      "512",
    ]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    out[policy] = json.loads(res.stdout)
  assert out[name]["policy"] == name and out[name]["eviction"] == name
  assert 0 < out[name]["token_hit_rate"] <= out[name]["oracle_token_hit_rate"]


# ---------------------------------------------------------------------------------------------
# placement and admission seams

SEAMS = {
  "placement": policies.PLACEMENT_POLICIES,
  "admission": policies.ADMISSION_POLICIES,
  "retention": policies.RETENTION_POLICIES,
  "retirement": policies.RETIREMENT_POLICIES,
}
_FA_MAMBA = dict(
  groups=(GroupSpec("full"), GroupSpec("mamba")),
  block_size=4,
  num_blocks=40,
  max_model_len=64,
  max_requests=4,
  max_num_batched_tokens=64,
)


@pytest.mark.parametrize(
  "seam,name", [(seam, name) for seam, names in SEAMS.items() for name in names]
)
def test_every_registered_seam_policy_has_both_twins(seam, name):
  core, twin = policies.core_policy(seam, name), policies.twin_policy(seam, name)
  if name == SEAMS[seam][0]:  # the built-in vLLM rule
    assert core is None and twin is None
  elif seam == "placement" and hasattr(core, "state_size"):  # stateful: `policy_state` columns
    assert callable(core.keep) and callable(twin.Placement.start)
  elif seam == "placement":
    assert callable(core.keep) and callable(twin.keep)
  elif seam == "admission":
    assert core.STATE_SIZE > 0 and callable(core.admit) and callable(twin.Admission)
  elif seam == "retirement":  # stateful: `policy_state` columns
    assert callable(core.observe) and callable(core.pick) and callable(twin.Retirement)
  else:
    assert callable(core.pin) and callable(twin.pin)
  CacheConfig(**_FA_MAMBA, pinning=True, **{seam: name})  # accepted by name


@pytest.mark.parametrize("seam", SEAMS)
def test_unknown_seam_policy_names_the_field(seam):
  with pytest.raises(ValueError, match=f"{seam} must be one of .*got 'nope'"):
    CacheConfig(**_FA_MAMBA, **{seam: "nope"})


def test_admission_policy_needs_a_recurrent_group_and_no_partial_hits():
  with pytest.raises(ValueError, match="admission='second_sighting' needs a mamba group"):
    CacheConfig(groups=(GroupSpec("full"),), num_blocks=8, admission="second_sighting")
  with pytest.raises(ValueError, match="admission='second_sighting' needs partial hits off"):
    CacheConfig(
      groups=(GroupSpec("full", block_size=16), GroupSpec("mamba", block_size=16)),
      num_blocks=40,
      hash_block_size=4,
      admission="second_sighting",
    )


def test_retention_policy_needs_pinning():
  with pytest.raises(ValueError, match="retention='state_chain' needs pinning=True"):
    CacheConfig(**_FA_MAMBA, retention="state_chain")


@pytest.mark.parametrize("backend", ["jax", "reference"])
def test_state_chain_pins_no_kv_past_the_deepest_state(backend):
  """Block 4, states at the replay boundaries only (`retention_interval=0`). A 22-token prompt
  keeps its state at 20 (block 4, freed keyed once decoding moves on); decoding to 33 tokens
  keys full-attention blocks 5-7 but no state past 20, and the request ends holding only its
  unkeyed running state. On finish SPEC B1 (`prefix`) pins the 8 keyed FA blocks (no keyed
  state is held); `state_chain` only the FA blocks up to token 20 (0-4): 5."""
  pinned = {}
  for retention in ("prefix", "state_chain"):
    cfg = CacheConfig(**_FA_MAMBA, pinning=True, retention_interval=0, retention=retention)
    m = make_manager(cfg, backend)
    m.add_request("a", list(range(22)))
    while m.request_view("a").num_computed_tokens < 22:
      m.schedule([ScheduleEntry("a")])
    for t in range(11):  # decode: one token appended and computed per step
      m.append_tokens("a", [500 + t])
      m.schedule([ScheduleEntry("a")])
    assert m.request_view("a").num_computed_tokens == 33
    m.free("a")
    pinned[retention] = m.pool_stats().num_pinned_blocks
  assert pinned == {"prefix": 8, "state_chain": 5}


def _first_step_hits(m, prompts):
  """Hit tokens of each prompt's first step, each request served alone and freed."""
  hits = []
  for k, tokens in enumerate(prompts):
    m.add_request(f"r{k}", tokens)
    res = m.schedule([ScheduleEntry(f"r{k}")])
    hits.append(res.entries[0].hit.hit_tokens)
    while m.request_view(f"r{k}").num_computed_tokens < len(tokens):
      m.schedule([ScheduleEntry(f"r{k}")])
    m.free(f"r{k}")
  return hits


@pytest.mark.parametrize("backend", ["jax", "reference"])
def test_second_sighting_registers_a_state_when_its_prefix_recurs(backend):
  """Four prompts share 20 tokens (5 blocks of 4) and differ in the 21st. Under vLLM's `all`
  the first request's state at 20 is registered and the next three hit 20 tokens. Under
  `second_sighting` the first request only marks it; the second finds the KV but no state (a
  recurrent hit needs both: 0), recomputes and registers it; the third and fourth hit 20."""
  prompts = [list(range(20)) + [100 + k] for k in range(4)]
  got = {}
  for admission in ("all", "second_sighting"):
    m = make_manager(CacheConfig(**_FA_MAMBA, admission=admission), backend)
    got[admission] = _first_step_hits(m, prompts)
  assert got == {"all": [0, 20, 20, 20], "second_sighting": [0, 0, 20, 20]}


def test_second_sighting_twins_agree_on_colliding_marks():
  """The jitted `admit` against the twin's `Admission` on key sequences whose low bits
  collide (several candidates of one request on one mark, marks left by earlier requests)."""
  import jax.numpy as jnp
  import numpy as np

  from hybrid_cache.core.layout import layout
  from hybrid_cache.core.policies import second_sighting as core
  from hybrid_cache.twin.policies import second_sighting as twin

  config = CacheConfig(**_FA_MAMBA, admission="second_sighting")
  lay = layout(config)
  g = lay.recurrent_groups[0]
  rng = np.random.default_rng(0)
  table = jnp.zeros((len(lay.recurrent_groups), core.STATE_SIZE), jnp.int32)
  ref = twin.Admission(config)
  mb = lay.max_blocks
  for _ in range(12):
    slots = rng.integers(0, 6, mb).astype(np.uint64)  # 6 marks: many collisions
    high = rng.integers(0, 1 << 20, mb).astype(np.uint64) << np.uint64(core.TABLE_BITS)
    lo = (slots | high).astype(np.uint32)
    hi = rng.integers(0, 1 << 32, mb, dtype=np.uint64).astype(np.uint32)
    offered = rng.random(mb) < 0.5
    keys = jnp.asarray(np.stack([lo, hi], axis=1))
    table, admitted = core.admit(lay, table, g, keys, jnp.asarray(offered))
    want = [
      ref.admit(g, int(lo[i]) | (int(hi[i]) << 32)) if offered[i] else None for i in range(mb)
    ]
    got = [bool(a) if o else None for a, o in zip(np.asarray(admitted), offered)]
    assert got == want


@pytest.mark.parametrize("backend", ["jax", "reference"])
def test_junctions_placement_equals_retention_zero(backend):
  """On a model without window groups, `junctions` keeps exactly what vLLM's mask keeps at
  `retention_interval=0` (the prompt end and the junction), whatever the interval says."""
  base = dict(_FA_MAMBA, max_num_batched_tokens=8)  # chunks of 8 leave states in between
  prompts = [
    list(range(26)),
    list(range(14)) + [50, 51, 52, 53, 54, 55, 56],  # junction at 12 (block floor of 14)
    list(range(14)) + [60, 61, 62, 63, 64, 65, 66, 67, 68],
    list(range(9)) + [70, 71, 72],
    list(range(26)) + [80, 81],
    list(range(14)) + [50, 51, 52, 53, 54, 55, 56, 57, 58],
  ]
  runs = {}
  for name, cfg in {
    "retention 0": CacheConfig(**base, retention_interval=0),
    "junctions": CacheConfig(**base, placement="junctions"),
    "junctions, retention 8": CacheConfig(**base, placement="junctions", retention_interval=8),
    "dense": CacheConfig(**base),
  }.items():
    runs[name] = _first_step_hits(make_manager(cfg, backend), prompts)
  assert runs["junctions"] == runs["retention 0"] == runs["junctions, retention 8"]
  assert runs["dense"] != runs["junctions"]  # the prompts do reach the states in between


class SeamMachine(eviction_rules(prompts)):
  """Drives the jitted core and the twin under every registered placement, admission and
  retention policy (and the retention intervals they combine with); compares every result, the pool
  counters, the free-queue order and the state invariants."""

  @initialize(
    ci=st.integers(0, len(CONFIGS) - 1),
    placement=st.sampled_from(policies.PLACEMENT_POLICIES),
    admission=st.sampled_from(policies.ADMISSION_POLICIES),
    retention=st.sampled_from([None, 0, 8]),
    keep=st.sampled_from(policies.RETENTION_POLICIES),
  )
  def setup(self, ci, placement, admission, retention, keep):
    if keep != "prefix" and not CONFIGS[ci].get("pinning"):
      keep = "prefix"  # a retention policy acts on the pinned tier only
    self.config = CacheConfig(
      placement=placement,
      admission=admission,
      retention=keep,
      retention_interval=retention,
      **CONFIGS[ci],
      **_COMMON,
    )
    self.jax = make_manager(self.config, "jax")
    self.ref = make_manager(self.config, "reference")


TestSeamMachine = SeamMachine.TestCase
TestSeamMachine.settings = settings(
  max_examples=8, stateful_step_count=30, phases=_PHASES, deadline=None
)


# ---------------------------------------------------------------------------------------------
# chain features (`FreeBlocks.hits`, `FreeBlocks.chain_start`) and the `chain_value` example


@pytest.mark.parametrize("backend", ["jax", "reference"])
def test_chain_features_count_hits_and_record_the_state_chain(backend):
  """Full attention + mamba (align), block 4, 8 tokens per step. A (21 tokens) runs in chunks
  to 8, 16, 20, 21: full blocks ending at 4..20 (chain start = end - 4) and states at the
  chunk ends 8, 16, 20, each chaining to the previous one (0, 8, 16). B (16 shared + 13 new)
  and C (16 shared + 8 new) both hit 16 tokens: A's four KV blocks ending at 4..16 and its
  state at 16 each count 2 hits, its state at 8 (not touched: a recurrent hit holds one state)
  none. B's first state (24: chunk 16 -> 24) chains to its hit (16), its next (28) to 24; C
  runs 16 -> 20 -> 24: states at 20 (chain 16) and 24 (chain 20); their new KV blocks have no
  hits. Under chain_value (value = (end - chain) * (1 + hits)) the twice-hit state at 16 (8 * 3
  = 24) is evicted last, right after the twice-hit KV blocks (4 * 3 = 12)."""
  cfg = CacheConfig(**{**_FA_MAMBA, "max_num_batched_tokens": 8}, eviction="chain_value")
  m = make_manager(cfg, backend)
  shared = list(range(16))
  for name, tokens in (("A", list(range(21))), ("B", shared + list(range(100, 113)))):
    _serve(m, name, tokens)
  _serve(m, "C", shared + [200] * 8)
  feats = chain_features(m)
  got = sorted(feats.values())
  full = [(4, 2, 0), (8, 2, 4), (12, 2, 8), (16, 2, 12), (20, 0, 16)]  # A
  full += [(20, 0, 16), (24, 0, 20), (28, 0, 24)]  # B
  full += [(20, 0, 16), (24, 0, 20)]  # C
  states = [(8, 0, 0), (16, 2, 8), (20, 0, 16)]  # A
  states += [(24, 0, 16), (28, 0, 24)]  # B
  states += [(20, 0, 16), (24, 0, 20)]  # C
  assert got == sorted([(0, *f) for f in full] + [(1, *s) for s in states])
  m.schedule([])  # the re-ordering runs at the start of a step
  tail = [feats[b] for b in free_queue(m)[-5:]]
  assert sorted(tail[:4]) == [(0, 4, 2, 0), (0, 8, 2, 4), (0, 12, 2, 8), (0, 16, 2, 12)]
  assert tail[4] == (1, 16, 2, 8)


@pytest.mark.parametrize("backend", ["jax", "reference"])
def test_chain_features_reach_only_the_policies_that_read_them(backend, monkeypatch):
  """The requests of the hand-derived test above under lru, deepest_first and chain_value. Only
  chain_value declares it reads the chain features (`policies.Reads(chain=True)`): under the
  other two the jitted state has no `key_hits` / `chain_start` / `group_chain` columns at all (the
  core neither keeps nor writes them: its traced program is the one without them) and
  deepest_first's `FreeBlocks.hits` / `chain_start` are None on both backends, while
  chain_value's are filled. The keys registered (group, token end) are the same under all
  three (no block is evicted here)."""
  from hybrid_cache.core import compile_cache
  from hybrid_cache.core import state as core_state

  compile_cache.clear()  # the jitted twin's priority is read when a step is traced
  seen = {}
  twin = policies.core_eviction if backend == "jax" else policies.twin_eviction
  for name in ("deepest_first", "chain_value"):
    module = twin(name)

    def spy(*args, _priority=module.priority, _name=name):
      blocks = args[2] if backend == "jax" else args[1]
      seen.setdefault(_name, set()).add((blocks.hits is None, blocks.chain_start is None))
      return _priority(*args)

    monkeypatch.setattr(module, "priority", spy)
  keys = {}
  for eviction in ("lru", "deepest_first", "chain_value"):
    cfg = CacheConfig(**{**_FA_MAMBA, "max_num_batched_tokens": 8}, eviction=eviction)
    m = make_manager(cfg, backend)
    shared = list(range(16))
    _serve(m, "A", list(range(21)))
    _serve(m, "B", shared + list(range(100, 113)))
    _serve(m, "C", shared + [200] * 8)
    m.schedule([])  # the re-ordering runs at the start of a step
    feats = chain_features(m)  # (group, token end), hits and chain start only if read
    assert {len(f) for f in feats.values()} == {4 if eviction == "chain_value" else 2}
    keys[eviction] = sorted(f[:2] for f in feats.values())
    if backend == "jax":
      reads = eviction == "chain_value"
      assert m.state.has_chain == reads
      assert m.state.block_aux.shape[-1] == core_state.BlockAux.width(chain=reads)
      assert m.state.req_group.shape[-1] == core_state.ReqGroup.width(chain=reads)
  assert keys["lru"] == keys["deepest_first"] == keys["chain_value"]
  assert len(keys["lru"]) == 17  # the 10 KV blocks and 7 states of the test above
  assert seen == {"deepest_first": {(True, True)}, "chain_value": {(False, False)}}


# ---------------------------------------------------------------------------------------------
# `greedy_dual`: chain-aware GreedyDual with the eviction clock (`policies.Reads(clock=True)`)


def full_attention_config(eviction: str) -> CacheConfig:
  """Full attention only, block 4, blocks 1..5, under `eviction` (one step per request served
  alone): the hand-derived eviction cases here and in `lru2_test`."""
  return CacheConfig(
    groups=(GroupSpec("full"),),
    block_size=4,
    num_blocks=6,
    max_model_len=32,
    max_requests=2,
    max_num_batched_tokens=32,
    eviction=eviction,
  )


@pytest.mark.parametrize("backend", ["jax", "reference"])
def test_greedy_dual_keeps_a_hit_block_and_its_clock_rises(backend):
  """Full attention, block 4, blocks 1..5, max_model_len 32, default costs (1 FLOP per token,
  1 byte per block): F(L) = L, T[j] = j * 2^24 / 8 (u = 4, J = 8), so every block's eff = T[1] -
  T[0] = 2^21 and w = (1 + hits) * 2^21; clock L = 0 at first.

  A (5 tokens) pops 1, 2 (key on 1, ends at 4; 2 partial): queue [2, 3, 4, 5, 1]. A again hits
  block 1 (hits 1, stamp L = 0) and takes 2 again: same queue. B (5 other tokens) pops 2, 3: key
  on 2 (stamp 0, no hit), queue [3, 4, 5, 1, 2] (LRU's order). At the next step GreedyDual ranks
  2 (0 + 2^21) before 1 (0 + 2^22): [3, 4, 5, 2, 1]. C (13 tokens, 4 blocks) pops 3, 4, 5, 2: it
  evicts B's block 2 (LRU would evict the twice-used 1), the clock rises to its priority 2^21,
  and C's keys on 3, 4, 5 (ends 4, 8, 12) are stamped 2^21. C is freed tail first: [2, 1, 5, 4,
  3] after ranking, every candidate at 2^22 (1: 0 + 2 * 2^21; C's: 2^21 + 2^21): the hit bonus
  of 1 is used up by the clock, ties go least recently freed first. D (5 tokens) pops 2, 1:
  evicts 1, the clock rises to 2^22; D's key on 2 is stamped 2^22 (priority 3 * 2^21) and
  ranks after C's: [1, 5, 4, 3, 2]."""
  m = make_manager(full_attention_config("greedy_dual"), backend)
  unit = 1 << 21
  _serve(m, "A", list(range(5)))
  _serve(m, "A2", list(range(5)))
  _serve(m, "B", list(range(100, 105)))
  m.schedule([])  # the ranking runs at the start of a step
  assert free_queue(m) == [3, 4, 5, 2, 1]
  assert eviction_clock(m) == 0
  _serve(m, "C", list(range(200, 213)))
  m.schedule([])
  assert free_queue(m) == [2, 1, 5, 4, 3]
  assert eviction_clock(m) == unit
  # (group, token end, hits, chain start, stamp, ranked priority)
  assert chain_features(m) == {
    1: (0, 4, 1, 0, 0, 2 * unit),
    3: (0, 4, 0, 0, unit, 2 * unit),
    4: (0, 8, 0, 4, unit, 2 * unit),
    5: (0, 12, 0, 8, unit, 2 * unit),
  }
  _serve(m, "D", list(range(300, 305)))
  m.schedule([])
  assert free_queue(m) == [1, 5, 4, 3, 2]
  assert eviction_clock(m) == 2 * unit
  assert chain_features(m)[2] == (0, 4, 0, 0, 2 * unit, 3 * unit)


@pytest.mark.parametrize("backend", ["jax", "reference"])
def test_greedy_dual_keeps_a_long_state_chain_past_cheap_recent_blocks(backend):
  """Full attention + mamba (align), block 4, max_model_len 64, default costs: F(L) = 2L (one
  FLOP per token in each group), 1 byte per block, so T[j] = j * 2^24 / 16 = j * 2^20: a KV
  block's eff is T[1] - T[0] = 2^20, a state's (E - A) / 4 * 2^20 (A = its chain start). X (17
  tokens) registers KV blocks 1..4 (ends 4..16) and its state 5 at 16 chaining to 0 (eff 4 *
  2^20: a hit on it saves 16 tokens of the whole model); Y (5 other tokens) a KV block 7 and a
  state 6, both ending at 4 (eff 2^20). Every stamp is 0 (nothing evicted). LRU keeps the free
  order: X's blocks freed tail first (4, 3, 2, 1, 5), then Y's (7, 6). GreedyDual: the equal
  weights keep that LRU order, and X's state, worth four blocks, goes last: [..., 4, 3, 2, 1,
  7, 6, 5]."""
  orders = {}
  for eviction in ("lru", "greedy_dual"):
    cfg = CacheConfig(**{**CONFIGS[0], **_COMMON}, eviction=eviction)
    # LRU's order from the twin alone (the core's lru is checked against it elsewhere)
    m = make_manager(cfg, backend if eviction == "greedy_dual" else "reference")
    _serve(m, "X", list(range(17)))
    _serve(m, "Y", list(range(100, 105)))
    m.schedule([])
    orders[eviction] = free_queue(m)[-7:]
  assert orders["lru"] == [4, 3, 2, 1, 5, 7, 6]
  assert orders["greedy_dual"] == [4, 3, 2, 1, 7, 6, 5]
  # (group, token end, hits, chain start, stamp, ranked priority)
  unit = 1 << 20
  kv = {b: (0, 4 * b, 0, 4 * b - 4, 0, unit) for b in (1, 2, 3, 4)}
  states = {5: (1, 16, 0, 0, 0, 4 * unit), 6: (1, 4, 0, 0, 0, unit)}
  assert chain_features(m) == kv | states | {7: (0, 4, 0, 0, 0, unit)}


def test_greedy_dual_clock_rebase_agrees_between_twins():
  """Near int32's range the clock and every stamp drop by 2^28 (stamps floored at 0), on both
  twins alike: clock 2^29 + 5 -> 2^28 + 5, stamps (2^29, 2^28 + 3, 7) -> (2^28, 3, 0); at 2^29
  exactly nothing moves."""
  from hybrid_cache.core import eviction as core_eviction
  from hybrid_cache.core.fresh_state import init_state
  from hybrid_cache.core.state import BlockAux
  from hybrid_cache.core.state import Counters
  from hybrid_cache.twin import eviction as twin_eviction

  cfg = CacheConfig(groups=(GroupSpec("full"),), num_blocks=4, eviction="greedy_dual")
  top = 1 << 29
  for clock, stamps, want in (
    (top + 5, [0, top, (1 << 28) + 3, 7], (top + 5 - (1 << 28), [0, 1 << 28, 3, 0])),
    (top, [0, top, 5, 7], (top, [0, top, 5, 7])),
  ):
    s = init_state(cfg)
    aux = BlockAux(s.block_aux)[: len(stamps)].set(evict_stamp=np.asarray(stamps, np.int32))
    s = s.replace(block_aux=aux, counters=Counters(s.counters).set(evict_clock=clock))
    got = core_eviction.rebase_clock(s)
    core = (int(got.evict_clock), [int(t) for t in np.asarray(got.evict_stamp)[: len(stamps)]])
    assert core == want == twin_eviction.rebase_clock(clock, stamps)


# the configurations of the eviction machine (the second with uneven costs: quadratic attention,
# bytes per group), plus vLLM's partial hits (copy-on-write moves a key with its stamp) and two
# pools under one byte budget (evictions over the budget)
_GD_CONFIGS = (
  CONFIGS[0],
  dict(
    CONFIGS[1],
    eviction_flops_linear=(3.0, 2.0, 5.0),
    eviction_flops_quadratic=(0.5, 0.25, 0.0),
    eviction_block_bytes=(2.0, 2.0, 7.0),
  ),
  dict(
    groups=(GroupSpec("full", block_size=8), GroupSpec("mamba", block_size=16)),
    block_size=8,
    hash_block_size=4,
    num_blocks=28,
  ),
  dict(
    groups=(GroupSpec("full", block_size=8), GroupSpec("mamba", block_size=4, mode="all")),
    block_size=8,
    hash_block_size=4,
    fine_keys=True,
    num_blocks=24,
    state_slots=30,
    byte_budget=60,
    page_bytes=2,
    slot_bytes=3,
  ),
)


class GreedyDualMachine(eviction_rules(prompts)):
  """The eviction machine under `greedy_dual` alone (its invariant also compares the stamps,
  ranked priorities and the clock), over more configurations."""

  @initialize(ci=st.integers(0, len(_GD_CONFIGS) - 1))
  def setup(self, ci):
    self.config = CacheConfig(eviction="greedy_dual", **_GD_CONFIGS[ci], **_COMMON)
    self.jax = make_manager(self.config, "jax")
    self.ref = make_manager(self.config, "reference")


TestGreedyDualMachine = GreedyDualMachine.TestCase
TestGreedyDualMachine.settings = settings(
  max_examples=8, stateful_step_count=30, phases=_PHASES, deadline=None
)


# ---------------------------------------------------------------------------------------------
# `adaptive` placement: the branch point and a continuation point on a learned alignment

# full attention in blocks of 8 keyed at every hash block of 4, a state every 4 tokens (mode
# all): the core's grid of the simulator's checkpoint unit U = 4
_ADAPTIVE = dict(
  groups=(GroupSpec("full", block_size=8), GroupSpec("mamba", block_size=4, mode="all")),
  block_size=8,
  hash_block_size=4,
  fine_keys=True,
  num_blocks=200,
  placement="adaptive",
  **_COMMON,
)


def _learned(m, g: int) -> tuple[int, bool]:
  """(A in units, output flag) that recurrent group `g` of either backend has learned."""
  if hasattr(m, "state"):
    import jax

    from hybrid_cache.core.policies import adaptive

    row = jax.device_get(m.state.policy_state)[0, : adaptive.MARKS]
    a, out = adaptive.learned(row)
    return int(a), bool(out)
  return m._state.placement.learned(g)


@pytest.mark.parametrize("backend", ["jax", "reference"])
def test_adaptive_learns_the_alignment_and_places_the_continuation_point(backend):
  """U = 4 tokens (the recurrent block). P0 (tokens 0..39) keeps only its continuation point:
  A = 1, the last unit within its prompt, 40. Q0 (30 fresh tokens) keeps 28 (7 units), so a
  probe sharing its first 29 tokens hits 28. R_0 = P0[:16] + 8 fresh tokens diverges at 16:
  the attention holds 16 but no state (hit 0, spb 16); it keeps its branch point 16 (a probe
  sharing P0[:16] then hits 16) and its continuation 24. 9 requests diverge at 16 tokens (4
  units) and 8 at 32 (8 units); each is counted (0 < seen < cap: 4 < 5, 8 < 9), none in an
  output (P0 computed those units in its prompt). The decayed count reaches 16 at the 17th
  divergence (15.41, then 16.34 at 0.995): A = the largest 2^j with >= 90% of the depths at a
  multiple of 2^j units: all are multiples of 4, 8/17 of 8: A = 4 units (16 tokens), no output
  reuse. Q1 (30 fresh tokens) then keeps only 16 (the last multiple of 4 units within its 7),
  and the probe sharing its first 29 tokens hits 16, not 28."""
  m = make_manager(CacheConfig(**_ADAPTIVE), backend)
  p0 = list(range(40))
  _serve(m, "a", p0)
  assert _learned(m, 1) == (1, False)
  q0 = list(range(3000, 3030))
  _serve(m, "b", q0)
  assert m.lookup(q0[:29] + [9999]).hit_tokens == 28
  for k in range(17):
    depth = 16 if k % 2 == 0 else 32
    _serve(m, "c", p0[:depth] + [1000 + 10 * k + j for j in range(8)])
    if k == 0:
      assert m.lookup(p0[:16] + [7777] * 8).hit_tokens == 16  # R_0's branch point
    assert _learned(m, 1) == ((1, False) if k < 16 else (4, False))
  q1 = list(range(5000, 5030))
  _serve(m, "d", q1)
  assert m.lookup(q1[:29] + [9999]).hit_tokens == 16


def _run(m, name):
  for _ in range(8):
    view = m.request_view(name)
    if view.num_computed_tokens >= view.num_tokens:
      break
    m.schedule([ScheduleEntry(name)])


def placement_request(admitted, hit, spb, prompt, tokens, computed, keys):
  """The core's `PlacementRequest` of one registration call from Python values: `computed`
  bool[MB], `keys` MB u64 keys (split into the low and high u32 lanes)."""
  import jax.numpy as jnp

  from hybrid_cache.core.cache_keys import PlacementRequest

  k = np.array(keys, np.uint64)
  lanes = np.stack([k & 0xFFFFFFFF, k >> 32], axis=1).astype(np.uint32)
  return PlacementRequest(
    admitted=jnp.bool_(admitted),
    hit=jnp.int32(hit),
    spb=jnp.int32(spb),
    prompt=jnp.int32(prompt),
    tokens=jnp.int32(tokens),
    computed=jnp.asarray(computed),
    keys=jnp.asarray(lanes),
  )


def key_families(rng, mb: int, table_bits: int) -> list:
  """Three families of mb block keys (u64: low lane, high lane) for a policy's direct-mapped
  marks table of 2^table_bits entries: table entries 0..7 (collisions), tags from a small set
  (some equal), random high lanes."""
  return [
    rng.integers(0, 8, mb)
    | (rng.integers(0, 3, mb) << table_bits)
    | (rng.integers(0, 1 << 30, mb) << 32)
    for _ in range(3)
  ]


@pytest.mark.parametrize("backend", ["jax", "reference"])
def test_adaptive_learns_output_reuse_and_continues_at_the_computed_end(backend):
  """U = 4 tokens. B = 8 prompt tokens (0..7) + 24 output tokens (8..31), computed: its units
  past token 8 are marked as output. Q0 (10 prompt + 19 output tokens) keeps its prompt's last
  unit, 8 (A = 1, no output reuse): a probe sharing its first 17 tokens hits 8. 17 requests
  B[:16] + 8 fresh tokens each diverge at 16 tokens (4 units, < cap 5), inside B's output (the
  first hits 8, B's state, with spb 16; the others hit 16, the first one's branch point): at
  the 17th, A = 4 units (all depths are multiples of 4 units, none of 8) and the output flag is
  on (all in an output). Q1 (10 prompt + 19 output tokens) then keeps the last multiple of 4
  units within its 29 computed tokens (7 units): 16, inside its output (its prompt's 2 units
  hold none), and the probe sharing its first 17 tokens hits 16."""
  m = make_manager(CacheConfig(**_ADAPTIVE), backend)

  def serve(name, prompt, output):
    m.add_request(name, prompt)
    _run(m, name)
    m.append_tokens(name, output)
    _run(m, name)
    m.free(name)

  b = list(range(32))
  serve("a", b[:8], b[8:])
  q0 = list(range(3000, 3029))
  serve("b", q0[:10], q0[10:])
  assert m.lookup(q0[:17] + [9999]).hit_tokens == 8
  for k in range(17):
    m.add_request("c", b[:16] + [1000 + 10 * k + j for j in range(8)])
    _run(m, "c")
    m.free("c")
    assert _learned(m, 1) == ((1, False) if k < 16 else (4, True))
  q1 = list(range(5000, 5029))
  serve("d", q1[:10], q1[10:])
  assert m.lookup(q1[:17] + [9999]).hit_tokens == 16


def test_adaptive_twins_agree_on_random_calls():
  """The jitted `keep` against the twin's `Placement` on random registration calls (random
  slots, admissions, depths mostly at multiples of 4 units, prompts, computed ranges, keys
  from three families whose table entries collide): the same kept blocks, counts, marks and
  decisions after every call, the alignment learned past 1 and some divergences in outputs."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from hybrid_cache.core.layout import layout
  from hybrid_cache.core.policies import adaptive as core
  from hybrid_cache.twin.cache_keys import PlacementRequest as TwinRequest
  from hybrid_cache.twin.policies import adaptive as twin

  assert (core.SCALE, core.DECAY_DIV, core.MIN_OBS, core.TABLE_BITS) == (
    twin.SCALE,
    twin.DECAY_DIV,
    twin.MIN_OBS,
    twin.TABLE_BITS,
  )
  config = CacheConfig(**_ADAPTIVE)
  lay = layout(config)
  g = lay.recurrent_groups[0]
  bs, mb = lay.groups[g].block_size, lay.max_blocks
  pos = jnp.arange(mb)

  @jax.jit
  def call(table, r, req):
    return core.keep(lay, r, g, pos, (), None, table, req)

  rng = np.random.default_rng(0)
  fams = key_families(rng, mb, core.TABLE_BITS)
  table = jnp.zeros((1, core.state_size(lay)), jnp.int32)
  ref = twin.Placement(config)
  for _ in range(300):
    r = int(rng.integers(0, lay.max_requests))
    keys = [int(k) for k in fams[rng.integers(0, 3)]]
    d = int(rng.choice([4, 4, 4, 8, 12, 2, 16])) * bs
    prompt = d + int(rng.integers(-8, 24))
    tokens = min(prompt + int(rng.integers(0, 12)), mb * bs)
    hit = int(rng.choice([0, d]))
    spb = 0 if hit else int(rng.choice([0, d]))
    lo = int(rng.integers(0, mb))
    hi = int(rng.integers(lo, mb + 1))
    admitted = bool(rng.random() < 0.6)
    computed = np.zeros(mb, bool)
    computed[lo:hi] = True
    req = placement_request(admitted, hit, spb, prompt, tokens, computed, keys)
    table, mask = call(table, jnp.int32(r), req)
    ref.start(g, TwinRequest(f"s{r}", admitted, hit, spb, prompt, tokens, range(lo, hi), keys))
    assert np.flatnonzero(np.asarray(mask)).tolist() == sorted(ref.kept)
    row = np.asarray(table[0])
    assert row[: core.MARKS].tolist() == ref.stats[g]
    marks = row[core.MARKS : core.DECISIONS]
    assert {int(i): int(marks[i]) for i in np.flatnonzero(marks)} == ref.marks[g]
    a, out = ref.decision.get((g, f"s{r}"), (1, False))
    assert int(row[core.DECISIONS + r]) in ((0, 2) if (a, out) == (1, False) else (a * 2 + out,))
  a, _ = ref.learned(g)
  assert a > 1 and ref.stats[g][core.OUT] > 0


class AdaptiveMachine(eviction_rules(prompts)):
  """The differential machine under `adaptive` (jitted core == twin after every operation),
  on the machines' configs and the fine-key one: also the same block tables and the same
  learned counts and marks."""

  @initialize(
    ci=st.integers(0, len(CONFIGS)),
    retention=st.sampled_from([None, 0, 8]),
    warm=st.booleans(),
  )
  def setup(self, ci, retention, warm):
    if ci == len(CONFIGS):
      self.config = CacheConfig(**_ADAPTIVE)
    else:
      self.config = CacheConfig(
        placement="adaptive", retention_interval=retention, **CONFIGS[ci], **_COMMON
      )
    self.jax = make_manager(self.config, "jax")
    self.ref = make_manager(self.config, "reference")
    if warm:  # the first request, then 17 diverging from it after 8 tokens (2 units): A = 2
      for k in range(18):
        self.serve("e", list(FAMILIES[0][:8]) + [60 + k, 61, 62, 63, 64], keep=False)

  @invariant()
  def same_tables_and_statistics(self):
    if not hasattr(self, "jax"):
      return
    import jax
    import numpy as np

    from hybrid_cache.core.layout import layout
    from hybrid_cache.core.policies import adaptive

    for r in self._active():
      assert self.jax.request_view(r) == self.ref.request_view(r)
    table = np.asarray(jax.device_get(self.jax.state.policy_state))
    ref = self.ref._state.placement
    for row, g in enumerate(layout(self.config).recurrent_groups):
      assert table[row, : adaptive.MARKS].tolist() == ref.stats.get(g, [0] * adaptive.MARKS)
      marks = table[row, adaptive.MARKS : adaptive.DECISIONS]
      assert {int(i): int(marks[i]) for i in np.flatnonzero(marks)} == ref.marks.get(g, {})


TestAdaptiveMachine = AdaptiveMachine.TestCase
TestAdaptiveMachine.settings = settings(
  max_examples=6, stateful_step_count=30, phases=_PHASES, deadline=None
)
