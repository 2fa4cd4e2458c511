"""The named views of `CacheState` (`state.py` module docstring): each property is the leaf's
row or column its constant names, the row builders put columns in constant order, and the
module docstring lists every view with its shape."""

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
from hybrid_cache.core import rows
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

# property -> (leaf, index of the row or column it names)
VIEWS = {
  "free_key": ("queue_key", (st.Q_FREE,)),
  "pinned_key": ("queue_key", (st.Q_PINNED,)),
  "key_step": ("block_aux", (slice(None), st.AUX_STEP)),
  "pinned": ("block_aux", (slice(None), st.AUX_PINNED)),
  "key_end": ("block_aux", (slice(None), st.AUX_END)),
  "key_hits": ("block_aux", (slice(None), st.AUX_HITS)),
  "chain_start": ("block_aux", (slice(None), st.AUX_CHAIN)),
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
  """The views of `cfg`'s state: the chain ones only with the chain features."""
  chain = layout.layout(cfg).chain_features
  return {n: v for n, v in VIEWS.items() if chain or n not in CHAIN_VIEWS}


@pytest.mark.parametrize("cfg", [CFG, CHAIN_CFG], ids=["lru", "chain_value"])
def test_every_view_is_its_leaf_slice_on_device_and_host(cfg):
  state = _busy_state(cfg)
  host = jax.device_get(state)
  props = {
    n
    for cls in st.CacheState.__mro__
    for n, v in vars(cls).items()
    if isinstance(v, property) and not n.startswith("_")
  }
  assert props == set(VIEWS) | {"has_chain"}
  assert state.has_chain == host.has_chain == layout.layout(cfg).chain_features
  for name, (leaf, idx) in _views(cfg).items():
    want = np.asarray(getattr(host, leaf))[idx]
    np.testing.assert_array_equal(np.asarray(getattr(state, name)), want, err_msg=name)
    np.testing.assert_array_equal(getattr(host, name), want, err_msg=name)
  # the state is not trivial: keys, a pinned block, steps and requests of every status
  assert int(state.clock) == 4 and int(state.next_seq) > 0
  assert (np.asarray(state.key_end) > 0).any() and (np.asarray(state.pinned) == 1).any()
  assert set(np.asarray(state.req_status).tolist()) >= {st.STATUS_EMPTY, st.STATUS_RUNNING}


@pytest.mark.parametrize("cfg", [CFG, CHAIN_CFG], ids=["lru", "chain_value"])
def test_views_inside_jit_equal_the_leaf_slices(cfg):
  state = _busy_state(cfg)
  views = _views(cfg)

  @jax.jit
  def both(s):
    return [(getattr(s, n), getattr(s, leaf)[idx]) for n, (leaf, idx) in views.items()]

  for (a, b), name in zip(both(state), views):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


def test_row_builders_place_columns_by_their_constants():
  step, pinned, end = jnp.arange(3), jnp.arange(3) + 10, jnp.arange(3) + 20
  aux = np.asarray(rows.aux_columns(step, pinned, end))
  assert aux.shape == (3, st.NUM_AUX)
  np.testing.assert_array_equal(aux[:, st.AUX_STEP], step)
  np.testing.assert_array_equal(aux[:, st.AUX_PINNED], pinned)
  np.testing.assert_array_equal(aux[:, st.AUX_END], end)
  rg = np.asarray(rows.group_columns(step, pinned, end))
  assert rg.shape == (3, st.NUM_RG)
  np.testing.assert_array_equal(rg[:, st.RG_LEN], step)
  np.testing.assert_array_equal(rg[:, st.RG_NCACHED], pinned)
  np.testing.assert_array_equal(rg[:, st.RG_LAST], end)
  qk = np.asarray(rows.queue_rows(step, pinned))
  assert qk.shape == (st.NUM_QUEUES, 3)
  np.testing.assert_array_equal(qk[st.Q_FREE], step)
  np.testing.assert_array_equal(qk[st.Q_PINNED], pinned)
  assert rows.NO_KEY_AUX[st.AUX_STEP] == -1 and rows.NO_KEY_AUX[st.AUX_END] == -1
  assert rows.NO_KEY_AUX[st.AUX_PINNED] == 0
  # the chain features' columns (a chain-feature state): given, placed after the others
  aux = np.asarray(rows.aux_columns(step, pinned, end, step + 30, step + 40))
  assert aux.shape == (3, st.NUM_AUX_CHAIN)
  np.testing.assert_array_equal(
    aux[:, [st.AUX_STEP, st.AUX_PINNED, st.AUX_END]].T, [step, pinned, end]
  )
  np.testing.assert_array_equal(aux[:, st.AUX_HITS], step + 30)
  np.testing.assert_array_equal(aux[:, st.AUX_CHAIN], step + 40)
  with pytest.raises(ValueError, match="both hits and chain"):
    rows.aux_columns(step, pinned, end, step + 30)
  rg = np.asarray(rows.group_columns(step, pinned, end, step + 50))
  assert rg.shape == (3, st.NUM_RG_CHAIN)
  np.testing.assert_array_equal(
    rg[:, [st.RG_LEN, st.RG_NCACHED, st.RG_LAST]].T, [step, pinned, end]
  )
  np.testing.assert_array_equal(rg[:, st.RG_CHAIN], step + 50)
  assert rows.NO_KEY_AUX[st.AUX_HITS] == 0 and rows.NO_KEY_AUX[st.AUX_CHAIN] == -1
  np.testing.assert_array_equal(rows.no_key_aux(False), rows.NO_KEY_AUX[: st.NUM_AUX])
  np.testing.assert_array_equal(rows.no_key_aux(True), rows.NO_KEY_AUX)


@pytest.mark.parametrize("cfg", [CFG, CHAIN_CFG], ids=["lru", "chain_value"])
def test_fresh_state_widths_and_no_key_rows(cfg):
  s = jax.device_get(init_state(cfg))
  lay = layout.layout(cfg)
  chain = lay.chain_features
  assert chain == (cfg.eviction == "chain_value")  # only a policy that reads them
  num_aux, num_rg = (st.NUM_AUX_CHAIN, st.NUM_RG_CHAIN) if chain else (st.NUM_AUX, st.NUM_RG)
  assert s.queue_key.shape == (st.NUM_QUEUES, lay.num_blocks)
  assert s.block_aux.shape == (lay.num_blocks, num_aux)
  assert s.index_entry.shape == (lay.buckets, layout.WAYS, st.NUM_IDX)
  assert s.req_info.shape == (lay.max_requests, st.NUM_INFO)
  assert s.req_group.shape == (lay.max_requests, lay.num_groups, num_rg)
  assert s.block_hash.shape[-1] == s.index_hash.shape[-1] == st.HASH_LANES
  assert (s.block_aux == rows.no_key_aux(chain)).all()
  assert (s.group_last == -1).all() and (s.group_len == 0).all()
  if chain:
    assert (s.group_chain == 0).all()


def test_module_docstring_lists_every_view():
  doc = st.__doc__
  for name in VIEWS:
    assert f"`{name}`" in doc, name
