"""`--fine-keys` (core policies): recurrent state blocks of the checkpoint unit U, hash block U
and `CacheConfig.fine_keys`, so the core's hits fall on multiples of U for a KV block B > U."""

import json

import pytest

from hybrid_cache.sim import core_sim
from hybrid_cache.sim.cli import main
from hybrid_cache.sim.testing import TINY
from hybrid_cache.sim.testing import small_chat
from hybrid_cache.sim.trace import write_marconi


def test_build_config_puts_states_on_the_unit():
  trace = small_chat(30)
  cfg, sizing = core_sim.build_config(trace, TINY, 1e6, "vllm_default", 8, checkpoint_unit=4)
  assert cfg.fine_keys and cfg.partial_hits and cfg.resolved_hash_block_size == 4
  assert [(g.kind, g.block_size, g.mode) for g in cfg.resolved_groups] == [
    ("full", 8, "align"),
    ("mamba", 4, "align"),
  ]
  assert cfg.junction_block_size == 4 and cfg.hit_alignment == 4
  assert sizing["checkpoint_unit"] == 4 and sizing["fine_keys"]


def test_hits_fall_on_the_unit_inside_kv_blocks():
  """With room for everything, every hit is a multiple of U = 4, some are not multiples of the
  KV block 8 (a state inside a cached KV block), and the twins agree."""
  trace = small_chat(30)
  cfg, _ = core_sim.build_config(trace, TINY, 1e6, "vllm_default", 8, checkpoint_unit=4)
  ref, _ = core_sim.replay(trace, cfg, "reference")
  jax, _ = core_sim.replay(trace, cfg, "jax")
  assert ref == jax
  hits = [t[2] for t in ref if t[2]]
  assert hits and all(h % 4 == 0 for h in hits)
  assert any(h % 8 for h in hits), hits


@pytest.mark.parametrize(
  "kw,match",
  [
    (dict(checkpoint_unit=3), "checkpoint_unit must be an integer >= 1 dividing block_size=8"),
    (dict(checkpoint_unit=8), "checkpoint_unit must be an integer >= 1 dividing block_size=8"),
    (dict(checkpoint_unit=4, hash_block_size=2), "hash_block_size must be unset or equal"),
    (dict(checkpoint_unit=4, layout="vllm"), "checkpoint_unit needs page_layout"),
  ],
)
def test_build_config_rejects_bad_units(kw, match):
  with pytest.raises(ValueError, match=match):
    core_sim.build_config(small_chat(5), TINY, 1e6, "vllm_default", 8, **kw)


def test_cli_fine_keys(tmp_path, capsys):
  path = tmp_path / "t.jsonl"
  write_marconi(small_chat(12), path)
  base = ["--trace", str(path), "--format", "marconi", "--model", "marconi_7b"]
  base += ["--capacity-bytes", "2e10", "--block-size", "512", "--backend", "reference"]
  assert main(base + ["--policy", "vllm_default", "--fine-keys"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert out["fine_keys"] and out["checkpoint_unit"] == 64 and out["hit_granularity"] == 64
  assert out["partial_hits"] and out["hash_block_size"] == 64
  assert main(base + ["--policy", "ckpt_adaptive", "--fine-keys"]) == 2
  assert "fine_keys applies to core policies only" in capsys.readouterr().err
