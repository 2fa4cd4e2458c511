"""`hf_cost_model`: cost models from Hugging Face configs, against hand counts, and the CLI.

Each family's tiny config is a literal; its per-token costs are written out by hand (the
formulas of `cost_model`'s module docstring, "generic"). The real configs' shape fields
(Qwen3.5-4B, Nemotron-H-8B-Base-8K, Gemma-3-4B) check the presets that mirror them.
"""

import dataclasses
import json

import pytest

from hybrid_cache.sim import cli as sim_cli
from hybrid_cache.sim.cost_model import get_model
from hybrid_cache.sim.hf_cost_model import cost_model_from_hf_config
from hybrid_cache.sim.hf_cost_model import load_cost_model

# Qwen3.5 text: 4 layers, full attention every 2nd -> GDN, A, GDN, A.
QWEN = {
  "model_type": "qwen3_5_text",
  "num_hidden_layers": 4,
  "full_attention_interval": 2,
  "hidden_size": 32,
  "intermediate_size": 64,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 8,
  "linear_num_key_heads": 2,
  "linear_num_value_heads": 4,
  "linear_key_head_dim": 8,
  "linear_value_head_dim": 16,
  "linear_conv_kernel_dim": 4,
  "dtype": "bfloat16",
}
# Nemotron-H: M - * - M (2 Mamba2, 1 attention, 2 MLP-only layers).
NEMOTRON = {
  "model_type": "nemotron_h",
  "layers_block_type": ["linear_attention", "mlp", "full_attention", "mlp", "linear_attention"],
  "hidden_size": 32,
  "intermediate_size": 48,
  "num_attention_heads": 4,
  "num_key_value_heads": 1,
  "head_dim": 8,
  "mamba_num_heads": 4,
  "mamba_head_dim": 16,
  "ssm_state_size": 8,
  "n_groups": 2,
  "conv_kernel": 4,
  "dtype": "float32",
}
# Qwen3.5-MoE text: GDN, A, GDN, A; every layer a MoE of 8 SwiGLU experts (top 2) of 16, a
# gated shared expert of 24; no dense MLP (no intermediate_size, as the real config).
QWEN_MOE = {
  **{k: v for k, v in QWEN.items() if k != "intermediate_size"},
  "model_type": "qwen3_5_moe_text",
  "num_experts": 8,
  "num_experts_per_tok": 2,
  "moe_intermediate_size": 16,
  "shared_expert_intermediate_size": 24,
}
# Nemotron-H: M E * - E (1 Mamba2, 1 attention, 1 MLP, 2 MoE layers of 8 relu2 experts, top 3).
NEMOTRON_MOE = {
  **NEMOTRON,
  "layers_block_type": ["linear_attention", "moe", "full_attention", "mlp", "moe"],
  "n_routed_experts": 8,
  "num_experts_per_tok": 3,
  "moe_intermediate_size": 16,
  "moe_shared_expert_intermediate_size": 40,
  "n_group": 2,
  "topk_group": 1,
  "routed_scaling_factor": 2.5,
}
# Gemma 3 text: S S A S S A (window 16).
GEMMA = {
  "model_type": "gemma3_text",
  "layer_types": ["sliding_attention"] * 2
  + ["full_attention"]
  + ["sliding_attention"] * 2
  + ["full_attention"],
  "sliding_window": 16,
  "hidden_size": 32,
  "intermediate_size": 64,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 16,
  "torch_dtype": "bfloat16",
}


