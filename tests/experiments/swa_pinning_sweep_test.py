"""The SWA pinning sweep exercises the regime where pinning matters (SPEC B1).

Tiny setting: gemma3_tiny (window 24), blocks of 16, pool 39 usable blocks, prompts of a
64-token prefix + 8-token suffix, 2 output tokens. A finished request used 5 full + 5 SWA
blocks; 5 such requests (50 blocks) do not fit, so with pinning off the cyclic order
(5 firsts, then 5 repeats) evicts every prefix before its repeat: hit rate 0. With pinning a
finished request keeps only full blocks 0-3 and SWA blocks 1-3 (7 blocks) in the pinned tier,
so 5 prefixes (35 blocks) fit and every repeat hits its 64-token prefix: 64 / 72.
"""

from __future__ import annotations

import pytest

from experiments import swa_pinning_sweep


@pytest.mark.parametrize("cache_manager", ["reference", "jax"])
def test_pinning_keeps_prefixes_that_lru_loses(tmp_path, cache_manager):
  res = swa_pinning_sweep.run(
    str(tmp_path),
    num_prefixes=(5,),
    prefix_len=64,
    num_blocks=40,
    max_num_batched_tokens=128,
    max_model_len=128,
    cache_manager=cache_manager,
    progress=False,
    warm_each_point=False,
    rounds=1,
  )
  by_arm = {p["arm"]: p for p in res["points"]}
  assert by_arm["pin_off"]["hit_rate"] == 0.0
  assert by_arm["pin_on"]["hit_rate"] == pytest.approx(64 / 72)
  assert by_arm["pin_on"]["pinned_blocks_after"] == 5 * 7
  assert by_arm["pin_on"]["outputs_equal_to_pin_off"]
  assert (tmp_path / "swa_pinning_sweep.png").exists()
