"""Mamba2 mixer (kernels.md §4.1).

in_proj -> [z (d_inner) | xBC (d_inner + 2 G N) | dt (H)]; causal depthwise conv over xBC
(K taps, with bias, state carried) -> SiLU -> x [H, P], B, C [G, N]; SSD scan with
dt = softplus(dt + dt_bias), A = -exp(A_log), D skip, initial state from the pool;
y * silu(z) normalised per group (norm_before_gate=False); out_proj. With
`ModelConfig.mamba_dt_min` > 0 the time step is max(softplus(dt + dt_bias), mamba_dt_min)
(Nemotron-H's `time_step_limit`), computed here in fp32 and handed to the kernels as is.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kernels.pallas.ssd import api as ssd_api
from models import decode_split
from models import layers
from models import short_conv
from models import state_pool
from models.config import ModelConfig


class _GroupNormAfterGate(nnx.Module):
  """RMSNorm(y * silu(z)) per group of channels (Mamba2's norm_before_gate=False)."""

  def __init__(self, dim: int, groups: int, eps: float, dtype):
    self.weight = nnx.Param(jnp.ones((groups * dim,), dtype))
    self.dim, self.groups, self.eps = dim, groups, eps

  def __call__(self, y: jax.Array, z: jax.Array) -> jax.Array:
    shape = y.shape
    h = y.astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))
    h = h.reshape(*shape[:-1], self.groups, self.dim)
    h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + self.eps)
    return (h.reshape(shape) * self.weight[...].astype(jnp.float32)).astype(y.dtype)