def test_qwen3_5_hand_count():
  m = cost_model_from_hf_config(QWEN)
  assert (m.n_recurrent, m.n_attn, m.n_swa, m.n_mlp) == (2, 2, 0, 4)
  # KV of one token, one attention layer: K and V of 2 heads x 8, bf16.
  assert m.kv_bytes_per_token == 2 * (2 * 2 * 8 * 2) == 128
  # GDN state: Hv 4 x dk 8 x dv 16 fp32 + (K - 1) 3 x conv_dim (2*2*8 + 4*16 = 96) bf16.
  assert m.state_bytes_per_layer == 4 * 8 * 16 * 4 + 3 * 96 * 2 == 2_624
  assert m.state_bytes == 2 * 2_624
  L = 100
  # Attention: q_proj emits query + output gate (2 * 4 heads), k and v 2 heads each, of 8 wide:
  # 2 L 32 (8 + 4) 8; o_proj 2 L 4*8 32; scores and AV 4 L L 4*8 (non-causal count).
  attn = 2 * L * 32 * 12 * 8 + 2 * L * 32 * 32 + 4 * L * L * 32
  assert attn == 2_099_200
  # GDN: in_proj (conv_dim 96 + z 4*16 + b, a 2*4) from 32; out_proj 64 -> 32; conv 2*4*96 per
  # token; recurrence 6 Hv dk dv per token.
  gdn = 2 * L * 32 * (96 + 64 + 8) + 2 * L * 64 * 32 + 2 * 4 * 96 * L + 6 * L * 4 * 8 * 16
  assert gdn == 1_868_800
  mlp = 2 * L * 32 * 64 * 3  # SwiGLU: gate, up, down
  assert mlp == 1_228_800
  assert m.attn_flops(L) == attn and m.recurrent_flops(L) == gdn and m.mlp_flops(L) == mlp
  assert m.prefill_flops(L) == 2 * gdn + 2 * attn + 4 * mlp == 12_851_200


def test_qwen3_5_multimodal_and_next_read_the_same_fields():
  text = cost_model_from_hf_config(QWEN, name="q")
  wrapped = {"model_type": "qwen3_5", "text_config": {**QWEN, "model_type": "qwen3_5_text"}}
  assert cost_model_from_hf_config(wrapped, name="q") == text
  explicit = {**QWEN, "layer_types": ["linear_attention", "full_attention"] * 2}
  assert cost_model_from_hf_config(explicit, name="q") == text
  nxt = {**QWEN, "model_type": "qwen3_next", "num_experts": 8, "mlp_only_layers": [0, 1, 2, 3]}
  assert cost_model_from_hf_config(nxt, name="q") == text  # every layer dense


def test_nemotron_h_hand_count():
  m = cost_model_from_hf_config(NEMOTRON)
  assert (m.n_recurrent, m.n_attn, m.n_swa, m.n_mlp) == (2, 1, 0, 2)
  assert m.kv_bytes_per_token == 2 * 1 * 8 * 4 == 64  # K and V of 1 head x 8, fp32
  # Mamba2: d_inner 4*16 = 64, conv_dim 64 + 2*2*8 = 96; state H 4 x P 16 x N 8 fp32 + conv
  # 3 x 96 in the model dtype (fp32 here).
  assert m.state_bytes_per_layer == 4 * 16 * 8 * 4 + 3 * 96 * 4 == 3_200
  L = 100
  attn = 2 * L * 32 * (4 + 2) * 8 + 2 * L * 32 * 32 + 4 * L * L * 32  # no output gate
  assert attn == 1_792_000
  # in_proj (z, x: 2*64; B, C: 2*2*8; dt: 4) from 32; out_proj 64 -> 32; conv; 6 H P N.
  mamba = 2 * L * 32 * (128 + 32 + 4) + 2 * L * 64 * 32 + 2 * 4 * 96 * L + 6 * L * 4 * 16 * 8
  assert mamba == 1_843_200
  mlp = 2 * L * 32 * 48 * 2  # relu2: up, down
  assert mlp == 614_400
  assert m.prefill_flops(L) == 2 * mamba + attn + 2 * mlp == 6_707_200


