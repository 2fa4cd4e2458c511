"""Gated DeltaNet mixer (Qwen3.5 layout: separate qkv / z / b / a projections).

Per token (kernels.md §1.1): [q|k|v] = in_proj_qkv(x) -> causal depthwise conv (K taps, no
bias, state carried across steps) -> SiLU -> split into heads; beta = sigmoid(b),
g = -exp(A_log) * softplus(a + dt_bias) (log decay, fp32); gated delta rule with the initial
state read from the pool (q, k L2-normalised inside the kernel, q scaled by d_k^-1/2);
gated RMSNorm per value head with silu(z); out_proj.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kernels.pallas.gdn import api as gdn_api
from models import decode_split
from models import layers
from models import short_conv
from models import state_pool
from models.config import ModelConfig


class GatedDeltaNet(nnx.Module):
  """GDN mixer; recurrent state [H_v, d_k, d_v] fp32 and conv state per pool block."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    dt = cfg.dtype
    d = cfg.d_model
    self.hk, self.hv = cfg.gdn_num_k_heads, cfg.gdn_num_v_heads
    self.dk, self.dv = cfg.gdn_head_k_dim, cfg.gdn_head_v_dim
    self.conv_dim = cfg.gdn_conv_dim
    self.in_proj_qkv = layers.linear(d, self.conv_dim, dt, rngs)
    self.in_proj_z = layers.linear(d, self.hv * self.dv, dt, rngs)
    self.in_proj_b = layers.linear(d, self.hv, dt, rngs)
    self.in_proj_a = layers.linear(d, self.hv, dt, rngs)
    self.conv_weight = nnx.Param(
      jax.random.normal(rngs.params(), (self.conv_dim, cfg.conv_kernel), dt) * cfg.conv_kernel**-0.5
    )
    # Decay rates spread over [1, 16) as in the public inits; dt_bias around softplus^-1(0.01..0.1).
    self.A_log = nnx.Param(
      jnp.log(jax.random.uniform(rngs.params(), (self.hv,), jnp.float32, 1.0, 16.0))
    )
    dt0 = jnp.exp(
      jax.random.uniform(rngs.params(), (self.hv,), jnp.float32, jnp.log(0.01), jnp.log(0.1))
    )
    self.dt_bias = nnx.Param(dt0 + jnp.log(-jnp.expm1(-dt0)))
    self.norm = layers.GatedRMSNorm(self.dv, self.hv, cfg.norm_eps, dt)
    self.out_proj = layers.linear(self.hv * self.dv, d, dt, rngs)

  def __call__(
    self,
    x: jax.Array,
    state_pool_: jax.Array,
    conv_pool: jax.Array,
    *,
    query_start_loc: jax.Array,
    state_read: jax.Array,
    state_write: jax.Array,
    ckpt_write: jax.Array,
    ckpt_every: int | None,
    decode: bool = False,
    num_decodes: int = 0,
    layer: int | None = None,
    implementation: str | None = None,
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x [T, d_model]; pools [NB, H_v, d_k, d_v] / [NB, conv_dim, K-1]. Returns (y, pools).

    `decode` (static): every sequence has exactly one token (T == N); the conv and the
    delta rule then run the decode kernels on the gathered states instead of the chunked
    prefill kernels (same recurrence; no checkpoints can fall inside one token).
    `num_decodes` (static, D): a mixed step whose first D sequences have one token each; those
    run the decode kernels, the rest the chunked ones (`decode_split`).
    `layer`: the pools are the model's stacked [L, NB, ...] arrays and this layer's rows are
    read and written in place (`state_pool`); the returned pools are the stacked ones.
    """
    t = x.shape[0]
    mixed = self.in_proj_qkv(x)
    ckpt_kw = state_pool.checkpoint_kwargs(ckpt_write, ckpt_every)
    conv0 = state_pool.read_states(conv_pool, state_read, layer)
    y, conv_out = short_conv.causal_conv(
      mixed,
      self.conv_weight[...],
      None,
      conv0,
      decode=decode,
      num_decodes=num_decodes,
      query_start_loc=query_start_loc,
      ckpt_kw=ckpt_kw,
      implementation=implementation,
    )
    nq = self.hk * self.dk
    q = y[:, :nq].reshape(t, self.hk, self.dk)
    k = y[:, nq : 2 * nq].reshape(t, self.hk, self.dk)
    v = y[:, 2 * nq :].reshape(t, self.hv, self.dv)
    beta = jax.nn.sigmoid(self.in_proj_b(x).astype(jnp.float32))
    a = self.in_proj_a(x).astype(jnp.float32)
    g = -jnp.exp(self.A_log[...]) * jax.nn.softplus(a + self.dt_bias[...])
    s0 = state_pool.read_states(state_pool_, state_read, layer)

    def recurrent(q, k, v, g, beta, s0):
      ids = state_pool.slot_ids(q.shape[0])
      return gdn_api.fused_recurrent_gated_delta_rule_decode(
        q,
        k,
        v,
        g,
        beta,
        state_pool=s0,
        read_indices=ids,
        write_indices=ids,
        scale=self.dk**-0.5,
        implementation=implementation,
      )

    def chunked(q, k, v, g, beta, s0, cu_seqlens):
      return gdn_api.chunk_gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        initial_state=s0,
        cu_seqlens=cu_seqlens,
        **ckpt_kw,
        scale=self.dk**-0.5,
        implementation=implementation,
      )

    o, state_out = decode_split.run_recurrence(
      decode, num_decodes, query_start_loc, [q, k, v, g, beta], [s0], recurrent, chunked
    )
    state_pool_, conv_pool = state_pool.write_recurrent(
      state_pool_,
      conv_pool,
      state_write,
      ckpt_write[num_decodes:],
      state_out,
      conv_out,
      checkpointed=not decode and ckpt_kw["checkpoint_every"] is not None,
      layer=layer,
    )
    z = self.in_proj_z(x)
    o = self.norm(o.reshape(t, self.hv * self.dv).astype(x.dtype), z)
    return self.out_proj(o), state_pool_, conv_pool

  def verify(
    self,
    x: jax.Array,
    state_pool_: jax.Array,
    conv_pool: jax.Array,
    *,
    state_read: jax.Array,
    window: int,
    implementation: str | None = None,
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Speculative verify: x [N*S, d_model] = N windows of S = `window` tokens each.

    Reads each window's initial state from the pools (`state_read`, int32[N]) and writes
    nothing: returns (y [N*S, d_model], states [N, S, H_v, d_k, d_v] fp32, conv windows
    [N, S, conv_dim, K-1]) where index i is the state after window token i (the caller
    commits the accepted one). Same recurrence as `__call__` (kernels.md §1.1) through the
    multi-token verify kernel.
    """
    t = x.shape[0]
    n = t // window
    mixed = self.in_proj_qkv(x)
    conv0 = state_pool.read_states(conv_pool, state_read)
    y, windows = short_conv.verify_conv(
      mixed,
      self.conv_weight[...],
      None,
      conv0,
      window=window,
      implementation=implementation,
    )
    nq = self.hk * self.dk
    q = y[:, :nq].reshape(n, window, self.hk, self.dk)
    k = y[:, nq : 2 * nq].reshape(n, window, self.hk, self.dk)
    v = y[:, 2 * nq :].reshape(n, window, self.hv, self.dv)
    beta = jax.nn.sigmoid(self.in_proj_b(x).astype(jnp.float32)).reshape(n, window, self.hv)
    a = self.in_proj_a(x).astype(jnp.float32)
    g = (-jnp.exp(self.A_log[...]) * jax.nn.softplus(a + self.dt_bias[...])).reshape(
      n, window, self.hv
    )
    s0 = state_pool.read_states(state_pool_, state_read)
    o, states = gdn_api.gated_delta_rule_verify(
      q,
      k,
      v,
      g,
      beta,
      state_pool=s0,
      read_indices=state_pool.slot_ids(n),
      scale=self.dk**-0.5,
      implementation=implementation,
    )
    z = self.in_proj_z(x)
    o = self.norm(o.reshape(t, self.hv * self.dv).astype(x.dtype), z)
    return self.out_proj(o), states, windows