class Mamba2(nnx.Module):
  """Mamba2 mixer; state [H, P, N] fp32 and conv state per pool block."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    dt = cfg.dtype
    d = cfg.d_model
    self.h, self.p = cfg.mamba_num_heads, cfg.mamba_head_dim
    self.n, self.g = cfg.mamba_state_dim, cfg.mamba_n_groups
    self.d_inner = cfg.mamba_d_inner
    self.conv_dim = cfg.mamba_conv_dim
    self.in_proj = layers.linear(d, self.d_inner + self.conv_dim + self.h, dt, rngs)
    self.conv_weight = nnx.Param(
      jax.random.normal(rngs.params(), (self.conv_dim, cfg.conv_kernel), dt) * cfg.conv_kernel**-0.5
    )
    self.conv_bias = nnx.Param(jnp.zeros((self.conv_dim,), dt))
    self.A_log = nnx.Param(
      jnp.log(jax.random.uniform(rngs.params(), (self.h,), jnp.float32, 1.0, 16.0))
    )
    dt0 = jnp.exp(
      jax.random.uniform(rngs.params(), (self.h,), jnp.float32, jnp.log(0.001), jnp.log(0.1))
    )
    self.dt_bias = nnx.Param(dt0 + jnp.log(-jnp.expm1(-dt0)))
    self.D = nnx.Param(jnp.ones((self.h,), jnp.float32))
    self.norm = _GroupNormAfterGate(self.d_inner // self.g, self.g, cfg.norm_eps, dt)
    self.out_proj = layers.linear(self.d_inner, d, dt, rngs)
    self.dt_min = float(cfg.mamba_dt_min)

  def _time_step(self, dt: jax.Array) -> tuple[jax.Array, dict]:
    """(dt, the kernels' dt keyword arguments): the raw dt with dt_bias and softplus left to
    the kernels, or, with a lower bound, the bounded time step itself (fp32)."""
    if self.dt_min == 0.0:
      return dt, dict(dt_bias=self.dt_bias[...])
    step = jax.nn.softplus(dt.astype(jnp.float32) + self.dt_bias[...])
    return jnp.maximum(step, self.dt_min), dict(dt_bias=None, dt_softplus=False)

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
    """x [T, d_model]; pools [NB, H, P, N] / [NB, conv_dim, K-1]. Returns (y, pools).

    `decode` (static): every sequence has exactly one token (T == N); the conv and the SSD
    run the decode kernels on the gathered states instead of the chunked prefill kernels.
    `num_decodes` (static, D): a mixed step whose first D sequences have one token each; those
    run the decode kernels, the rest the chunked ones (`decode_split`).
    `layer`: the pools are the model's stacked [L, NB, ...] arrays and this layer's rows are
    read and written in place (`state_pool`); the returned pools are the stacked ones.
    """
    t = x.shape[0]
    proj = self.in_proj(x)
    z = proj[:, : self.d_inner]
    xbc = proj[:, self.d_inner : self.d_inner + self.conv_dim]
    dt = proj[:, self.d_inner + self.conv_dim :]
    ckpt_kw = state_pool.checkpoint_kwargs(ckpt_write, ckpt_every)
    conv0 = state_pool.read_states(conv_pool, state_read, layer)
    xbc, conv_out = short_conv.causal_conv(
      xbc,
      self.conv_weight[...],
      self.conv_bias[...],
      conv0,
      decode=decode,
      num_decodes=num_decodes,
      query_start_loc=query_start_loc,
      ckpt_kw=ckpt_kw,
      implementation=implementation,
    )
    gn = self.g * self.n
    xs = xbc[:, : self.d_inner].reshape(t, self.h, self.p)
    b = xbc[:, self.d_inner : self.d_inner + gn].reshape(t, self.g, self.n)
    c = xbc[:, self.d_inner + gn :].reshape(t, self.g, self.n)
    s0 = state_pool.read_states(state_pool_, state_read, layer)
    dt, dt_kw = self._time_step(dt)
    a = -jnp.exp(self.A_log[...])

    def recurrent(xs, dt, b, c, s0):
      ids = state_pool.slot_ids(xs.shape[0])
      return ssd_api.ssd_decode(
        xs,
        dt,
        a,
        b,
        c,
        D=self.D[...],
        **dt_kw,
        state_pool=s0,
        read_indices=ids,
        write_indices=ids,
        implementation=implementation,
      )

    def chunked(xs, dt, b, c, s0, cu_seqlens):
      return ssd_api.chunk_scan(
        xs,
        dt,
        a,
        b,
        c,
        D=self.D[...],
        **dt_kw,
        initial_state=s0,
        cu_seqlens=cu_seqlens,
        **ckpt_kw,
        implementation=implementation,
      )

    y, state_out = decode_split.run_recurrence(
      decode, num_decodes, query_start_loc, [xs, dt, b, c], [s0], recurrent, chunked
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
    y = self.norm(y.reshape(t, self.d_inner).astype(x.dtype), z)
    return self.out_proj(y), state_pool_, conv_pool

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
    nothing: returns (y [N*S, d_model], states [N, S, H, P, N_state] fp32, conv windows
    [N, S, conv_dim, K-1]), index i = after window token i (the caller commits the accepted
    one). Same recurrence as `__call__` (kernels.md §4.1) through `ssd_verify`.
    """
    t = x.shape[0]
    nseq = t // window
    proj = self.in_proj(x)
    z = proj[:, : self.d_inner]
    xbc = proj[:, self.d_inner : self.d_inner + self.conv_dim]
    dt = proj[:, self.d_inner + self.conv_dim :]
    conv0 = state_pool.read_states(conv_pool, state_read)
    xbc, windows = short_conv.verify_conv(
      xbc,
      self.conv_weight[...],
      self.conv_bias[...],
      conv0,
      window=window,
      implementation=implementation,
    )
    gn = self.g * self.n
    xs = xbc[:, : self.d_inner].reshape(nseq, window, self.h, self.p)
    b = xbc[:, self.d_inner : self.d_inner + gn].reshape(nseq, window, self.g, self.n)
    c = xbc[:, self.d_inner + gn :].reshape(nseq, window, self.g, self.n)
    s0 = state_pool.read_states(state_pool_, state_read)
    dt, dt_kw = self._time_step(dt)
    y, states = ssd_api.ssd_verify(
      xs,
      dt.reshape(nseq, window, self.h),
      -jnp.exp(self.A_log[...]),
      b,
      c,
      D=self.D[...],
      **dt_kw,
      state_pool=s0,
      read_indices=state_pool.slot_ids(nseq),
      implementation=implementation,
    )
    y = self.norm(y.reshape(t, self.d_inner).astype(x.dtype), z)
    return self.out_proj(y), states, windows