def test_qwen3_5_moe_hand_count():
  m = cost_model_from_hf_config(QWEN_MOE)
  dense = cost_model_from_hf_config(QWEN)
  assert (m.n_recurrent, m.n_attn, m.n_mlp, m.n_moe) == (2, 2, 0, 4)
  # MoE holds no cache: KV and state bytes are the dense model's.
  assert (m.kv_bytes_per_token, m.state_bytes) == (dense.kv_bytes_per_token, dense.state_bytes)
  L = 100
  # Per token: router 32 -> 8; 2 experts x 3 matrices 32 x 16; shared 3 x 32 x 24; its gate
  # 32 -> 1. The 6 unused experts cost nothing.
  moe = 2 * L * 32 * (8 + 2 * 3 * 16 + 3 * 24 + 1)
  assert moe == 1_132_800
  assert m.moe_flops(L) == moe
  attn, gdn = dense.attn_flops(L), dense.recurrent_flops(L)  # the hand counts above
  assert m.prefill_flops(L) == 2 * gdn + 2 * attn + 4 * moe == 12_467_200
  wrapped = {"model_type": "qwen3_5_moe", "text_config": {**QWEN_MOE}}
  assert cost_model_from_hf_config(wrapped, name="q") == dataclasses.replace(m, name="q")


def test_qwen3_next_sparse_layers_follow_its_rule():
  nxt = {
    **QWEN_MOE,
    "model_type": "qwen3_next",
    "intermediate_size": 64,
    "mlp_only_layers": [2],
    "decoder_sparse_step": 1,
  }
  m = cost_model_from_hf_config(nxt)
  assert (m.n_mlp, m.n_moe) == (1, 3)  # layer 2 dense
  L = 100
  assert m.prefill_flops(L) - cost_model_from_hf_config(QWEN_MOE).prefill_flops(L) == (
    2 * L * 32 * 64 * 3 - 2 * L * 32 * (8 + 2 * 3 * 16 + 3 * 24 + 1)
  )
  every_2nd = cost_model_from_hf_config({**nxt, "mlp_only_layers": [], "decoder_sparse_step": 2})
  assert (every_2nd.n_mlp, every_2nd.n_moe) == (2, 2)  # layers 1 and 3


def test_nemotron_h_moe_hand_count():
  m = cost_model_from_hf_config(NEMOTRON_MOE)
  dense = cost_model_from_hf_config(NEMOTRON)
  assert (m.n_recurrent, m.n_attn, m.n_mlp, m.n_moe) == (1, 1, 1, 2)
  assert (m.kv_bytes_per_token, m.state_bytes) == (64, 3_200)  # one attention, one Mamba2 layer
  L = 100
  # Router 32 -> 8; 3 relu2 experts x 2 matrices 32 x 16; relu2 shared expert 2 x 32 x 40 (no
  # gate). Groups, bias and scaling choose and weigh experts: no FLOPs counted for them.
  moe = 2 * L * 32 * (8 + 3 * 2 * 16 + 2 * 40)
  assert moe == 1_177_600
  assert m.moe_flops(L) == moe
  mamba, attn, mlp = dense.recurrent_flops(L), dense.attn_flops(L), dense.mlp_flops(L)
  assert m.prefill_flops(L) == mamba + attn + mlp + 2 * moe == 6_604_800
  legacy = {k: v for k, v in NEMOTRON_MOE.items() if k != "layers_block_type"}
  legacy["hybrid_override_pattern"] = "ME*-E"
  assert cost_model_from_hf_config(legacy) == m
  without_mlp = {**NEMOTRON_MOE, "layers_block_type": ["linear_attention", "moe"]}
  del without_mlp["intermediate_size"]  # not needed without a dense MLP layer
  assert cost_model_from_hf_config(without_mlp).d_ff == 0


def test_nemotron_h_legacy_pattern_and_ssm_dtype():
  legacy = {k: v for k, v in NEMOTRON.items() if k != "layers_block_type"}
  legacy["hybrid_override_pattern"] = "M-*-M"
  assert cost_model_from_hf_config(legacy) == cost_model_from_hf_config(NEMOTRON)
  half = cost_model_from_hf_config({**NEMOTRON, "mamba_ssm_cache_dtype": "bfloat16"})
  assert half.state_bytes_per_layer == 4 * 16 * 8 * 2 + 3 * 96 * 4


