"""`--page-layout vllm`: vLLM's KV-cache groups of equal layer counts and per-layer page."""

import dataclasses
import json

import pytest

from hybrid_cache.sim import core_groups
from hybrid_cache.sim import core_sim
from hybrid_cache.sim.cli import main
from hybrid_cache.sim.cost_model import get_model
from hybrid_cache.sim.testing import TINY
from hybrid_cache.sim.testing import small_chat
from hybrid_cache.sim.trace import write_marconi


def test_vllm_groups_and_pages_by_hand():
  q = get_model("qwen3_5_like")  # 8 attention + 24 GDN layers -> groups of 8: 1 full + 3 mamba
  groups = core_groups.model_groups(q, "align", "vllm")
  assert [g.kind for g in groups] == ["full", "mamba", "mamba", "mamba"]
  page = 8 * 576 * 4096  # 8 layers x one layer's KV page at vLLM's block
  assert core_groups.page_bytes(q, groups, 576, "vllm") == page == 18_874_368
  assert core_groups.group_block_bytes(q, groups, 576, "vllm") == [page] + [8 * 2_146_304] * 3
  # the one-group-per-kind model: the whole state (24 layers) is the page
  one = core_groups.model_groups(q, "align")
  assert core_groups.page_bytes(q, one, 576) == 24 * 2_146_304
  m = get_model("marconi_7b")  # 4 attention + 24 SSM -> 1 full + 6 mamba groups of 4
  assert core_groups.vllm_group_size(m) == 4
  g7 = core_groups.model_groups(m, "align", "vllm")
  assert len(g7) == 7 and core_groups.page_bytes(m, g7, 512, "vllm") == 4 * 512 * 16_384
  n = get_model("nemotron_h_like")
  gn = core_groups.model_groups(n, "align", "vllm")
  assert core_groups.page_bytes(n, gn, 1040, "vllm") == 4 * 1040 * 4096
  # a block below page equality: the page is the state's (vLLM would raise the block)
  assert core_groups.page_bytes(n, gn, 16, "vllm") == 4 * 4_255_744


