"""Eviction `lru2` (`core/policies/lru2.py`, twin `twin/policies/lru2.py`): LRU-2 over the
penultimate access step of each key (`policies.Reads(history=True)`), and the history a
retirement hands on (`core/release.inherit_history`): hand-derived cases on both backends and
the differential machine with retirement on."""

from __future__ import annotations

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
from hypothesis import settings
from hypothesis.stateful import initialize
from hypothesis.stateful import precondition
from hypothesis.stateful import rule

from hybrid_cache import policies
from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.core import access_history as core_history
from hybrid_cache.core import state as core_state
from hybrid_cache.core.access_history import TABLE_BITS
from hybrid_cache.core.fresh_state import init_state
from hybrid_cache.core.layout import layout
from hybrid_cache.factory import make_manager
from hybrid_cache.twin import access_history as twin_history
from hybrid_cache.twin import state as twin_state
from tests.hybrid_cache.paired_rules import NAMES
from tests.hybrid_cache.paired_rules import access_history
from tests.hybrid_cache.paired_rules import access_inherit
from tests.hybrid_cache.paired_rules import eviction_rules
from tests.hybrid_cache.paired_rules import free_queue
from tests.hybrid_cache.paired_rules import ghosts
from tests.hybrid_cache.paired_rules import kv_owners
from tests.hybrid_cache.policies_test import _ADAPTIVE
from tests.hybrid_cache.policies_test import _COMMON
from tests.hybrid_cache.policies_test import _GD_CONFIGS
from tests.hybrid_cache.policies_test import _PHASES
from tests.hybrid_cache.policies_test import full_attention_config
from tests.hybrid_cache.policies_test import prompts
from tests.hybrid_cache.retirement_policy_test import _ALL
from tests.hybrid_cache.retirement_policy_test import _run
from tests.hybrid_cache.retirement_policy_test import _serve
from tests.hybrid_cache.retirement_policy_test import _session


def test_lru2_reads_only_the_access_history():
  assert policies.EVICTION["lru2"] == policies.Reads(history=True)
  lay = layout(CacheConfig(**_ALL, eviction="lru2"))
  assert lay.access_history and not lay.chain_features and not lay.eviction_clock
  assert not layout(CacheConfig(**_ALL, eviction="greedy_dual")).access_history


def test_lru2_keeps_a_twice_used_block_that_lru_evicts():
  """Full attention, block 4, blocks 1..5; one step per request, so step k serves the k-th
  call. A (5 tokens, step 1) pops 1, 2: key on 1 (last 1, penult 0), 2 partial: queue
  [2, 3, 4, 5, 1]. A again (step 2) hits 1 (penult 1, last 2) and takes 2 again. B (5 other
  tokens, step 3) pops 2, 3: key on 2 (last 3, penult 0): queue [3, 4, 5, 1, 2], LRU's order.
  At the next step (4) LRU-2 ranks 2 (penult 0: used once) before 1 (penult 1): [3, 4, 5, 2,
  1]. C (13 tokens, 4 blocks, step 5) pops 3, 4, 5 and then B's block 2 under LRU-2, A's block
  1 under LRU: A's prefix survives only under LRU-2, B's only under LRU."""
  for backend in ("jax", "reference"):
    got = {}
    for eviction in ("lru", "lru2"):
      m = make_manager(full_attention_config(eviction), backend)
      _serve(m, "A", list(range(5)))
      _serve(m, "A2", list(range(5)))
      _serve(m, "B", list(range(100, 105)))
      m.schedule([])  # the ranking runs at the start of a step
      if eviction == "lru2":
        assert free_queue(m) == [3, 4, 5, 2, 1]
        assert access_history(m) == {1: (2, 1), 2: (3, 0)}
      else:
        assert free_queue(m) == [3, 4, 5, 1, 2]
        assert access_history(m) == {}  # the core keeps no history for lru
      _serve(m, "C", list(range(200, 213)))
      got[eviction] = (
        m.lookup(list(range(5))).hit_tokens,
        m.lookup(list(range(100, 105))).hit_tokens,
      )
    assert got == {"lru": (0, 4), "lru2": (4, 0)}, backend


