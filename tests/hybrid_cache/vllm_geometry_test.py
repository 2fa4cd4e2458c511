"""`hybrid_cache.geometry.derive` against vLLM 0.33's own geometry, recorded on real configs.

`vllm_geometry/recorded.json.gz` holds what vLLM 0.33 derives (its own `EngineArgs`, platform,
backend selection, `_align_hybrid_block_size`, KV cache grouping and hashing functions, run by
`vllm_geometry/oracle_geometry.py` under the vLLM oracle) for every config under `configs/hf/`
(12 published configs: Qwen3.5 dense and MoE, Qwen3-Next, Nemotron-H dense and MoE, Gemma 3) on
sm80 / sm90 / sm100, with vLLM's defaults and, on seven of them, 24 flag sets. Every field must
be equal; where vLLM rejects a case, `derive` must reject it with the same reason.
Re-record with `python -m tests.hybrid_cache.vllm_geometry.record --oracle_dir=DIR`.
"""

from __future__ import annotations

import os

import pytest

from hybrid_cache.geometry import derive
from tests.hybrid_cache.vllm_geometry import cases as cases_module
from tests.hybrid_cache.vllm_geometry.compare import differences
from tests.hybrid_cache.vllm_geometry.record import load_recorded as _recorded


def test_recorded_cases_are_the_current_cases():
  assert [r["id"] for r in _recorded()] == [c["id"] for c in cases_module.cases()]


def test_enough_real_configs_and_targets():
  rows = _recorded()
  assert len({r["config"] for r in rows}) >= 10
  assert {r["target"] for r in rows} == {"sm80", "sm90", "sm100"}
  assert sum("vllm" in r for r in rows) >= 300  # most cases are geometries, not rejections


def test_every_field_equals_vllm():
  mismatches = []
  for row in _recorded():
    mismatches += differences(row, derive)
  assert not mismatches, f"{len(mismatches)} mismatches:\n" + "\n".join(mismatches[:40])


@pytest.mark.parametrize(
  "config,target,block",
  [
    ("qwen3_5_0p8b", "sm80", 544),  # Triton GDN prefill: page equality alone
    ("qwen3_5_0p8b", "sm90", 576),  # FlashInfer GDN prefill: a 64-token grid
    ("qwen3_5_35b_a3b", "sm80", 1056),
    ("qwen3_5_35b_a3b", "sm90", 1088),
  ],
)
def test_the_blocks_vllm_serves_qwen3_5_on(config, target, block):
  g = derive(os.path.join(cases_module.CONFIG_DIR, config), target)
  assert (g.block_size, g.mamba_block_size, g.hash_block_size) == (block, block, block)
