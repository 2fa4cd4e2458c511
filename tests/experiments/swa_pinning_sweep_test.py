"""The SWA pinning sweep reproduces its seed's collapse under the pre-fix free order (issue 16).

Tiny setting: gemma3_tiny (window 24), blocks of 16, pool 39 usable blocks, 2 requests in
flight, retention interval 0, prompts of a 64-token prefix + 8-token suffix, 2 output tokens.
5 prefixes served twice in cyclic order (5 firsts, then 5 repeats):
* "all_tail" (vLLM before #43447) without pinning: the unhashed SWA blocks each request frees
  queue behind the cached prefixes, so every prefix is evicted before its repeat: hit rate 0;
* with pinning a finished request keeps its 4 full-attention prefix blocks and the 2 SWA
  blocks before the prefix end in the pinned tier (6 blocks), 5 x 6 fit, every repeat hits its
  64-token prefix: 64 / 72;
* "scratch_first" (vLLM 0.33) reuses the unhashed blocks first, so the prefixes survive
  without pinning too.
Every arm's outputs equal the uncached run's.
"""

from __future__ import annotations

import pytest

from experiments import swa_pinning_sweep


@pytest.mark.parametrize("cache_manager", ["reference", "jax"])
def test_pinning_recovers_the_pre_fix_order_collapse(tmp_path, cache_manager):
  res = swa_pinning_sweep.run(
    str(tmp_path),
    num_prefixes=(5,),
    free_orders=("all_tail", "scratch_first"),
    concurrency=2,
    retention_interval=0,
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
  assert by_arm["all_tail/pin_off"]["hit_rate"] == 0.0
  assert by_arm["all_tail/pin_on"]["hit_rate"] == pytest.approx(64 / 72)
  assert by_arm["all_tail/pin_on"]["pinned_blocks_after"] == 5 * 6
  assert by_arm["scratch_first/pin_off"]["hit_rate"] == pytest.approx(64 / 72)
  assert all(p["outputs_equal_to_uncached"] for p in res["points"])
  assert (tmp_path / "swa_pinning_sweep.png").exists()


def test_bad_free_order_names_the_field(tmp_path):
  with pytest.raises(ValueError, match=r"free_orders must be a non-empty list from"):
    swa_pinning_sweep.run(str(tmp_path), free_orders=("fifo",))
