"""The sparse MoE block (`models.moe`): its routing rules by hand, its sparse dispatch against
every expert on every token, capacity-free under any imbalance, and its tile bound."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import config as config_lib
from models import moe as moe_lib
from models.config import ModelConfig

QWEN = config_lib.qwen35_tiny(
  moe_num_experts=8,
  moe_top_k=3,
  moe_hidden=32,
  moe_shared_hidden=48,
  moe_shared_gate=True,
  moe_layers=(0,),
)
NEMOTRON = ModelConfig(
  layer_pattern="M-",
  num_layers=2,
  block_style="single",
  mlp_activation="relu2",
  mlp_gated=False,
  moe_num_experts=8,
  moe_top_k=3,
  moe_hidden=32,
  moe_shared_hidden=16,
  moe_router="sigmoid",
  moe_n_group=2,
  moe_topk_group=1,
  moe_scaling=2.5,
  moe_layers=(1,),
)


def test_softmax_route_by_hand():
  cfg = config_lib.qwen35_tiny(moe_num_experts=4, moe_top_k=2, moe_hidden=8, moe_layers=(0,))
  logits = jnp.array([[0.0, 1.0, 2.0, 3.0], [3.0, 0.0, 0.0, 1.0]])
  w, e = moe_lib.route(logits, cfg)
  assert e.tolist() == [[3, 2], [0, 3]]
  # renormalised over the two chosen: e^3 / (e^3 + e^2) = 1 / (1 + e^-1)
  np.testing.assert_allclose(w[0], [1 / (1 + math.exp(-1)), 1 / (1 + math.exp(1))], rtol=1e-6)
  raw, _ = moe_lib.route(logits, cfg.replace(moe_norm_topk=False))
  p = np.exp([0.0, 1.0, 2.0, 3.0]) / np.exp([0.0, 1.0, 2.0, 3.0]).sum()
  np.testing.assert_allclose(raw[0], p[[3, 2]], rtol=1e-6)


def test_sigmoid_route_groups_and_bias_choose_but_do_not_weigh():
  cfg = NEMOTRON.replace(moe_num_experts=4, moe_top_k=2, moe_n_group=2, moe_scaling=2.0)
  logits = jnp.array([[2.0, -2.0, 0.0, 0.5]])
  s = 1 / (1 + np.exp(-np.array([2.0, -2.0, 0.0, 0.5])))
  # Group {0, 1} scores s0 + s1 = 1.0, group {2, 3} 0.5 + 0.62 = 1.12: the best expert (0) is
  # in the losing group, so the top 2 come from {2, 3}.
  w, e = moe_lib.route(logits, cfg)
  assert e.tolist() == [[3, 2]]
  np.testing.assert_allclose(w[0], 2.0 * s[[3, 2]] / s[[3, 2]].sum(), rtol=1e-6)
  # A bias of +1 on expert 1 lifts group {0, 1} (2.0) and ranks expert 1 first; the weights
  # stay the unbiased sigmoids.
  w, e = moe_lib.route(logits, cfg, jnp.array([0.0, 1.0, 0.0, 0.0]))
  assert e.tolist() == [[1, 0]]
  np.testing.assert_allclose(w[0], 2.0 * s[[1, 0]] / s[[1, 0]].sum(), rtol=1e-6)


def _block(cfg: ModelConfig, seed: int = 0) -> moe_lib.MoE:
  block = moe_lib.MoE(cfg, rngs=nnx.Rngs(seed))
  if block.score_bias is not None:
    block.score_bias[...] = 0.3 * jax.random.normal(jax.random.key(seed + 1), (8,))
  return block


def _every_expert_on_every_token(block: moe_lib.MoE, x: jax.Array) -> jax.Array:
  """The dense oracle: all E experts on all T tokens, then the routed ones picked."""
  cfg = block.cfg
  h = x.astype(jnp.float32) if cfg.moe_router == "sigmoid" else x
  bias = None if block.score_bias is None else block.score_bias[...]
  w, e = moe_lib.route(block.router(h), cfg, bias)
  act = {"silu": jax.nn.silu, "relu2": lambda v: jnp.square(jax.nn.relu(v))}[cfg.mlp_activation]
  up = jnp.einsum("td,edi->tei", x, block.w_up[...])
  if block.w_gate is not None:
    up = act(jnp.einsum("td,edi->tei", x, block.w_gate[...])) * up
  else:
    up = act(up)
  every = jnp.einsum("tei,eid->ted", up, block.w_down[...])  # [T, E, d]
  y = jnp.sum(jnp.take_along_axis(every, e[:, :, None], axis=1) * w[:, :, None], axis=1)
  shared = block.shared(x)
  if block.shared_gate is not None:
    shared = jax.nn.sigmoid(block.shared_gate(x)) * shared
  return y + shared


@pytest.mark.parametrize("cfg", [QWEN, NEMOTRON], ids=["softmax_swiglu", "sigmoid_relu2"])
def test_sparse_dispatch_equals_every_expert_on_every_token(cfg):
  block = _block(cfg)
  x = jax.random.normal(jax.random.key(2), (37, cfg.d_model))
  want = _every_expert_on_every_token(block, x)
  tiles = jax.jit(lambda x: block(x))(x)
  ragged = block(x, method="ragged_dot")
  np.testing.assert_allclose(tiles, want, rtol=1e-5, atol=1e-5 * float(jnp.abs(want).max()))
  np.testing.assert_allclose(ragged, tiles, rtol=1e-5, atol=1e-6 * float(jnp.abs(want).max()))
  # A token's output is its own: the first 7 tokens alone give the same rows.
  np.testing.assert_allclose(block(x[:7]), tiles[:7], rtol=1e-5, atol=1e-6)
  _, experts = moe_lib.route(block.router(x.astype(block.router.kernel.dtype)), cfg)
  assert len(np.unique(np.asarray(experts))) >= 4  # routing spread over several experts


def test_capacity_free_when_every_token_picks_the_same_experts():
  block = _block(QWEN)
  block.router.kernel[...] = jnp.zeros_like(block.router.kernel[...])  # ties: experts 0, 1, 2
  x = jax.random.normal(jax.random.key(3), (50, QWEN.d_model))
  _, experts = moe_lib.route(block.router(x), QWEN)
  assert np.unique(np.asarray(experts)).tolist() == [0, 1, 2]
  want = _every_expert_on_every_token(block, x)
  np.testing.assert_allclose(block(x), want, rtol=1e-5, atol=1e-5 * float(jnp.abs(want).max()))


def test_tile_rows_and_bound():
  assert moe_lib.tile_rows(432, 4) == 64  # 108 rows per expert on average
  assert moe_lib.tile_rows(64, 256) == 1  # a decode step: fewer assignments than experts
  assert moe_lib.tile_rows(10**6, 8) == moe_lib.MAX_TILE_ROWS
  rng = np.random.default_rng(0)
  for a, e in [(432, 4), (64, 256), (3000, 64), (5, 8)]:
    rows = moe_lib.tile_rows(a, e)
    bound = moe_lib.num_tiles(a, e, rows)
    assert bound * rows <= a + min(e, a) * (rows - 1)  # < one padded tile per expert used
    for skew in (0.1, 1.0, 10.0):  # from all-on-one-expert to balanced
      counts = np.bincount(rng.choice(e, a, p=rng.dirichlet([skew] * e)), minlength=e)
      assert np.sum(-(-counts // rows)) <= bound


def test_method_is_checked():
  with pytest.raises(ValueError, match="method must be one of"):
    _block(QWEN)(jnp.zeros((2, QWEN.d_model)), method="dense")
