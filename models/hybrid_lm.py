"""`HybridLM`: embeddings, a stack of hybrid decoder blocks, final norm and LM head.

Parameters only; the cache (`models.cache.ModelCache`) and the step's `StepInputs` are
arguments and the updated cache is a return value. Use `models.runner` to run it jitted.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers
from models.attention import Attention
from models.cache import ModelCache
from models.config import ModelConfig
from models.gated_deltanet import GatedDeltaNet
from models.mamba2 import Mamba2
from models.step_inputs import StepInputs


class Block(nnx.Module):
  """Pre-norm residual block: x + mixer(norm(x)); x + mlp(norm(x))."""

  def __init__(self, cfg: ModelConfig, kind: str, *, rngs: nnx.Rngs):
    dt = cfg.dtype
    self.kind = kind
    self.mixer_norm = layers.RMSNorm(cfg.d_model, cfg.norm_eps, dt)
    if kind in "AS":
      self.mixer = Attention(cfg, sliding=kind == "S", rngs=rngs)
    elif kind == "G":
      self.mixer = GatedDeltaNet(cfg, rngs=rngs)
    else:
      self.mixer = Mamba2(cfg, rngs=rngs)
    self.mlp_norm = layers.RMSNorm(cfg.d_model, cfg.norm_eps, dt)
    self.mlp = layers.MLP(cfg.d_model, cfg.mlp_hidden, dt, rngs)


class HybridLM(nnx.Module):
  """Hybrid decoder LM with explicit paged caches.

  `model(cache, inputs) -> (logits f32[T, vocab], new_cache)`.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    dt = cfg.dtype
    self.embed = nnx.Embed(
      cfg.vocab_size,
      cfg.d_model,
      dtype=dt,
      param_dtype=dt,
      embedding_init=nnx.initializers.normal(stddev=1.0),
      rngs=rngs,
    )
    self.blocks = nnx.List([Block(cfg, k, rngs=rngs) for k in cfg.layer_kinds])
    self.final_norm = layers.RMSNorm(cfg.d_model, cfg.norm_eps, dt)
    self.lm_head = layers.linear(cfg.d_model, cfg.vocab_size, dt, rngs)

  def __call__(
    self, cache: ModelCache, inputs: StepInputs, *, implementation: str | None = None
  ) -> tuple[jax.Array, ModelCache]:
    cfg = self.cfg
    if inputs.decode and inputs.num_tokens != inputs.num_seqs:
      raise ValueError(
        f"inputs.decode needs one token per sequence, got {inputs.num_tokens} tokens for "
        f"{inputs.num_seqs} sequences"
      )
    k_all, v_all = cache.k, cache.v
    pools = {
      "G": [cache.gdn_state, cache.gdn_conv],
      "M": [cache.mamba_state, cache.mamba_conv],
    }
    rec = {k: cfg.recurrent_index(k) for k in "GM" if k in cfg.layer_kinds}
    x = self.embed(inputs.token_ids)
    for block, kind, group, slot in zip(
      self.blocks, cfg.layer_kinds, cfg.layer_group, cfg.layer_slot, strict=True
    ):
      h = block.mixer_norm(x)
      if kind in "AS":
        y, k_all, v_all = _attend(block, h, k_all, v_all, slot, group, inputs, implementation)
      else:
        sp, cp = pools[kind]
        y, s_new, c_new = block.mixer(
          h,
          sp[slot],
          cp[slot],
          query_start_loc=inputs.query_start_loc,
          state_read=inputs.state_read[rec[kind]],
          state_write=inputs.state_write[rec[kind]],
          ckpt_write=inputs.ckpt_write[rec[kind]],
          ckpt_every=inputs.ckpt_every,
          decode=inputs.decode,
          implementation=implementation,
        )
        pools[kind] = [sp.at[slot].set(s_new), cp.at[slot].set(c_new)]
      x = x + y
      x = x + block.mlp(block.mlp_norm(x))
    logits = self.lm_head(self.final_norm(x)).astype(jnp.float32)
    new_cache = ModelCache(
      k=k_all,
      v=v_all,
      gdn_state=pools["G"][0],
      gdn_conv=pools["G"][1],
      mamba_state=pools["M"][0],
      mamba_conv=pools["M"][1],
    )
    return logits, new_cache

  def verify(
    self,
    cache: ModelCache,
    inputs: StepInputs,
    *,
    window: int,
    implementation: str | None = None,
  ) -> tuple[jax.Array, ModelCache, dict[str, tuple[jax.Array, jax.Array]]]:
    """Speculative verify forward over N windows of S = `window` tokens (T = N*S).

    `inputs` packs the windows uniformly (query_start_loc = 0, S, 2S, ...). Attention layers
    write their K/V at `slot_mapping` as in `__call__`; recurrent layers read their initial
    state at `state_read` and write nothing. Returns (logits f32[T, vocab], cache with K/V
    written, per-token states): states[kind] = (state [L_kind, N, S, ...] fp32, conv windows
    [L_kind, N, S, C, K-1]) for kind "G" / "M" present in the model, index i = after window
    token i, for the caller to commit the accepted position.
    """
    cfg = self.cfg
    k_all, v_all = cache.k, cache.v
    pools = {
      "G": (cache.gdn_state, cache.gdn_conv),
      "M": (cache.mamba_state, cache.mamba_conv),
    }
    per_token: dict[str, list[tuple[jax.Array, jax.Array]]] = {"G": [], "M": []}
    rec = {k: cfg.recurrent_index(k) for k in "GM" if k in cfg.layer_kinds}
    x = self.embed(inputs.token_ids)
    for block, kind, group, slot in zip(
      self.blocks, cfg.layer_kinds, cfg.layer_group, cfg.layer_slot, strict=True
    ):
      h = block.mixer_norm(x)
      if kind in "AS":
        y, k_all, v_all = _attend(block, h, k_all, v_all, slot, group, inputs, implementation)
      else:
        sp, cp = pools[kind]
        y, states, windows = block.mixer.verify(
          h,
          sp[slot],
          cp[slot],
          state_read=inputs.state_read[rec[kind]],
          window=window,
          implementation=implementation,
        )
        per_token[kind].append((states, windows))
      x = x + y
      x = x + block.mlp(block.mlp_norm(x))
    logits = self.lm_head(self.final_norm(x)).astype(jnp.float32)
    out = {
      kind: (jnp.stack([s for s, _ in lst]), jnp.stack([w for _, w in lst]))
      for kind, lst in per_token.items()
      if lst
    }
    return logits, cache.replace(k=k_all, v=v_all), out


def _attend(block, h, k_all, v_all, slot: int, group: int, inputs: StepInputs, implementation):
  """One attention layer (full or sliding window) of `__call__` and `verify`: reads and writes
  its paged K/V (layer `slot` of the stacked pools, block tables of `group`).
  Returns (y, k_all, v_all)."""
  y, kp, vp = block.mixer(
    h,
    k_all[slot],
    v_all[slot],
    positions=inputs.positions,
    block_table=inputs.block_tables[group],
    slot_mapping=inputs.slot_mapping[group],
    seq_lens=inputs.seq_lens,
    query_start_loc=inputs.query_start_loc,
    implementation=implementation,
  )
  return y, k_all.at[slot].set(kp), v_all.at[slot].set(vp)


def build_model(cfg: ModelConfig, seed: int = 0) -> HybridLM:
  """A `HybridLM` with random weights drawn from `seed` (deterministic)."""
  return HybridLM(cfg, rngs=nnx.Rngs(params=seed))