def test_build_config_sizing_and_same_hits_with_room():
  model = dataclasses.replace(TINY, n_recurrent=3)  # 1 attention + 3 recurrent layers
  trace = small_chat(30)
  cfg, sizing = core_sim.build_config(trace, model, 1e6, "vllm_default", 4, layout="vllm")
  assert sizing["groups"] == ["full", "mamba", "mamba", "mamba"]
  assert sizing["page_bytes"] == max(4 * 4, 34) and sizing["layers_per_group"] == 1
  assert sizing["num_blocks"] == int(1e6 // 34) + 1
  base, _ = core_sim.build_config(trace, model, 1e6, "vllm_default", 4)
  t_vllm, _ = core_sim.replay(trace, cfg, "reference")
  t_model, _ = core_sim.replay(trace, base, "reference")
  assert t_vllm == t_model and any(t[2] for t in t_vllm)


def test_cli_page_layout(tmp_path, capsys):
  path = tmp_path / "t.jsonl"
  write_marconi(small_chat(12), path)
  base = ["--trace", str(path), "--format", "marconi", "--model", "qwen3_5_like"]
  base += ["--capacity-bytes", "2e9", "--block-size", "vllm", "--backend", "reference"]
  assert main(base + ["--policy", "vllm_default", "--page-layout", "vllm"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert out["page_layout"] == "vllm" and out["page_bytes"] == 18_874_368
  assert out["groups"] == ["full", "mamba", "mamba", "mamba"]
  assert main(base + ["--policy", "ckpt_adaptive", "--page-layout", "vllm"]) == 2
  assert "page_layout 'vllm' applies to core policies only" in capsys.readouterr().err


def test_pools_share_or_split_the_bytes_and_pad_nothing():
  """`--page-layout pools`: TINY's KV page at B = 4 is 16 B, one state 34 B. By default both
  draw on the whole 1,000 B (`CacheConfig.byte_budget`): ids for either to fill it, 1,000 // 16
  pages (+ the null block) and 1,000 // 34 slots. With `state_fraction` 0.5: 500 // 16 = 31
  pages (+ null) and 500 // 34 = 14 slots, each limited by its ids. No padding either way."""
  trace = small_chat(30)
  cfg, sizing = core_sim.build_config(trace, TINY, 1000, "vllm_default", 4, layout="pools")
  assert (cfg.num_blocks, cfg.state_slots) == (63, 29)
  assert (cfg.byte_budget, cfg.page_bytes, cfg.slot_bytes) == (1000, 16, 34)
  assert sizing["page_bytes"] == 16 and sizing["slot_bytes"] == 34
  assert sizing["page_padding"] == [0.0, 0.0] and sizing["state_fraction"] is None
  cfg2, sizing2 = core_sim.build_config(
    trace, TINY, 1000, "vllm_default", 4, layout="pools", state_fraction=0.5
  )
  assert (cfg2.num_blocks, cfg2.state_slots, cfg2.byte_budget) == (32, 14, None)
  assert sizing2["state_fraction"] == 0.5
  # the longest request (73 tokens) holds 20 pages and, in align mode, 3 states
  with pytest.raises(ValueError, match="capacity_bytes must be >= 422"):
    core_sim.build_config(trace, TINY, 400, "vllm_default", 4, layout="pools")
  with pytest.raises(ValueError, match="too small for the pages"):
    core_sim.build_config(trace, TINY, 200, "vllm_default", 4, layout="pools", state_fraction=0.5)
  with pytest.raises(ValueError, match="too small for the state slots"):
    core_sim.build_config(trace, TINY, 1000, "vllm_default", 4, layout="pools", state_fraction=0.05)
  attn_only = dataclasses.replace(TINY, n_recurrent=0)
  with pytest.raises(ValueError, match="needs a model with attention and recurrent layers"):
    core_sim.build_config(trace, attn_only, 1000, "vllm_default", 4, layout="pools")


def test_pools_hit_like_one_pool_with_room_and_backends_agree_under_pressure():
  trace = small_chat(40)
  roomy, _ = core_sim.build_config(trace, TINY, 1e6, "vllm_default", 4, layout="pools")
  one, _ = core_sim.build_config(trace, TINY, 1e6, "vllm_default", 4)
  t_pools, _ = core_sim.replay(trace, roomy, "reference")
  t_one, _ = core_sim.replay(trace, one, "reference")
  assert t_pools == t_one and any(t[2] for t in t_pools)
  for fraction in (None, 0.5):  # one shared byte budget, a fixed split
    tight, _ = core_sim.build_config(
      trace, TINY, 34 * 30, "vllm_default", 4, layout="pools", state_fraction=fraction
    )
    ref, ref_extra = core_sim.replay(trace, tight, "reference")
    jax_, jax_extra = core_sim.replay(trace, tight, "jax")
    assert ref == jax_ and any(t[2] for t in ref)
    got = jax_extra["final_cached_blocks_per_group"]
    assert ref_extra["final_cached_blocks_per_group"] == got


def test_cli_state_fraction(tmp_path, capsys):
  path = tmp_path / "t.jsonl"
  write_marconi(small_chat(12), path)
  base = ["--trace", str(path), "--format", "marconi", "--model", "qwen3_5_like"]
  base += ["--capacity-bytes", "2e9", "--block-size", "576", "--backend", "reference"]
  pools = ["--policy", "vllm_default", "--page-layout", "pools"]
  assert main(base + pools + ["--state-fraction", "0.3"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert out["page_layout"] == "pools" and out["state_fraction"] == 0.3 and out["state_slots"] > 0
  assert main(base + ["--policy", "vllm_default", "--state-fraction", "0.3"]) == 2
  assert "state_fraction needs --page-layout pools" in capsys.readouterr().err
  assert main(base + pools + ["--state-fraction", "1.5"]) == 2
  assert "state fraction must be a number in (0, 1)" in capsys.readouterr().err
