"""Bad input gets a ValueError naming the field, value and allowed range; state untouched."""

import pytest

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.factory import make_manager
from hybrid_cache.types import ScheduleEntry

FULL, MAMBA = GroupSpec("full"), GroupSpec("mamba")


def policy(**kw):
  kw.setdefault("groups", (FULL, MAMBA))
  kw.setdefault("block_size", 4)
  kw.setdefault("num_blocks", 32)
  kw.setdefault("max_model_len", 64)
  return make_manager(CacheConfig(**kw), "reference")


def snapshot(m):
  return (
    m.pool_stats(),
    m.active_requests(),
    tuple(m.request_view(r) for r in m.active_requests()),
    m.free_queue(),
  )


@pytest.fixture
def busy():
  m = policy()
  m.add_request("A", list(range(10)))
  m.schedule([ScheduleEntry("A")])
  return m


@pytest.mark.parametrize(
  "tokens,match",
  [
    ([], "length 0"),
    (list(range(65)), r"max_model_len=64.*65"),
    ([1, 2.5, 3], "integers"),
    ([1, -2], "integers >= 0.*-2"),
    (["a"], "integers"),
  ],
)
def test_bad_prompts(busy, tokens, match):
  before = snapshot(busy)
  with pytest.raises(ValueError, match=match):
    busy.add_request("B", tokens)
  assert snapshot(busy) == before


def test_duplicate_and_unknown_names(busy):
  before = snapshot(busy)
  with pytest.raises(ValueError, match="'A' is already active"):
    busy.add_request("A", [1, 2, 3])
  for call in (busy.free, busy.preempt, busy.request_view):
    with pytest.raises(ValueError, match="'nope'"):
      call("nope")
  with pytest.raises(ValueError, match=r"entries\[0\].req.*'nope'"):
    busy.schedule([ScheduleEntry("nope")])
  with pytest.raises(ValueError, match="'nope'"):
    busy.append_tokens("nope", [1])
  assert snapshot(busy) == before


def test_free_twice(busy):
  busy.free("A")
  before = snapshot(busy)
  with pytest.raises(ValueError, match="'A'"):
    busy.free("A")
  assert snapshot(busy) == before


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_schedule_entry_max_tokens(busy, bad):
  busy.add_request("B", list(range(8)))
  before = snapshot(busy)
  with pytest.raises(ValueError, match=r"entries\[1\].max_tokens.*>= 1"):
    busy.schedule([ScheduleEntry("A"), ScheduleEntry("B", bad)])
  assert snapshot(busy) == before


def test_duplicate_entry_in_one_step(busy):
  before = snapshot(busy)
  with pytest.raises(ValueError, match="twice"):
    busy.schedule([ScheduleEntry("A"), ScheduleEntry("A")])
  assert snapshot(busy) == before


def test_append_past_max_model_len(busy):
  before = snapshot(busy)
  with pytest.raises(ValueError, match="max_model_len=64"):
    busy.append_tokens("A", list(range(60)))
  with pytest.raises(ValueError, match="integers >= 0"):
    busy.append_tokens("A", [-5])
  assert snapshot(busy) == before


# ---- config errors (raised by config.py) ----


@pytest.mark.parametrize(
  "kw,match",
  [
    (dict(num_blocks=0), "num_blocks"),
    (dict(num_blocks=1), "num_blocks"),
    (dict(block_size=0), "block_size"),
    (dict(max_num_batched_tokens=0), "max_num_batched_tokens"),
    (dict(max_model_len=-1), "max_model_len"),
    (dict(watermark_blocks=-1), "watermark_blocks"),
    (dict(pin_min_drop_size=0), "pin_min_drop_size"),
    (dict(hash_block_size=3), r"multiple of hash_block_size=3"),
    (dict(groups=(FULL, GroupSpec("swa", block_size=6, window=8)), hash_block_size=4), "multiple"),
    (dict(retention_interval=6), "multiple of scheduler_block_size"),
    (dict(retention_interval=-4), "retention_interval"),
    (dict(eviction="fifo"), "eviction"),
    (dict(groups=()), "groups"),
  ],
)
def test_config_errors(kw, match):
  base = dict(groups=(FULL, MAMBA), block_size=4, num_blocks=32)
  base.update(kw)
  with pytest.raises(ValueError, match=match):
    CacheConfig(**base)


@pytest.mark.parametrize(
  "kw,match",
  [
    (dict(kind="conv"), "type"),
    (dict(kind="swa"), "window is required"),
    (dict(kind="swa", window=0), "window"),
    (dict(kind="full", window=8), "only valid for swa"),
    (dict(kind="mamba", mode="sometimes"), "mode"),
    (dict(kind="full", block_size=0), "block_size"),
  ],
)
def test_group_spec_errors(kw, match):
  with pytest.raises(ValueError, match=match):
    GroupSpec(**kw)


def test_retention_needs_swa_or_mamba():
  # As vLLM 0.33 (kv_cache_coordinator._validate_prefix_cache_retention_interval): 0, its
  # serving default, is accepted without window or recurrent groups; any other interval is not.
  assert CacheConfig(groups=(FULL,), num_blocks=8, retention_interval=0).retention_interval == 0
  with pytest.raises(ValueError, match="swa or mamba"):
    CacheConfig(groups=(FULL,), num_blocks=8, retention_interval=16)


def test_from_dict_rejects_unknown_keys():
  with pytest.raises(ValueError, match="unknown keys"):
    CacheConfig.from_dict({"groups": [{"type": "full"}], "num_blocks": 8, "colour": 1})
  with pytest.raises(ValueError, match=r"groups\[0\] has unknown keys"):
    CacheConfig.from_dict({"groups": [{"type": "full", "size": 3}], "num_blocks": 8})
