"""The geometry cases checked against vLLM 0.33: real published configs x GPU targets x flags.

Every config under `configs/hf/` on every target with vLLM's defaults, and on the configs in
`VARIANT_CONFIGS` each flag set of `VARIANTS` (vLLM option names; vLLM rejects some of them,
and then its reason is the expected answer). Every case sizes its pool with
`kv_cache_memory_bytes` (`MEMORY` unless the variant sets it), so `num_blocks` is compared too.
"""

from __future__ import annotations

import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CONFIG_DIR = os.path.join(REPO, "configs", "hf")
TARGETS = ("sm80", "sm90", "sm100")
MEMORY = 40_000_000_000
VARIANT_CONFIGS = (
  "qwen3_5_0p8b",
  "qwen3_5_35b_a3b",
  "qwen3_next_80b_a3b",
  "nemotron_h_8b",
  "nemotron_3_nano_30b_a3b",
  "gemma_3_1b",
  "gemma_3_4b",
)
VARIANTS: dict[str, dict] = {
  "server": {"usage_context": "server"},
  "block_64": {"block_size": 64},
  "block_1024": {"block_size": 1024},
  "ssm_bf16": {"mamba_ssm_cache_dtype": "bfloat16"},
  "conv_f32": {"mamba_cache_dtype": "float32"},
  "no_prefix_caching": {"enable_prefix_caching": False},
  "mamba_mode_none": {"mamba_cache_mode": "none"},
  "tp2": {"tensor_parallel_size": 2},
  "tp4": {"tensor_parallel_size": 4},
  "tp3": {"tensor_parallel_size": 3},
  "fp8": {"kv_cache_dtype": "fp8"},
  "gdn_triton": {"gdn_prefill_backend": "triton"},
  "gdn_cutedsl": {"gdn_prefill_backend": "cutedsl"},
  "pmu_16": {"prefix_match_unit": 16},
  "pmu_64": {"prefix_match_unit": 64},
  "pmu_16_shared_ckpt": {"prefix_match_unit": 16, "enable_mamba_shared_prefix_checkpoint": True},
  "max_len_4096": {"max_model_len": 4096},
  "max_len_too_long": {"max_model_len": 10_000_000},
  "budget_2048_seqs_64": {"max_num_batched_tokens": 2048, "max_num_seqs": 64},
  "retention_dense": {"prefix_cache_retention_interval": None},
  "mtp_1": {"speculative_config": {"method": "mtp", "num_speculative_tokens": 1}},
  "mtp_3": {"speculative_config": {"method": "mtp", "num_speculative_tokens": 3}},
  "small_memory": {"kv_cache_memory_bytes": 100_000_000},
  "small_memory_short": {"kv_cache_memory_bytes": 100_000_000, "max_model_len": 2048},
}


def configs() -> list[str]:
  """The config names under `configs/hf/` (each a directory holding a config.json)."""
  return sorted(
    d for d in os.listdir(CONFIG_DIR) if os.path.isfile(os.path.join(CONFIG_DIR, d, "config.json"))
  )


def cases() -> list[dict]:
  """Every case: {"id", "config", "target", "flags"} (flags include kv_cache_memory_bytes)."""
  out = []
  for config in configs():
    variants = {"default": {}} | (VARIANTS if config in VARIANT_CONFIGS else {})
    for target in TARGETS:
      for name, flags in variants.items():
        out.append(
          {
            "id": f"{config}/{target}/{name}",
            "config": config,
            "target": target,
            "flags": {"kv_cache_memory_bytes": MEMORY, **flags},
          }
        )
  return out
