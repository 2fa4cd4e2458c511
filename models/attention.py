"""Causal self-attention over paged KV (full or sliding window), GQA + RoPE.

Optional, from the model config: per-head q/k RMSNorm before RoPE (Qwen3-Next / Qwen3.5,
Gemma 3), partial or no RoPE, linear RoPE scaling of the full layers, a custom softmax scale
(Gemma 3's query_pre_attn_scalar), and Qwen3-Next's output gate: the query projection emits,
per head, [query | gate] (2 * head_dim wide) and the attention output is multiplied by
sigmoid(gate) before the output projection.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kernels.pallas.attention import api as attn_api
from models import layers
from models.config import ModelConfig


class Attention(nnx.Module):
  """q/k/v projections, RoPE, paged attention, output projection.

  The new tokens' K/V are first written into the pages at `slot_mapping`, then every query
  attends over its sequence's pages (block table) up to its own position; with `window` W,
  only keys at positions (p - W, p] are seen, so out-of-window table entries may be the null
  block.
  """

  def __init__(self, cfg: ModelConfig, *, sliding: bool, rngs: nnx.Rngs):
    dt = cfg.dtype
    d = cfg.d_model
    self.num_heads = cfg.num_heads
    self.num_kv_heads = cfg.num_kv_heads
    self.head_dim = cfg.head_dim
    self.window = cfg.window if sliding else None
    self.theta = cfg.rope_local_theta if sliding else cfg.rope_theta
    self.rope_factor = 1.0 if sliding else cfg.rope_factor
    self.rotary_dim = cfg.rope_dim
    self.scale = cfg.softmax_scale
    self.output_gate = cfg.attn_output_gate
    q_width = cfg.num_heads * cfg.head_dim * (2 if cfg.attn_output_gate else 1)
    self.q_proj = layers.linear(d, q_width, dt, rngs)
    self.k_proj = layers.linear(d, cfg.num_kv_heads * cfg.head_dim, dt, rngs)
    self.v_proj = layers.linear(d, cfg.num_kv_heads * cfg.head_dim, dt, rngs)
    self.o_proj = layers.linear(cfg.num_heads * cfg.head_dim, d, dt, rngs)
    if cfg.qk_norm:
      self.q_norm = layers.RMSNorm(cfg.head_dim, cfg.norm_eps, dt, cfg.norm_offset)
      self.k_norm = layers.RMSNorm(cfg.head_dim, cfg.norm_eps, dt, cfg.norm_offset)
    else:
      self.q_norm = self.k_norm = None

  def __call__(
    self,
    x: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    *,
    positions: jax.Array,
    block_table: jax.Array,
    slot_mapping: jax.Array,
    seq_lens: jax.Array,
    query_start_loc: jax.Array,
    layer: int | None = None,
    implementation: str | None = None,
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x: [T, d_model]; pages [num_blocks, B, H_kv, D]. Returns (y [T, d_model], k, v pages).

    `layer`: the pages are the model's stacked [L, num_blocks, B, H_kv, D] and this layer's
    are written in place and read (`models.state_pool` on why); the stacked pages return."""
    t = x.shape[0]
    q = self.q_proj(x)
    gate = None
    if self.output_gate:
      qg = q.reshape(t, self.num_heads, 2 * self.head_dim)
      q, gate = qg[..., : self.head_dim], qg[..., self.head_dim :]
    q = q.reshape(t, self.num_heads, self.head_dim)
    k = self.k_proj(x).reshape(t, self.num_kv_heads, self.head_dim)
    v = self.v_proj(x).reshape(t, self.num_kv_heads, self.head_dim)
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    rope = dict(rotary_dim=self.rotary_dim, factor=self.rope_factor)
    q = layers.apply_rope(q, positions, self.theta, **rope)
    k = layers.apply_rope(k, positions, self.theta, **rope)
    k_pages, v_pages = attn_api.write_kv(
      k_pages, v_pages, k.astype(k_pages.dtype), v.astype(v_pages.dtype), slot_mapping, layer
    )
    o = attn_api.paged_attention(
      q,
      k_pages,
      v_pages,
      block_table,
      seq_lens,
      query_start_loc=query_start_loc,
      window=self.window,
      scale=self.scale,
      implementation=implementation,
      layer=layer,
    )
    o = o.reshape(t, self.num_heads * self.head_dim).astype(x.dtype)
    if gate is not None:
      o = o * jax.nn.sigmoid(gate.reshape(t, -1).astype(jnp.float32)).astype(x.dtype)
    y = self.o_proj(o)
    return y, k_pages, v_pages
