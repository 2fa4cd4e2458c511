"""Orbax round trip of model parameters."""

import jax
import numpy as np
import pytest
from flax import nnx

from models import config as config_lib
from models import hybrid_lm
from models import params_io
from models.testing import ToyDriver


def _pure(model):
  return nnx.to_pure_dict(nnx.split(model)[1])


def test_round_trip_restores_identical_params_and_logits(tmp_path):
  cfg = config_lib.hybrid3_tiny(num_layers=3, layer_pattern="GSA")
  model = hybrid_lm.build_model(cfg, seed=3)
  params_io.save_params(tmp_path / "ckpt", model)
  restored = params_io.restore_params(tmp_path / "ckpt", cfg)
  want, got = _pure(model), _pure(restored)
  assert jax.tree.structure(want) == jax.tree.structure(got)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(a, b)
  # A different seed gives different weights, so the equality above is not vacuous.
  other = _pure(hybrid_lm.build_model(cfg, seed=4))
  assert any(
    not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(other))
  )
  tokens = list(range(1, 40))
  outs = []
  for m in (model, restored):
    drv = ToyDriver(m, num_blocks=4, block_size=64, pad_tokens=64, pad_seqs=2, max_blocks=1)
    outs.append(drv.step([(drv.new_request(tokens), len(tokens))])[0])
  np.testing.assert_array_equal(outs[0], outs[1])


def test_bf16_params_keep_dtype(tmp_path):
  cfg = config_lib.qwen35_tiny(num_layers=2, layer_pattern="GA", dtype="bfloat16")
  model = hybrid_lm.build_model(cfg, seed=0)
  params_io.save_params(tmp_path / "bf16", model)
  got = _pure(params_io.restore_params(tmp_path / "bf16", cfg))
  dtypes = {str(x.dtype) for x in jax.tree.leaves(got)}
  assert "bfloat16" in dtypes
  for a, b in zip(jax.tree.leaves(_pure(model)), jax.tree.leaves(got)):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_restore_errors(tmp_path):
  cfg = config_lib.qwen35_tiny(num_layers=2, layer_pattern="GA")
  with pytest.raises(ValueError, match="path"):
    params_io.restore_params(tmp_path / "missing", cfg)
  params_io.save_params(tmp_path / "c", hybrid_lm.build_model(cfg, seed=0))
  with pytest.raises(ValueError, match="does not match"):
    params_io.restore_params(tmp_path / "c", cfg.replace(d_model=96))
