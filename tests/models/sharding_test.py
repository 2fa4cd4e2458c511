"""The jitted forward over a mesh of the 8 virtual CPU devices (heads sharded) equals 1 device."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from models import config as config_lib
from models import hybrid_lm
from models.testing import ToyDriver
from models.testing import max_rel_diff

# Attention projections and the MLP are tensor-parallel (column-sharded in, row-sharded out);
# recurrent states and KV pages are sharded on their head axis. GDN/Mamba2 projections stay
# replicated: sharding them on this 2-core CPU host made the 8-device program hang in XLA's
# CPU collectives inside the chunk scan (observed with jax 0.10.2).
_COLS = ("q_proj", "k_proj", "v_proj", "gate", "up")
_ROWS = ("o_proj", "down")


def _param_spec(path, x):
  names = [str(getattr(p, "key", p)) for p in path]
  if x.ndim == 2 and names[-1] == "kernel" and names[-2] in _COLS:
    return P(None, "model")
  if x.ndim == 2 and names[-1] == "kernel" and names[-2] in _ROWS:
    return P("model", None)
  return P()


def _cache_specs(cache):
  heads = P(None, None, None, "model", None)  # [L, NB, B, H_kv, D]
  state = P(None, None, "model", None, None)  # [L, NB, H, dk, dv] / [L, NB, H, P, N]
  return cache.replace(
    k=heads, v=heads, gdn_state=state, mamba_state=state, gdn_conv=P(), mamba_conv=P()
  )


def _run(drv, prompt, prefix, reshard=None):
  a = drv.new_request(prompt)
  first = drv.step([(a, prefix)])[0]
  if reshard is not None:
    # Put the returned cache back on the input shardings so the second step reuses the
    # same executable (the compiler may pick other output shardings).
    drv.cache = reshard(drv.cache)
  rest = drv.step([(a, len(prompt) - prefix)])[0]
  return np.concatenate([first, rest])


@pytest.mark.slow
def test_sharded_forward_equals_single_device():
  """Known issue: on the shared 2-core CI host this 8-device program sometimes never
  returns (XLA CPU runtime, jax 0.10.2; it passed in some standalone runs and hung in
  others, with and without --xla_cpu_multi_thread_eigen=false), so it is `slow` until the
  hang is understood."""
  assert jax.device_count() == 8
  mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  cfg = config_lib.get_preset("hybrid3_tiny", layer_pattern="GSMA")  # GDN, SWA, Mamba2, full
  model = hybrid_lm.build_model(cfg, seed=1)
  prompt = list(np.random.default_rng(0).integers(0, cfg.vocab_size, 100))
  kw = dict(num_blocks=8, block_size=64, pad_tokens=128, pad_seqs=2, max_blocks=2)

  want = _run(ToyDriver(model, **kw), prompt, 64)

  drv = ToyDriver(model, **kw)
  pure = nnx.to_pure_dict(drv.params)
  sharded = jax.tree_util.tree_map_with_path(
    lambda p, x: jax.device_put(x, NamedSharding(mesh, _param_spec(p, x))), pure
  )
  nnx.replace_by_pure_dict(drv.params, sharded)
  specs = _cache_specs(drv.cache)

  def reshard(cache):
    return jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), cache, specs)

  drv.cache = reshard(drv.cache)
  assert len(drv.cache.k.sharding.device_set) == 8
  assert drv.cache.k.addressable_shards[0].data.shape[3] == cfg.num_kv_heads // 2
  got = _run(drv, prompt, 64, reshard)
  err = max_rel_diff(got, want)
  assert err <= 1e-5, err
  np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