def test_a_request_hands_the_previous_access_of_the_block_serving_its_hit_to_its_new_keys():
  """Full attention only (no recurrent group: the deepest full-attention hit block serves
  the hit). A (5 tokens, step 1) keys its first block (last 1, penult 0). A2 (A's 4 + 5
  tokens, step 2) hits that block (penult 1, last 2) and so inherits 1 (its access before
  this hit): the block it keys for tokens 4..7 takes (last 2, penult 1), not (2, 0). B (5
  other tokens, step 3) hits nothing: its key takes (3, 0). Recurrent groups: the turn-2 keys
  of `test_a_retirement_hands_...` inherit the hit state's 13."""
  for backend in ("jax", "reference"):
    m = make_manager(full_attention_config("lru2"), backend)
    _serve(m, "A", list(range(5)))
    assert list(access_history(m).values()) == [(1, 0)], backend
    _serve(m, "A2", list(range(9)))
    assert sorted(access_history(m).values()) == [(2, 1), (2, 1)], backend
    _serve(m, "B", list(range(100, 105)))
    assert sorted(access_history(m).values()) == [(2, 1), (2, 1), (3, 0)], backend
    if backend == "jax":
      assert access_inherit(m) == [0, 0]  # released slots inherit nothing


def test_a_key_registered_again_recalls_its_ghosts_last_access():
  """A (5 tokens, step 1) keys block 1 (last 1). B (13 tokens, step 2) takes blocks 2..5 and
  keys three (last 2). C (13 other tokens, step 3) needs four blocks: every free key has
  penult 0, so the least recently freed go first, B's partial block and then A's block 1:
  A's key is dropped and its ghost keeps last 1. A again (step 4) hits nothing (inherits 0),
  but its key recalls the ghost: (last 4, penult 1), where a new key has (4, 0). Its entry
  holds (last 1, A's tag) in both backends' tables."""
  for backend in ("jax", "reference"):
    m = make_manager(full_attention_config("lru2"), backend)
    _serve(m, "A", list(range(5)))
    _serve(m, "B", list(range(100, 113)))
    _serve(m, "C", list(range(200, 213)))
    assert m.lookup(list(range(5))).hit_tokens == 0
    assert (1, 0) not in access_history(m).values()
    assert [(last, _) for last, _ in ghosts(m).values() if last == 1] != [], backend
    _serve(m, "A", list(range(5)))
    assert [v for v in access_history(m).values() if v[0] == 4] == [(4, 1)], backend


def test_a_ghost_entry_keeps_the_latest_access_of_the_keys_that_meet_in_it():
  """Two ghosts written to one entry (same group, same low `TABLE_BITS` bits): the larger
  (last, tag) stays, whatever the order of the drops; a key whose tag differs recalls 0."""
  key_a, key_b = (5 << 32 | 3 << TABLE_BITS | 7, 0), (9 << 32 | 1 << TABLE_BITS | 7, 0)
  for order in ((key_a, key_b), (key_b, key_a)):
    s = twin_state.init_state(full_attention_config("lru2"))
    s.last[1], s.last[2] = 10, 20
    for b, key in zip((1, 2), order):
      s.key[b] = key
    for b in (2, 1):
      twin_history.record(s, b)
    newer = order[1]
    assert twin_history.recall(s, newer) == 20
    assert twin_history.recall(s, order[0]) == 0
  # the core's batch write is the same rule
  cfg = full_attention_config("lru2")
  st0 = init_state(cfg)
  ids = jnp.asarray([1, 2], jnp.int32)
  lo = jnp.asarray([3 << TABLE_BITS | 7, 1 << TABLE_BITS | 7], jnp.uint32)
  st0 = st0.replace(
    block_group=st0.block_group.at[ids].set(0),
    block_hash=st0.block_hash.at[ids, 0].set(lo),
    block_aux=core_state.BlockAux(st0.block_aux)[ids].set(key_last=jnp.asarray([10, 20])),
  )
  st1 = core_history.record(st0, ids)
  keys = jnp.stack([lo, jnp.zeros_like(lo)], axis=1)
  assert core_history.recall(st1, keys, jnp.zeros(2, jnp.int32)).tolist() == [0, 20]


