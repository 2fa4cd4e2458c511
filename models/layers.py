"""Shared building blocks: RMSNorm, gated RMSNorm, the MLP, RoPE, initialisers.

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


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, offset: bool = False) -> jax.Array:
  """x / sqrt(mean(x^2) + eps) * scale over the last axis, in fp32, cast to x.dtype.

  scale = weight, or 1 + weight with `offset` (Qwen3-Next / Qwen3.5 / Gemma 3's RMSNorm).
  """
  xf = x.astype(jnp.float32)
  y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  scale = weight.astype(jnp.float32)
  if offset:
    scale = 1.0 + scale
  return (y * scale).astype(x.dtype)


class RMSNorm(nnx.Module):
  """RMSNorm with a learned scale over the last axis: w (initialised to 1), or 1 + w
  (initialised to 0) with `offset`; both start as the identity scale."""

  def __init__(self, dim: int, eps: float, dtype, offset: bool = False):
    self.weight = nnx.Param((jnp.zeros if offset else jnp.ones)((dim,), dtype))
    self.eps = eps
    self.offset = offset

  def __call__(self, x: jax.Array) -> jax.Array:
    return rms_norm(x, self.weight[...], self.eps, self.offset)


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


ACTIVATIONS = {  # name -> elementwise function (`ModelConfig.mlp_activation`)
  "silu": jax.nn.silu,
  "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),  # HF's gelu_pytorch_tanh
  "relu2": lambda x: jnp.square(jax.nn.relu(x)),  # Nemotron-H's squared ReLU
}


class MLP(nnx.Module):
  """Gated: down(act(gate(x)) * up(x)) (SwiGLU with silu, GeGLU with gelu_tanh); ungated:
  down(act(up(x))) (Nemotron-H's relu2 MLP, which has no gate projection)."""

  def __init__(
    self,
    d_model: int,
    hidden: int,
    dtype,
    rngs: nnx.Rngs,
    *,
    activation: str = "silu",
    gated: bool = True,
  ):
    self.gate = linear(d_model, hidden, dtype, rngs) if gated else None
    self.up = linear(d_model, hidden, dtype, rngs)
    self.down = linear(hidden, d_model, dtype, rngs)
    self.activation = activation

  def __call__(self, x: jax.Array) -> jax.Array:
    act = ACTIVATIONS[self.activation]
    if self.gate is None:
      return self.down(act(self.up(x)))
    return self.down(act(self.gate(x)) * self.up(x))


def apply_rope(
  x: jax.Array,
  positions: jax.Array,
  theta: float,
  *,
  rotary_dim: int | None = None,
  factor: float = 1.0,
) -> jax.Array:
  """Rotary embedding (rotate-half convention) on the first `rotary_dim` channels.

  Args:
    x: [T, H, D].
    positions: int32[T] absolute token positions.
    theta: RoPE base.
    rotary_dim: even number of leading channels rotated (None = D, 0 = none); the others
      pass through (Qwen3-Next's partial rotary).
    factor: linear scaling: angles are (position / factor) * inv_freq.
  Returns:
    [T, H, D] in x.dtype (computed in fp32).
  """
  d = x.shape[-1] if rotary_dim is None else rotary_dim
  if d == 0:
    return x
  if d < x.shape[-1]:
    rotated = apply_rope(x[..., :d], positions, theta, factor=factor)
    return jnp.concatenate([rotated, x[..., d:]], axis=-1)
  half = d // 2
  inv_freq = theta ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / d) / factor
  ang = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]  # [T, half]
  cos = jnp.cos(ang)[:, None, :]
  sin = jnp.sin(ang)[:, None, :]
  xf = x.astype(jnp.float32)
  x1, x2 = xf[..., :half], xf[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)
