"""Cost model numbers against hand-computed formulas."""

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