def test_a_retirement_hands_the_superseded_states_history_to_the_new_deepest_state():
  """The two-turn sessions of `retirement_policy_test` (block 4, a state at every block end;
  one step per turn: session k's turns are steps 2k + 1 and 2k + 2), under lru2. Session 6 is
  the first whose turns retire (`superseded` decided on after 6 sessions). Turn 1 (step 13)
  keeps states 4 and 8 (last 13, penult 0) and retires 4 at its finish (penult 0: nothing to
  hand on). Turn 2 (step 14) hits 8 (penult 13, last 14), so it inherits 13 (8's access
  before this hit), keeps 12 and 16 (last 14, penult 13: inherited) and at its finish retires
  8 and 12: the state a lookup of its own 17 tokens reaches, 16, takes their largest
  penultimate access, 13 (the chain keeps its history either way). Without retirement 8, 12
  and 16 stay, each (14, 13)."""
  for backend in ("jax", "reference"):
    for retirement in ("none", "superseded"):
      m = make_manager(CacheConfig(**_ALL, eviction="lru2", retirement=retirement), backend)
      for k in range(6):
        t1, t2 = _session(k)
        _serve(m, "a", t1)
        _serve(m, "b", t2)
      t1, t2 = _session(6)
      _serve(m, "a", t1)
      m.add_request("b", t2)
      _run(m, "b")
      states = m.request_view("b").block_ids[1]  # null, the hit 8, 12, 16, the running state
      before = access_history(m)
      assert [before[b] for b in states[1:4]] == [(14, 13)] * 3, backend
      m.free("b")
      after = access_history(m)
      if retirement == "superseded":
        assert states[1] not in after and states[2] not in after  # retired
        assert after[states[3]] == (14, 13), backend
      else:
        assert [after[b] for b in states[1:4]] == [(14, 13)] * 3, backend
      assert m.lookup(t2[:16] + [7]).hit_tokens == 16


def test_the_history_columns_exist_only_under_lru2():
  """A history state carries every `block_aux` column (the chain and clock ones idle at their
  no-key values); the others keep their widths (their programs are unchanged)."""
  for eviction, width in (("lru", 3), ("chain_value", 5), ("greedy_dual", 7), ("lru2", 10)):
    m = make_manager(CacheConfig(**_ALL, eviction=eviction), "jax")
    _serve(m, "a", list(range(9)))
    assert m.state.block_aux.shape[-1] == width
    assert m.state.has_history == (eviction == "lru2")
    if eviction == "lru2":
      aux = core_state.BlockAux(m.state.block_aux)
      assert (aux.key_hits == 0).all() and (aux.evict_stamp == 0).all()
      assert (aux.chain_start == -1).all()


class Lru2Machine(eviction_rules(prompts)):
  """The eviction machine under `lru2` (its invariant also compares every key's last and
  penultimate access), on greedy_dual's configurations (partial hits move a key's history with
  it; a byte budget evicts) and, with retirement `superseded` (warmed by 20 two-turn sessions
  so that it retires), the mode-all and the `adaptive` fine-key ones."""

  @initialize(ci=st.integers(0, len(_GD_CONFIGS) + 1), warm=st.booleans())
  def setup(self, ci, warm):
    if ci == len(_GD_CONFIGS):
      self.config = CacheConfig(**_ALL, eviction="lru2", retirement="superseded")
    elif ci == len(_GD_CONFIGS) + 1:
      self.config = CacheConfig(**_ADAPTIVE, eviction="lru2", retirement="superseded")
    else:
      self.config = CacheConfig(eviction="lru2", **_GD_CONFIGS[ci], **_COMMON)
    self.jax = make_manager(self.config, "jax")
    self.ref = make_manager(self.config, "reference")
    self.seen = []
    if warm and ci >= len(_GD_CONFIGS):
      for k in range(20):
        t1, t2 = _session(k)
        self.serve("e", t1, keep=False)
        self.serve("e", t2, keep=False)

  @rule(name=st.sampled_from(NAMES), tokens=prompts, keep=st.booleans())
  def serve(self, name, tokens, keep):
    self.seen.append(tokens)
    super().serve(name, tokens, keep)

  @precondition(lambda self: self.seen)
  @rule(data=st.data(), name=st.sampled_from(NAMES))
  def serve_again(self, data, name):
    """A prompt served before, again (once its keys were evicted they recall their ghosts)."""
    self.serve(name, data.draw(st.sampled_from(self.seen)), False)