def test_gemma3_hand_count():
  m = cost_model_from_hf_config(GEMMA)
  assert (m.n_recurrent, m.n_attn, m.n_swa, m.n_mlp, m.swa_window) == (0, 2, 4, 6, 16)
  assert m.state_bytes == 0
  assert m.kv_bytes_per_token == 2 * (2 * 2 * 16 * 2) == 256  # full layers: K, V 2 x 16 bf16
  assert m.swa_kv_bytes_per_token == 4 * (2 * 2 * 16 * 2) == 512  # inside the window
  L = 100
  proj = 2 * L * 32 * (4 + 4) * 16 + 2 * L * 64 * 32
  full = proj + 4 * L * L * 64
  swa = proj + 4 * L * 16 * 64  # scores over min(L, 16) keys
  mlp = 2 * L * 32 * 64 * 3  # GeGLU: gate, up, down
  assert (full, swa, mlp) == (3_788_800, 1_638_400, 1_228_800)
  assert m.prefill_flops(L) == 2 * full + 4 * swa + 6 * mlp == 21_504_000
  wrapped = {"model_type": "gemma3", "text_config": {**GEMMA, "model_type": "gemma3_text"}}
  assert cost_model_from_hf_config(wrapped, name="g") == dataclasses.replace(m, name="g")
  pattern = {k: v for k, v in GEMMA.items() if k != "layer_types"}
  pattern |= {"num_hidden_layers": 6, "sliding_window_pattern": 3}
  assert cost_model_from_hf_config(pattern) == m  # every 3rd layer full (default: 6th)


@pytest.mark.parametrize(
  "raw, needle",
  [
    ({"model_type": "llama"}, "model_type must be one of"),
    ({**QWEN, "linear_num_value_heads": None}, "config field linear_num_value_heads is required"),
    ({k: v for k, v in NEMOTRON.items() if k != "mamba_num_heads"}, "mamba_num_heads"),
    ({k: v for k, v in GEMMA.items() if k != "sliding_window"}, "sliding_window is required"),
    ({**QWEN, "model_type": "qwen3_next", "num_experts": -1}, "config field num_experts must"),
    (
      {**QWEN, "model_type": "qwen3_next", "num_experts": 8},
      "shared_expert_intermediate_size is required",
    ),
    ({**NEMOTRON_MOE, "moe_latent_size": 16}, "config field moe_latent_size=16 is not supported"),
    ({**NEMOTRON_MOE, "moe_intermediate_size": None}, "moe_intermediate_size is required"),
    ({**QWEN, "dtype": "int8"}, "config field dtype='int8' is not supported"),
    ({**GEMMA, "num_hidden_layers": 3}, "has 6 layers, num_hidden_layers is 3"),
    ({"model_type": "gemma3"}, "text_config must be an object"),
  ],
)
def test_errors_name_the_field(raw, needle):
  with pytest.raises(ValueError, match="^[^\n]*$") as e:
    cost_model_from_hf_config(raw)
  assert needle in str(e.value)


# ---- the presets against the real configs' shape fields ----

QWEN3_5_4B = {  # Qwen/Qwen3.5-4B config.json, text_config shape fields
  "model_type": "qwen3_5",
  "text_config": {
    "model_type": "qwen3_5_text",
    "num_hidden_layers": 32,
    "full_attention_interval": 4,
    "hidden_size": 2560,
    "intermediate_size": 9216,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "mamba_ssm_dtype": "float32",
    "dtype": "bfloat16",
  },
}
NEMOTRON_H_8B = {  # nvidia/Nemotron-H-8B-Base-8K config.json, shape fields
  "model_type": "nemotron_h",
  "num_hidden_layers": 52,
  "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
  "hidden_size": 4096,
  "intermediate_size": 21504,
  "num_attention_heads": 32,
  "num_key_value_heads": 8,
  "attention_head_dim": 128,
  "mamba_num_heads": 128,
  "mamba_head_dim": 64,
  "ssm_state_size": 128,
  "n_groups": 8,
  "conv_kernel": 4,
  "torch_dtype": "bfloat16",
}
GEMMA_3_4B = {  # google/gemma-3-4b-it config.json, text_config shape fields
  "model_type": "gemma3",
  "text_config": {
    "model_type": "gemma3_text",
    "num_hidden_layers": 34,
    "sliding_window_pattern": 6,
    "sliding_window": 1024,
    "hidden_size": 2560,
    "intermediate_size": 10240,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
  },
  "torch_dtype": "bfloat16",
}


