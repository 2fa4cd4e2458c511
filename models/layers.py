"""Shared building blocks: RMSNorm, gated RMSNorm, SwiGLU MLP, RoPE, initialisers.

Norms and gates compute in fp32 and cast back to the activation dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def dense_init(fan_in: int) -> nnx.Initializer:
  """Normal(0, 1/sqrt(fan_in)) weights: keeps activations O(1) through random layers."""
  return nnx.initializers.normal(stddev=fan_in**-0.5)


def linear(din: int, dout: int, dtype, rngs: nnx.Rngs) -> nnx.Linear:
  return nnx.Linear(
    din,
    dout,
    use_bias=False,
    dtype=dtype,
    param_dtype=dtype,
    kernel_init=dense_init(din),
    rngs=rngs,
  )


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  """x / sqrt(mean(x^2) + eps) * weight over the last axis, in fp32, cast to x.dtype."""
  xf = x.astype(jnp.float32)
  y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  return (y * weight.astype(jnp.float32)).astype(x.dtype)


class RMSNorm(nnx.Module):
  """RMSNorm with a learned scale (initialised to 1) over the last axis."""

  def __init__(self, dim: int, eps: float, dtype):
    self.weight = nnx.Param(jnp.ones((dim,), dtype))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    return rms_norm(x, self.weight[...], self.eps)


class GatedRMSNorm(nnx.Module):
  """RMSNorm(x) * silu(z) per group of the last axis (Qwen3-Next / Mamba2, norm before gate).

  x, z: [..., groups * dim]; the norm statistics are per group of `dim` channels.
  """

  def __init__(self, dim: int, groups: int, eps: float, dtype):
    self.weight = nnx.Param(jnp.ones((groups * dim,), dtype))
    self.dim = dim
    self.groups = groups
    self.eps = eps

  def __call__(self, x: jax.Array, z: jax.Array) -> jax.Array:
    shape = x.shape
    xf = x.astype(jnp.float32).reshape(*shape[:-1], self.groups, self.dim)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
    xf = xf.reshape(shape) * self.weight[...].astype(jnp.float32)
    return (xf * jax.nn.silu(z.astype(jnp.float32))).astype(x.dtype)


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""

  def __init__(self, d_model: int, hidden: int, dtype, rngs: nnx.Rngs):
    self.gate = linear(d_model, hidden, dtype, rngs)
    self.up = linear(d_model, hidden, dtype, rngs)
    self.down = linear(hidden, d_model, dtype, rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.down(jax.nn.silu(self.gate(x)) * self.up(x))


def apply_rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """Rotary embedding (rotate-half convention).

  Args:
    x: [T, H, D] with D even.
    positions: int32[T] absolute token positions.
    theta: RoPE base.
  Returns:
    [T, H, D] in x.dtype (computed in fp32).
  """
  d = x.shape[-1]
  half = d // 2
  inv_freq = theta ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / d)
  ang = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]  # [T, half]
  cos = jnp.cos(ang)[:, None, :]
  sin = jnp.sin(ang)[:, None, :]
  xf = x.astype(jnp.float32)
  x1, x2 = xf[..., :half], xf[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)