TestLru2Machine = Lru2Machine.TestCase
TestLru2Machine.settings = settings(
  max_examples=8, stateful_step_count=30, phases=_PHASES, deadline=None
)


def _owner_ends(m) -> dict[int, int]:
  """KV owners by token end (`core.kv_owner`): the key end of each owned full-attention block
  -> its owner's key end, on either backend."""
  owners = kv_owners(m)
  if hasattr(m, "state"):
    ends = [int(e) for e in jax.device_get(m.state.key_end)]
  else:
    ends = m._state.key_end
  return {ends[b]: ends[o] for b, o in owners.items()}


def test_a_finished_request_records_the_nearest_state_at_or_after_each_kv_block():
  """Full attention + mamba, block 4, A = 9 tokens. Mode all keeps a state at every block end
  (4, 8): each KV block is owned by the state at its own end. Align mode keeps one state at
  the prompt's checkpoint position floor((9 - 1) / 4) * 4 = 8: both KV blocks (ends 4, 8) are
  owned by it, the unit cache's leaf checkpoint with its KV."""
  for mode, want in (("all", {4: 4, 8: 8}), ("align", {4: 8, 8: 8})):
    cfg = CacheConfig(**{**_ALL, "groups": (GroupSpec("full"), GroupSpec("mamba", mode=mode))})
    for backend in ("jax", "reference"):
      m = make_manager(CacheConfig(**{**cfg.__dict__, "eviction": "lru2"}), backend)
      _serve(m, "A", list(range(9)))
      assert _owner_ends(m) == want, (mode, backend)


def test_kv_ranks_by_its_owner_state_and_first_once_the_state_is_gone():
  """`owned_priority` on both twins. Groups: 0 full attention, 1 mamba, 2 sliding window.
  Blocks 1, 2, 5 full attention (owners 3, 4, none), 3 a keyed state, 4 key-less, 6 a sliding
  window block; own priorities 10, 20, 50, -, 30, 40. Block 1 takes its owner's 50; block 2's
  owner lost its key: 0; block 5 has no owner (no state kept at or after it): 0; the state and
  the window block keep their own. Without a recurrent group every block keeps its own."""
  from hybrid_cache.core import kv_owner as core_owner
  from hybrid_cache.twin import kv_owner as twin_owner
  from hybrid_cache.twin.eviction import FreeBlocks as TwinBlocks

  groups = (GroupSpec("full"), GroupSpec("mamba", mode="all"), GroupSpec("swa", window=8))
  hybrid = CacheConfig(**{**_ALL, "groups": groups}, eviction="lru2")
  attention = CacheConfig(**{**_ALL, "groups": (groups[0], groups[2])}, eviction="lru2")
  for cfg, want in ((hybrid, [50, 0, 50, 0, 40]), (attention, [10, 20, 50, 30, 40])):
    lay = layout(cfg)
    group = [-1, 0, 0, 1, -1, 0, 2] + [-1] * (lay.num_blocks - 7)
    if cfg is attention:  # no mamba group: block 3 is a window block, 6 the other one
      group = [min(g, 1) for g in group]
    owner = [-1, 3, 4, -1, -1, -1, -1] + [-1] * (lay.num_blocks - 7)
    own = [0, 10, 20, 50, 0, 30, 40] + [0] * (lay.num_blocks - 7)
    state = init_state(cfg).replace(block_group=jnp.asarray(group, jnp.int32))
    got = core_owner.owned_priority(lay, state, jnp.asarray(own), jnp.asarray(owner))
    assert [int(got[b]) for b in (1, 2, 3, 5, 6)] == want, cfg.groups
    blocks = TwinBlocks(
      (1, 2, 3, 5, 6), [None if g < 0 else g for g in group], [0] * len(group), owner=owner
    )
    assert twin_owner.owned_priority(cfg, blocks, own.__getitem__) == want, cfg.groups
