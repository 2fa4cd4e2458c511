"""Field-by-field comparison of `hybrid_cache.geometry.derive` with one recorded vLLM case."""

from __future__ import annotations

import os
from collections.abc import Callable

from tests.hybrid_cache.vllm_geometry.cases import CONFIG_DIR

SCALARS = (
  "enable_prefix_caching",
  "mamba_cache_mode",
  "mamba_ssm_cache_dtype",
  "prefix_cache_retention_interval",
  "max_num_batched_tokens",
  "max_num_seqs",
  "max_model_len",
  "model_dtype",
  "attention_backends",
  "gdn_prefill_backend",
  "prefill_checkpoint_alignment",
  "block_size",
  "mamba_block_size",
  "mamba_page_size_padded",
  "mamba_state_shapes",
  "mamba_state_dtypes",
  "mamba_state_bytes",
  "num_blocks",
  "scheduler_block_size",
  "hash_block_size",
  "cache_hit_alignment_tokens",
)
GROUP_FIELDS = (
  "kind",
  "layers",
  "block_size",
  "page_size_bytes",
  "sliding_window",
  "num_speculative_blocks",
  "num_prefill_checkpoint_blocks",
)
REASON_CHARS = 50  # vLLM's reasons are compared on their opening (numbers in GiB aside)


def _plain(value):
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  return value


def differences(row: dict, derive: Callable) -> list[str]:
  """Lines naming each field where `derive` differs from vLLM on `row` (empty: equal)."""
  where = row["id"]
  try:
    ours = derive(os.path.join(CONFIG_DIR, row["config"]), row["target"], row["flags"]).to_dict()
    error = None
  except ValueError as e:
    ours, error = None, str(e)
  if "error" in row:
    if error is None:
      return [f"{where}: vLLM rejects it ({row['error']}), derive does not"]
    if error[:REASON_CHARS] != row["error"][:REASON_CHARS]:
      return [f"{where}: reason {error!r} != vLLM's {row['error']!r}"]
    return []
  if error is not None:
    return [f"{where}: derive rejects it ({error}), vLLM does not"]
  vllm = row["vllm"]
  out = [
    f"{where}: {k} {_plain(ours[k])!r} != vLLM {vllm.get(k)!r}"
    for k in SCALARS
    if k in vllm and _plain(ours[k]) != vllm[k]
  ]
  if len(ours["groups"]) != len(vllm["groups"]):
    out.append(f"{where}: {len(ours['groups'])} groups != vLLM {len(vllm['groups'])}")
  else:
    for i, (a, b) in enumerate(zip(ours["groups"], vllm["groups"])):
      out += [
        f"{where}: groups[{i}].{k} {_plain(a[k])!r} != vLLM {b[k]!r}"
        for k in GROUP_FIELDS
        if _plain(a[k]) != b[k]
      ]
  return out
