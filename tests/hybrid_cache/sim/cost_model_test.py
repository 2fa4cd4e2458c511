"""Cost model numbers against hand-computed formulas."""

import dataclasses
import json

import numpy as np
import pytest

from hybrid_cache.sim.cost_model import get_model


def test_marconi_7b_bytes_and_flops():
  m = get_model("marconi_7b")
  d, n = 4096, 128
  assert m.state_bytes == 24 * (d * n * 2 + (2 * d + 2 * n) * 4 * 2) == 26_787_840
  assert m.kv_bytes_per_token == 4 * 2 * d * 2 == 65_536
  L = 1000
  f_attn = 8 * L * d * d + 4 * L * L * d
  f_mlp = 16 * L * d * d
  f_ssm = 12 * L * d * d + 16 * L * d * n + 10 * L * d
  assert m.attn_flops(L) == f_attn and m.mlp_flops(L) == f_mlp and m.recurrent_flops(L) == f_ssm
  assert m.prefill_flops(L) == 24 * f_ssm + 4 * f_attn + 28 * f_mlp
  # paper §3: 625 checkpoints + 10,000 tokens of KV = 17.4 GB
  assert round((625 * m.state_bytes + m.kv_bytes(10_000)) / 1e9, 1) == 17.4
  arr = np.array([L, 2 * L], np.int64)
  assert m.attn_flops(arr).tolist() == [f_attn, m.attn_flops(2 * L)]


def test_qwen3_5_9b_gdn_and_gqa_shapes():
  m = get_model("qwen3_5_9b")
  # 24 GDN layers: Hv 32 x dk 128 x dv 128 fp32 + conv 3 x (2*16*128 + 32*128) bf16
  assert m.conv_dim == 8192
  assert m.state_bytes == 24 * (32 * 128 * 128 * 4 + 3 * 8192 * 2) == 51_511_296
  assert m.kv_bytes_per_token == 8 * 2 * 4 * 256 * 2 == 32_768
  L = 10
  attn = 2 * L * 4096 * (16 + 8) * 256 + 2 * L * 16 * 256 * 4096 + 4 * L * L * 16 * 256
  assert m.attn_flops(L) == attn


def test_qwen3_5_0_8b_and_nemotron_states():
  q = get_model("qwen3_5_0_8b")
  assert q.state_bytes == 18 * (16 * 128 * 128 * 4 + 3 * 6144 * 2)  # 18 MiB + 0.63 MiB
  nm = get_model("nemotron_h_8b")
  # Mamba2 H 128, P 64, N 128 fp32 + conv 3 x (8192 + 2*8*128) bf16
  assert nm.state_bytes == 24 * (128 * 64 * 128 * 4 + 3 * (8192 + 2 * 8 * 128) * 2)
  g = get_model("gemma3_4b")
  assert g.state_bytes == 0 and g.swa_kv_bytes_per_token == 28 * 2 * 4 * 256 * 2
  assert g.swa_flops(5000) < g.attn_flops(5000)  # window caps the score term


def test_ttft_line():
  m = get_model("marconi_7b")
  assert m.ttft_ms(0) == pytest.approx(17.81 + 0.05296 * 50)
  assert m.ttft_ms(149) == pytest.approx(17.81 + 0.05296 * 150)
  assert m.ttft_ms(10**6) == pytest.approx(17.81 + 0.05296 * 31_950)


def test_unknown_model():
  with pytest.raises(ValueError, match="model must be one of"):
    get_model("gpt5")


def test_qwen3_5_like_vllm_block_by_page_equality():
  m = get_model("qwen3_5_like")
  # one GDN layer: Hv 32 x dk 128 x dv 128 fp32 + conv 3 x (2*16*128 + 32*128) bf16
  per_layer = 32 * 128 * 128 * 4 + 3 * 8192 * 2
  assert per_layer == 2_146_304 and m.state_bytes_per_layer == per_layer
  assert m.state_bytes == 24 * per_layer
  # one attention layer: K and V, 4 KV heads of 256, bf16
  assert m.kv_bytes_per_token_per_layer == 2 * 4 * 256 * 2 == 4096
  assert m.kv_bytes_per_token == 8 * 4096
  # 2,146,304 / 4,096 = 524 tokens -> Triton GDN (alignment 16): 33 * 16 = 528 (vLLM #40696)
  assert m.vllm_block_size(1) == 528
  # FlashInfer GDN prefill on Hopper, align mode: lcm(16, 64) = 64 -> 9 * 64 = 576
  assert m.vllm_block_size() == 576
  assert m.vllm_page_padding() == pytest.approx(1 - per_layer / (576 * 4096))
  # a Qwen3.5-397B-like layer (2 KV heads, Hv 64, conv 2*16*128 + 64*128): 2,084 tokens of KV
  big = dataclasses.replace(m, kv_heads=2, rec_heads=64)
  assert big.state_bytes_per_layer == 64 * 128 * 128 * 4 + 3 * 12288 * 2
  assert big.vllm_block_size(1) == 16 * 131 == 2096


def test_nemotron_h_like_vllm_block_by_page_equality():
  m = get_model("nemotron_h_like")
  per_layer = 128 * 64 * 128 * 4 + 3 * (8192 + 2 * 8 * 128) * 2
  assert per_layer == 4_255_744 and m.state_bytes == 24 * per_layer
  assert m.kv_bytes_per_token == 4 * 2 * 8 * 128 * 2 == 16_384
  # 4,255,744 / 4,096 = 1,039.0 tokens -> 65 blocks of 16 = 1,040
  assert m.vllm_block_size() == 1040
  assert get_model("gemma3_4b").vllm_block_size() == 16  # no recurrent layers: vLLM's default
  with pytest.raises(ValueError, match="checkpoint_alignment must be an integer >= 1"):
    m.vllm_block_size(0)


def test_step_ms_is_the_ttft_line_without_grid():
  m = get_model("marconi_7b")
  assert m.step_ms(0) == pytest.approx(17.81)
  assert m.step_ms(1000) == pytest.approx(17.81 + 52.96)


def test_cli_block_size_vllm(tmp_path, capsys):
  from hybrid_cache.sim.cli import main
  from hybrid_cache.sim.testing import small_chat
  from hybrid_cache.sim.trace import write_marconi

  path = tmp_path / "t.jsonl"
  write_marconi(small_chat(12), path)
  base = ["--trace", str(path), "--format", "marconi", "--capacity-bytes", "1e9"]
  for model, block in (("qwen3_5_like", 576), ("nemotron_h_like", 1040)):
    argv = base + ["--model", model, "--policy", "ckpt_adaptive", "--block-size", "vllm"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["block_size"] == block and out["block_size_rule"] == "vllm"
    assert out["model"] == model
  argv = base + ["--model", "qwen3_5_like", "--policy", "ckpt_adaptive", "--block-size", "vlm"]
  assert main(argv) == 2
  err = capsys.readouterr().err
  assert "block size must be an integer >= 1 or 'vllm', got 'vlm'" in err
  assert err.count("\n") == 1
