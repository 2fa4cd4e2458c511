"""The named views of `CacheState` (`state.py` module docstring): each property is the leaf's
row or column its constant names, the `Packed` view classes read, write and stack fields at their
constants' positions (lowering exactly as the indexing they name), and the module docstring
lists every view with its shape. The one test module besides `state.py` that uses the position
constants: it tests the packing itself."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.core import layout
from hybrid_cache.core import params
from hybrid_cache.core import state as st
from hybrid_cache.core.fresh_state import init_state
from hybrid_cache.factory import make_manager
from hybrid_cache.types import ScheduleEntry

CFG = CacheConfig(
  groups=(GroupSpec("full"), GroupSpec("swa", window=8), GroupSpec("mamba")),
  block_size=4,
  num_blocks=40,
  max_model_len=64,
  max_requests=4,
  pinning=True,
)
# the same with a policy that reads the chain features: the state carries their columns
CHAIN_CFG = dataclasses.replace(CFG, eviction="chain_value")
# views that exist only in a chain-feature state (`CacheState.has_chain`)
CHAIN_VIEWS = {"key_hits", "chain_start", "group_chain"}
# the same with a policy that keeps the eviction clock: also the stamp and ranked columns
CLOCK_CFG = dataclasses.replace(CFG, eviction="greedy_dual")
CLOCK_VIEWS = {"evict_stamp", "evict_ranked"}
# the same with a policy that reads the access history: every `block_aux` column (the chain and
# clock ones idle), the `req_group` of a state without the chain features
HISTORY_CFG = dataclasses.replace(CFG, eviction="lru2")
HISTORY_VIEWS = {"key_last", "key_penult", "kv_owner"}
# views of the `queue_order` rows: only with a re-keying eviction policy (`Layout.rekeys`)
ORDER_VIEWS = {"free_recency", "free_rank"}

# property -> (leaf, index of the row or column it names)
VIEWS = {
  "free_key": ("queue_key", (st.Q_FREE,)),
  "pinned_key": ("queue_key", (st.Q_PINNED,)),
  "free_recency": ("queue_order", (st.O_RECENCY,)),
  "free_rank": ("queue_order", (st.O_RANK,)),
  "key_step": ("block_aux", (slice(None), st.AUX_STEP)),
  "pinned": ("block_aux", (slice(None), st.AUX_PINNED)),
  "key_end": ("block_aux", (slice(None), st.AUX_END)),
  "key_hits": ("block_aux", (slice(None), st.AUX_HITS)),
  "chain_start": ("block_aux", (slice(None), st.AUX_CHAIN)),
  "evict_stamp": ("block_aux", (slice(None), st.AUX_STAMP)),
  "evict_ranked": ("block_aux", (slice(None), st.AUX_RANKED)),
  "key_last": ("block_aux", (slice(None), st.AUX_LAST)),
  "key_penult": ("block_aux", (slice(None), st.AUX_PENULT)),
  "kv_owner": ("block_aux", (slice(None), st.AUX_OWNER)),
  "index_block": ("index_entry", (Ellipsis, st.IDX_BLOCK)),
  "index_seq": ("index_entry", (Ellipsis, st.IDX_SEQ)),
  "req_status": ("req_info", (slice(None), st.INFO_STATUS)),
  "req_computed": ("req_info", (slice(None), st.INFO_COMPUTED)),
  "req_tokens": ("req_info", (slice(None), st.INFO_TOKENS)),
  "req_prompt": ("req_info", (slice(None), st.INFO_PROMPT)),
  "req_spb": ("req_info", (slice(None), st.INFO_SPB)),
  "group_len": ("req_group", (Ellipsis, st.RG_LEN)),
  "group_ncached": ("req_group", (Ellipsis, st.RG_NCACHED)),
  "group_last": ("req_group", (Ellipsis, st.RG_LAST)),
  "group_chain": ("req_group", (Ellipsis, st.RG_CHAIN)),
  "head_key": ("counters", (st.C_HEAD,)),
  "tail_key": ("counters", (st.C_TAIL,)),
  "pin_key": ("counters", (st.C_PIN,)),
  "clock": ("counters", (st.C_STEP,)),
  "next_seq": ("counters", (st.C_SEQ,)),
  "index_overflows": ("counters", (st.C_OVERFLOW,)),
  "states_admitted": ("counters", (st.C_REC_ADMITTED,)),
  "states_evicted": ("counters", (st.C_REC_EVICTED,)),
  "alpha_milli": ("counters", (st.C_ALPHA_MILLI,)),
  "states_retired": ("counters", (st.C_REC_RETIRED,)),
  "evict_clock": ("counters", (st.C_EVICT_CLOCK,)),
  "eviction_weighting": ("counters", (st.C_WEIGHTING,)),
  "order_exact": ("counters", (st.C_ORDER_EXACT,)),
  "order_lazy": ("counters", (st.C_ORDER_LAZY,)),
  "num_real_blocks": ("params", (params.P_NUM_BLOCKS,)),
  "max_batched_tokens": ("params", (params.P_MAX_BATCHED,)),
  "max_model_len": ("params", (params.P_MAX_MODEL_LEN,)),
  "watermark_blocks": ("params", (params.P_WATERMARK,)),
  "full_sequence_must_fit": ("params", (params.P_FULL_FIT,)),
  "retention_interval": ("params", (params.P_RETENTION,)),
  "pin_min_drop_size": ("params", (params.P_PIN_MIN_DROP,)),
  "marconi_junction": ("params", (params.P_JUNCTION,)),
  "free_all_tail": ("params", (params.P_ALL_TAIL,)),
  "first_slot": ("params", (params.P_FIRST_SLOT,)),
  "page_bytes": ("params", (params.P_PAGE_BYTES,)),
  "slot_bytes": ("params", (params.P_SLOT_BYTES,)),
  "byte_budget": ("params", (params.P_BYTE_BUDGET,)),
}


def _busy_state(cfg=CFG):
  """A state after admissions, a decode, a pinning finish and a re-admission (keys, pins,
  several steps): most columns hold non-default values."""
  m = make_manager(cfg, "jax")
  m.add_request("a", list(range(30)))
  m.add_request("b", list(range(12)) + list(range(100, 110)))
  for _ in range(3):
    m.schedule([ScheduleEntry("a", None), ScheduleEntry("b", None)])
  m.free("a")
  m.add_request("c", list(range(20)))
  m.schedule([ScheduleEntry("c", None)])
  return m.state


def _views(cfg):
  """The views of `cfg`'s state: the chain ones only with the chain features, the clock ones
  only with the eviction clock, the history ones only with the access history (whose state
  has the `block_aux` chain and clock columns too, idle)."""
  lay = layout.layout(cfg)
  hist = lay.access_history
  return {
    n: v
    for n, v in VIEWS.items()
    if (lay.chain_features or n not in CHAIN_VIEWS or (hist and n != "group_chain"))
    and (lay.eviction_clock or hist or n not in CLOCK_VIEWS)
    and (hist or n not in HISTORY_VIEWS)
    and (lay.rekeys or n not in ORDER_VIEWS)
  }


CFGS = pytest.mark.parametrize(
  "cfg",
  [CFG, CHAIN_CFG, CLOCK_CFG, HISTORY_CFG],
  ids=["lru", "chain_value", "greedy_dual", "lru2"],
)


@CFGS
def test_every_view_is_its_leaf_slice_on_device_and_host(cfg):
  state = _busy_state(cfg)
  host = jax.device_get(state)
  props = {
    n
    for cls in st.CacheState.__mro__
    for n, v in vars(cls).items()
    if isinstance(v, property) and not n.startswith("_")
  }
  assert props == set(VIEWS) | {"has_chain", "has_clock", "has_history"}
  lay = layout.layout(cfg)
  assert state.has_chain == host.has_chain == (lay.chain_features or lay.access_history)
  assert state.has_clock == host.has_clock == (lay.eviction_clock or lay.access_history)
  assert state.has_history == host.has_history == lay.access_history
  for name, (leaf, idx) in _views(cfg).items():
    want = np.asarray(getattr(host, leaf))[idx]
    np.testing.assert_array_equal(np.asarray(getattr(state, name)), want, err_msg=name)
    np.testing.assert_array_equal(getattr(host, name), want, err_msg=name)
  # the state is not trivial: keys, a pinned block, steps and requests of every status
  assert int(state.clock) == 4 and int(state.next_seq) > 0
  assert (np.asarray(state.key_end) > 0).any() and (np.asarray(state.pinned) == 1).any()
  assert set(np.asarray(state.req_status).tolist()) >= {st.STATUS_EMPTY, st.STATUS_RUNNING}


@CFGS
def test_views_inside_jit_equal_the_leaf_slices(cfg):
  state = _busy_state(cfg)
  views = _views(cfg)

  @jax.jit
  def both(s):
    return [(getattr(s, n), getattr(s, leaf)[idx]) for n, (leaf, idx) in views.items()]

  for (a, b), name in zip(both(state), views):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


def test_stack_places_fields_by_their_constants():
  step, pinned, end = jnp.arange(3), jnp.arange(3) + 10, jnp.arange(3) + 20
  aux = np.asarray(st.BlockAux.stack(key_step=step, pinned=pinned, key_end=end))
  assert aux.shape == (3, st.NUM_AUX) and st.BlockAux.width() == st.NUM_AUX
  np.testing.assert_array_equal(aux[:, st.AUX_STEP], step)
  np.testing.assert_array_equal(aux[:, st.AUX_PINNED], pinned)
  np.testing.assert_array_equal(aux[:, st.AUX_END], end)
  rg = np.asarray(st.ReqGroup.stack(length=step, ncached=pinned, last=end))
  assert rg.shape == (3, st.NUM_RG) and st.ReqGroup.width() == st.NUM_RG
  np.testing.assert_array_equal(rg[:, st.RG_LEN], step)
  np.testing.assert_array_equal(rg[:, st.RG_NCACHED], pinned)
  np.testing.assert_array_equal(rg[:, st.RG_LAST], end)
  qk = np.asarray(st.QueueKeys.stack(free=step, pinned=pinned))  # rows
  assert qk.shape == (st.NUM_QUEUES, 3)
  np.testing.assert_array_equal(qk[st.Q_FREE], step)
  np.testing.assert_array_equal(qk[st.Q_PINNED], pinned)
  counts = np.asarray(st.QueueCounts.stack(free=step, pinned=pinned))  # the last axis
  assert counts.shape == (3, st.NUM_QUEUES)
  np.testing.assert_array_equal(counts[:, st.Q_PINNED], pinned)
  ent = np.asarray(st.IndexEntry.stack(block=step, seq=end))
  np.testing.assert_array_equal(ent[:, [st.IDX_BLOCK, st.IDX_SEQ]].T, [step, end])
  assert st.BlockAux.NO_KEY[st.AUX_STEP] == -1 and st.BlockAux.NO_KEY[st.AUX_END] == -1
  assert st.BlockAux.NO_KEY[st.AUX_PINNED] == 0
  # the chain features' columns (a chain-feature state): given, placed after the others
  aux = np.asarray(
    st.BlockAux.stack(
      key_step=step, pinned=pinned, key_end=end, key_hits=step + 30, chain_start=step + 40
    )
  )
  assert aux.shape == (3, st.NUM_AUX_CHAIN) and st.BlockAux.width(True) == st.NUM_AUX_CHAIN
  np.testing.assert_array_equal(
    aux[:, [st.AUX_STEP, st.AUX_PINNED, st.AUX_END]].T, [step, pinned, end]
  )
  np.testing.assert_array_equal(aux[:, st.AUX_HITS], step + 30)
  np.testing.assert_array_equal(aux[:, st.AUX_CHAIN], step + 40)
  with pytest.raises(ValueError, match="both or neither"):
    st.BlockAux.stack(key_step=step, pinned=pinned, key_end=end, key_hits=step + 30)
  with pytest.raises(ValueError, match="both or neither"):
    st.QueueKeys.stack(free=step)
  rg = np.asarray(st.ReqGroup.stack(length=step, ncached=pinned, last=end, chain=step + 50))
  assert rg.shape == (3, st.NUM_RG_CHAIN) and st.ReqGroup.width(True) == st.NUM_RG_CHAIN
  np.testing.assert_array_equal(
    rg[:, [st.RG_LEN, st.RG_NCACHED, st.RG_LAST]].T, [step, pinned, end]
  )
  np.testing.assert_array_equal(rg[:, st.RG_CHAIN], step + 50)
  assert st.BlockAux.NO_KEY[st.AUX_HITS] == 0 and st.BlockAux.NO_KEY[st.AUX_CHAIN] == -1
  np.testing.assert_array_equal(st.BlockAux.no_key(False), st.BlockAux.NO_KEY[: st.NUM_AUX])
  np.testing.assert_array_equal(st.BlockAux.no_key(True), st.BlockAux.NO_KEY[: st.NUM_AUX_CHAIN])
  # the eviction clock's columns (stamp, ranked priority) after the chain features', 0 unkeyed
  aux = np.asarray(
    st.BlockAux.stack(
      key_step=step,
      pinned=pinned,
      key_end=end,
      key_hits=step + 30,
      chain_start=step + 40,
      evict_stamp=step + 60,
      evict_ranked=step + 70,
    )
  )
  assert aux.shape == (3, st.NUM_AUX_CLOCK) and st.BlockAux.width(True, True) == st.NUM_AUX_CLOCK
  np.testing.assert_array_equal(aux[:, st.AUX_STAMP], step + 60)
  np.testing.assert_array_equal(aux[:, st.AUX_RANKED], step + 70)
  np.testing.assert_array_equal(
    st.BlockAux.no_key(True, True), st.BlockAux.NO_KEY[: st.NUM_AUX_CLOCK]
  )
  assert st.BlockAux.NO_KEY[st.AUX_STAMP] == st.BlockAux.NO_KEY[st.AUX_RANKED] == 0
  # the access history's columns (last, penultimate access) after every other, 0 unkeyed
  assert (st.AUX_LAST, st.AUX_PENULT) == (st.NUM_AUX_CLOCK, st.NUM_AUX_CLOCK + 1)
  assert st.BlockAux.width(history=True) == st.NUM_AUX_HISTORY
  np.testing.assert_array_equal(st.BlockAux.no_key(False, history=True), st.BlockAux.NO_KEY)
  assert st.BlockAux.NO_KEY[st.AUX_LAST] == st.BlockAux.NO_KEY[st.AUX_PENULT] == 0
  assert st.BlockAux.positions("key_end", "key_step") == (st.AUX_END, st.AUX_STEP)


def test_view_fields_read_and_write_their_positions():
  info = jnp.arange(4 * st.NUM_INFO, dtype=jnp.int32).reshape(4, st.NUM_INFO)
  r = jnp.int32(2)
  assert int(st.ReqInfo(info)[r].computed) == int(info[2, st.INFO_COMPUTED])
  assert int(st.ReqInfo(info[2]).prompt) == int(info[2, st.INFO_PROMPT])
  np.testing.assert_array_equal(st.ReqInfo(info).spb, info[:, st.INFO_SPB])
  want = info.at[2, st.INFO_TOKENS].set(-5).at[2, st.INFO_STATUS].set(-6)
  np.testing.assert_array_equal(st.ReqInfo(info)[r].set(tokens=-5, status=-6), want)
  np.testing.assert_array_equal(st.ReqInfo(info)[r].add(spb=7), info.at[2, st.INFO_SPB].add(7))
  qk = jnp.arange(2 * 6, dtype=jnp.int32).reshape(st.NUM_QUEUES, 6)
  ids = jnp.asarray([1, 9])  # 9: out of range, dropped
  got = st.QueueKeys(qk)[ids].set(pinned=-1, mode="drop")
  np.testing.assert_array_equal(got, qk.at[st.Q_PINNED, 1].set(-1))
  np.testing.assert_array_equal(st.QueueKeys(qk)[ids[:1]].free, qk[st.Q_FREE, ids[:1]])
  c = np.zeros(st.NUM_COUNTERS, np.int32)  # NumPy: `set` writes a copy
  got = st.Counters(c).set(tail_key=3, clock=4)
  assert got[st.C_TAIL] == 3 and got[st.C_STEP] == 4 and not c.any()
  lanes = jnp.asarray([[1, 2], [3, 4]], jnp.uint32)
  assert st.HashLanes(lanes).hi.tolist() == [2, 4] and st.HashLanes(lanes).lo.tolist() == [1, 3]
  with pytest.raises(AttributeError, match="no field"):
    _ = st.ReqInfo(info).tokens_known


def _set_two(a, r, ncached, last):
  return a.at[r, :, st.RG_NCACHED].set(ncached).at[r, :, st.RG_LAST].set(last)


def test_view_reads_and_writes_lower_as_the_indexing_they_name():
  def text(f, *args):
    return jax.jit(f).lower(*args).as_text().split("\n", 1)[1]  # without the module's name

  rg = jnp.zeros((4, 3, st.NUM_RG_CHAIN), jnp.int32)
  r = jnp.int32(1)
  pairs = [
    (lambda a, r: st.ReqGroup(a)[r].length, lambda a, r: a[r, :, st.RG_LEN]),
    (lambda a, r: st.ReqGroup(a)[r, 2].chain, lambda a, r: a[r, 2, st.RG_CHAIN]),
    (lambda a, r: st.ReqGroup(a[r]).last, lambda a, r: a[r][:, st.RG_LAST]),
    (  # the values are computed first (keyword arguments), then written in keyword order
      lambda a, r: st.ReqGroup(a)[r].set(ncached=r, last=r + 1),
      lambda a, r: _set_two(a, r, r, r + 1),
    ),
    (lambda a, r: st.Counters(a[0, 0]).add(clock=r), lambda a, r: a[0, 0].at[st.C_STEP].add(r)),
  ]
  for view, hand in pairs:
    assert text(view, rg, r) == text(hand, rg, r)


@CFGS
def test_fresh_state_widths_and_no_key_rows(cfg):
  s = jax.device_get(init_state(cfg))
  lay = layout.layout(cfg)
  chain, clock, hist = lay.chain_features, lay.eviction_clock, lay.access_history
  assert chain == (cfg.eviction not in ("lru", "lru2"))  # only a policy that reads them
  assert clock == (cfg.eviction == "greedy_dual")  # only a policy with a clock
  assert hist == (cfg.eviction == "lru2")  # only a policy that reads the access history
  num_aux, num_rg = (st.NUM_AUX_CHAIN, st.NUM_RG_CHAIN) if chain else (st.NUM_AUX, st.NUM_RG)
  num_aux = st.NUM_AUX_CLOCK if clock else num_aux
  num_aux = st.NUM_AUX_HISTORY if hist else num_aux
  assert s.queue_key.shape == (st.NUM_QUEUES, lay.num_blocks)
  assert s.block_aux.shape == (lay.num_blocks, num_aux)
  assert s.index_entry.shape == (lay.buckets, layout.WAYS, st.NUM_IDX)
  assert s.req_info.shape == (lay.max_requests, st.NUM_INFO)
  assert s.req_group.shape == (lay.max_requests, lay.num_groups, num_rg)
  assert s.block_hash.shape[-1] == s.index_hash.shape[-1] == st.HASH_LANES
  assert (s.block_aux == st.BlockAux.no_key(chain, clock, hist)).all()
  assert int(s.evict_clock) == 0
  assert (s.group_last == -1).all() and (s.group_len == 0).all()
  if chain:
    assert (s.group_chain == 0).all()


def test_module_docstring_lists_every_view():
  doc = st.__doc__
  for name in VIEWS:
    assert f"`{name}`" in doc, name