def test_qwen3_5_like_matches_qwen3_5_4b_but_for_the_output_gate():
  preset = get_model("qwen3_5_like")
  m = cost_model_from_hf_config(QWEN3_5_4B, name=preset.name)
  # The preset leaves the attention output gate out of its FLOPs; everything else agrees.
  assert dataclasses.replace(m, attn_output_gate=False) == preset
  assert (m.state_bytes_per_layer, m.vllm_block_size()) == (2_146_304, 576)
  L = 1000
  gate = 8 * 2 * L * 2560 * 16 * 256  # 8 attention layers, the gate's 16 heads x 256 rows
  assert m.prefill_flops(L) - preset.prefill_flops(L) == gate


QWEN3_5_35B_A3B = {  # Qwen/Qwen3.5-35B-A3B config.json, text_config shape fields
  "model_type": "qwen3_5_moe",
  "tie_word_embeddings": False,
  "text_config": {
    "model_type": "qwen3_5_moe_text",
    "full_attention_interval": 4,
    "num_hidden_layers": 40,
    "hidden_size": 2048,
    "vocab_size": 248320,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "mamba_ssm_dtype": "float32",
    "dtype": "bfloat16",
  },
}


def test_qwen3_5_35b_a3b_counts_its_3b_active_parameters():
  m = cost_model_from_hf_config(QWEN3_5_35B_A3B)
  assert (m.n_recurrent, m.n_attn, m.n_mlp, m.n_moe) == (30, 10, 0, 40)
  # One MoE layer per token: router 256 x 2048, 8 of the 256 experts (3 x 2048 x 512 each), the
  # shared expert (3 x 2048 x 512) and its 2048 -> 1 gate.
  assert m.moe_flops(1) == 2 * 2048 * (256 + 8 * 3 * 512 + 3 * 512 + 1) == 57_675_776
  assert m.state_bytes_per_layer == 32 * 128 * 128 * 4 + 3 * 8192 * 2 == 2_146_304
  assert m.kv_bytes_per_token == 10 * 2 * 2 * 256 * 2 == 20_480
  # "A3B": the decoder's FLOPs per token / 2 plus the LM head (248,320 x 2048) ~ 3.0e9 active
  # parameters (the context-dependent attention term is 4 Hq d per token at L = 1).
  active = m.prefill_flops(1) // 2 + 248_320 * 2048
  assert 2.9e9 < active < 3.1e9, active


def test_nemotron_h_like_matches_nemotron_h_8b():
  for preset in (get_model("nemotron_h_like"), get_model("nemotron_h_8b")):
    assert cost_model_from_hf_config(NEMOTRON_H_8B, name=preset.name) == preset


def test_gemma3_4b_preset_differs_from_gemma_3_4b_in_the_layer_split():
  preset = get_model("gemma3_4b")
  m = cost_model_from_hf_config(GEMMA_3_4B, name=preset.name)
  # The real pattern (every 6th layer full) gives 5 full + 29 sliding; the preset has 6 + 28.
  assert (m.n_attn, m.n_swa) == (5, 29) and (preset.n_attn, preset.n_swa) == (6, 28)
  assert dataclasses.replace(m, n_attn=6, n_swa=28) == preset


# ---- files and the CLI ----


