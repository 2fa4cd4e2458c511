"""The model's explicit cache pytree: paged KV and block-indexed recurrent state pools.

All cache groups draw block ids from one pool of `num_blocks` blocks (block 0 is the null
block the cache core never hands out for data), so every per-layer array is indexed by the
same block id space:

* attention layers (A/F/S), stacked in layer order:
    k, v:        dtype[L_attn, num_blocks, block_size, H_kv, head_dim]
  token at position p of a request lives in block `block_table[p // block_size]`, row
  `p % block_size`.
* GDN layers (G):
    gdn_state:   f32[L_gdn, num_blocks, H_v, d_k, d_v]      (K-major: o = S^T q)
    gdn_conv:    dtype[L_gdn, num_blocks, gdn_conv_dim, K-1]
* Mamba2 layers (M):
    mamba_state: f32[L_mamba, num_blocks, H, P, N]
    mamba_conv:  dtype[L_mamba, num_blocks, mamba_conv_dim, K-1]

A recurrent pool entry `pool[b]` holds the state after some prefix [0, p) whose last
token p - 1 lies in block b of the request's recurrent block table (vLLM's "state block").
The conv state holds the last K-1 pre-conv inputs x_{p-K+1..p-1} (zero rows if p < K-1),
oldest first along the last axis. Families without layers have a leading axis of size 0.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from models.config import ModelConfig


@flax.struct.dataclass
class ModelCache:
  """Paged KV pages and recurrent state pools of one model (see module docstring)."""

  k: jax.Array
  v: jax.Array
  gdn_state: jax.Array
  gdn_conv: jax.Array
  mamba_state: jax.Array
  mamba_conv: jax.Array

  @property
  def num_blocks(self) -> int:
    return self.k.shape[1]

  @property
  def block_size(self) -> int:
    return self.k.shape[2]


def cache_shapes(cfg: ModelConfig, num_blocks: int, block_size: int) -> ModelCache:
  """The cache as a tree of `jax.ShapeDtypeStruct` (no allocation)."""
  if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 2:
    raise ValueError(f"num_blocks must be an integer >= 2 (block 0 is null), got {num_blocks!r}")
  if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
    raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
  dt = jnp.dtype(cfg.dtype)
  f32 = jnp.float32
  n_attn, n_gdn, n_m = cfg.count("AS"), cfg.count("G"), cfg.count("M")
  kc = cfg.conv_kernel - 1
  s = jax.ShapeDtypeStruct
  kv = (n_attn, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
  return ModelCache(
    k=s(kv, dt),
    v=s(kv, dt),
    gdn_state=s(
      (n_gdn, num_blocks, cfg.gdn_num_v_heads, cfg.gdn_head_k_dim, cfg.gdn_head_v_dim), f32
    ),
    gdn_conv=s((n_gdn, num_blocks, cfg.gdn_conv_dim, kc), dt),
    mamba_state=s(
      (n_m, num_blocks, cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.mamba_state_dim), f32
    ),
    mamba_conv=s((n_m, num_blocks, cfg.mamba_conv_dim, kc), dt),
  )


def init_cache(cfg: ModelConfig, num_blocks: int, block_size: int) -> ModelCache:
  """A zero-filled cache with `num_blocks` blocks of `block_size` tokens (block 0 = null)."""
  return jax.tree.map(
    lambda s: jnp.zeros(s.shape, s.dtype), cache_shapes(cfg, num_blocks, block_size)
  )


def cache_bytes(cfg: ModelConfig, num_blocks: int, block_size: int) -> int:
  """Total bytes of `init_cache(cfg, num_blocks, block_size)`."""
  leaves = jax.tree.leaves(cache_shapes(cfg, num_blocks, block_size))
  return sum(int(s.size) * s.dtype.itemsize for s in leaves)