def test_load_cost_model_file_or_directory(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps(NEMOTRON))
  by_dir = load_cost_model(tmp_path)
  assert by_dir.name == str(tmp_path)
  assert load_cost_model(tmp_path / "config.json", name=by_dir.name) == by_dir
  (tmp_path / "bad.json").write_text('{"model_type": ')
  with pytest.raises(ValueError, match=r"bad\.json'?: malformed JSON at line 1"):
    load_cost_model(tmp_path / "bad.json")
  with pytest.raises(ValueError, match=r"nope.json' does not exist"):
    load_cost_model(tmp_path / "nope.json")


def _trace(tmp_path):
  rows = [
    {"input_tokens": [1, 2, 3, 4, 5, 6], "output_tokens": [7]},
    {"input_tokens": [1, 2, 3, 4, 5, 6, 7, 8], "output_tokens": []},
  ]
  p = tmp_path / "t.jsonl"
  p.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(p)


def _sim(capsys, *argv):
  rc = sim_cli.main(["--format", "marconi", "--capacity-bytes", "1e9", *argv])
  out, err = capsys.readouterr()
  return rc, out, err


@pytest.mark.parametrize("raw", [NEMOTRON, QWEN3_5_35B_A3B], ids=["nemotron_h", "qwen3_5_moe"])
def test_cli_model_config_end_to_end(tmp_path, capsys, raw):
  cfg = tmp_path / "model"
  cfg.mkdir()
  (cfg / "config.json").write_text(json.dumps(raw))
  trace = _trace(tmp_path)
  argv = ["--trace", trace, "--policy", "oracle", "--block-size", "2"]
  rc, out, err = _sim(capsys, *argv, "--model-config", str(cfg))
  assert rc == 0, err
  summary = json.loads(out)
  assert summary["model"] == str(cfg) and summary["requests"] == 2
  # The second request reuses 6 tokens (oracle, block 2): its saved FLOPs are the hand count's.
  m = cost_model_from_hf_config(raw)
  assert summary["flops_saved"] == m.prefill_flops(6)


@pytest.mark.parametrize(
  "extra, needles",
  [
    (["--model-config", "{tmp}/nope"], ["model config", "nope", "does not exist"]),
    (["--model-config", "{tmp}/bad.json"], ["bad.json", "model_type must be one of"]),
    (["--model", "marconi_7b", "--model-config", "{tmp}/bad.json"], ["not allowed with"]),
    ([], ["one of the arguments --model --model-config is required"]),
  ],
)
def test_cli_model_config_errors_are_one_line(tmp_path, capsys, extra, needles):
  (tmp_path / "bad.json").write_text(json.dumps({"model_type": "llama"}))
  extra = [x.format(tmp=tmp_path) for x in extra]
  rc, out, err = _sim(capsys, "--trace", _trace(tmp_path), "--policy", "oracle", *extra)
  assert rc == 2 and out == "" and "Traceback" not in err
  lines = [x for x in err.splitlines() if x.strip()]
  assert len(lines) == 1, err
  for needle in needles:
    assert needle in lines[0], (needle, lines[0])


def test_flop_aware_weights_count_the_moe_layers():
  """The core's FLOP-aware eviction weights (`alpha_tuning.cost_fields`, `core_groups.
  eviction_costs`) carry the MoE layers' FLOPs with the group that carries the feed-forward."""
  from hybrid_cache.config import GroupSpec
  from hybrid_cache.core.alpha_tuning import cost_fields
  from hybrid_cache.sim.core_groups import eviction_costs

  moe = cost_model_from_hf_config(QWEN3_5_35B_A3B)
  dense = dataclasses.replace(moe, n_moe=0)
  groups = (GroupSpec("mamba", mode="align"), GroupSpec("full"))
  per_token = moe.n_moe * moe.moe_flops(1)
  for fields in (cost_fields, eviction_costs):
    a = fields(moe, groups, 64)["eviction_flops_linear"]
    b = fields(dense, groups, 64)["eviction_flops_linear"]
    assert a[0] == pytest.approx(b[0])  # the recurrent group: no feed-forward
    assert a[1] - b[1] == pytest.approx(per_token, rel=1e-9)
