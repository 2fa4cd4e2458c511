"""`HybridLM`: embeddings, a stack of hybrid decoder blocks, final norm and LM head.

Parameters only; the cache (`models.cache.ModelCache`) and the step's `StepInputs` are
arguments and the updated cache is a return value. Use `models.runner` to run it jitted.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers
from models.attention import Attention
from models.cache import ModelCache
from models.config import MLP_ONLY
from models.config import ModelConfig
from models.gated_deltanet import GatedDeltaNet
from models.mamba2 import Mamba2
from models.moe import MoE
from models.step_inputs import StepInputs


class Block(nnx.Module):
  """One decoder layer, wired by `cfg.block_style` (`models.config`):

  "pre_norm": x + mixer(mixer_norm(x)); then x + mlp(mlp_norm(x)).
  "sandwich": x + post_mixer_norm(mixer(mixer_norm(x))); then
              x + post_mlp_norm(mlp(mlp_norm(x))).
  "single":   x + mixer(mixer_norm(x)), or x + mlp(mixer_norm(x)) for an MLP-only layer ("-").
  `mlp` is the sparse MoE block (`models.moe.MoE`) when `ffn` is "moe" (`ModelConfig.layer_ffn`).
  Absent sublayers and norms are None.
  """

  def __init__(self, cfg: ModelConfig, kind: str, *, ffn: str | None, rngs: nnx.Rngs):
    dt = cfg.dtype
    self.kind = kind

    def norm():
      return layers.RMSNorm(cfg.d_model, cfg.norm_eps, dt, cfg.norm_offset)

    def mlp():
      if ffn == "moe":
        return MoE(cfg, rngs=rngs)
      return layers.MLP(
        cfg.d_model,
        cfg.mlp_hidden,
        dt,
        rngs,
        activation=cfg.mlp_activation,
        gated=cfg.mlp_gated,
      )

    self.mixer_norm = norm()
    if kind in "AS":
      self.mixer = Attention(cfg, sliding=kind == "S", rngs=rngs)
    elif kind == "G":
      self.mixer = GatedDeltaNet(cfg, rngs=rngs)
    elif kind == "M":
      self.mixer = Mamba2(cfg, rngs=rngs)
    else:
      self.mixer = None
    single = cfg.block_style == "single"
    sandwich = cfg.block_style == "sandwich"
    self.post_mixer_norm = norm() if sandwich else None
    self.mlp_norm = None if single else norm()
    self.mlp = None if ffn is None else mlp()
    self.post_mlp_norm = norm() if sandwich else None

  def feed_forward(self, x: jax.Array) -> jax.Array:
    """The residual MLP half of a pre_norm / sandwich block (identity for "single")."""
    if self.mlp_norm is None:
      return x
    y = self.mlp(self.mlp_norm(x))
    if self.post_mlp_norm is not None:
      y = self.post_mlp_norm(y)
    return x + y

  def mixer_residual(self, x: jax.Array, y: jax.Array) -> jax.Array:
    """x + the mixer's output y (normalised first in a sandwich block)."""
    if self.post_mixer_norm is not None:
      y = self.post_mixer_norm(y)
    return x + y


def _numerics(method):
  """Runs a forward method under the matmul precision of the model's numerics contract
  (`hybrid_cache.engine.config.NUMERICS`): an fp32 model is "exact", its XLA dots run in IEEE
  fp32 ("highest": no TF32 on GPUs; XLA:CPU is IEEE anyway) as the Pallas kernels' do for fp32
  inputs; a bf16 model is "serving", with the backend's default (fast) dots."""

  @functools.wraps(method)
  def wrapped(self, *args, **kwargs):
    if self.cfg.dtype != "float32":
      return method(self, *args, **kwargs)
    with jax.default_matmul_precision("highest"):
      return method(self, *args, **kwargs)

  return wrapped


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
    self.blocks = nnx.List(
      [Block(cfg, k, ffn=f, rngs=rngs) for k, f in zip(cfg.layer_kinds, cfg.layer_ffn, strict=True)]
    )
    self.final_norm = layers.RMSNorm(cfg.d_model, cfg.norm_eps, dt, cfg.norm_offset)
    tied = cfg.tie_word_embeddings  # the LM head is then `embed.attend`
    self.lm_head = None if tied else layers.linear(cfg.d_model, cfg.vocab_size, dt, rngs)

  def _embed(self, token_ids: jax.Array) -> jax.Array:
    x = self.embed(token_ids)
    if self.cfg.embed_scale:  # Gemma 3: sqrt(d_model) cast to the activation dtype first
      x = x * jnp.asarray(self.cfg.d_model**0.5, x.dtype)
    return x

  def _logits(self, x: jax.Array) -> jax.Array:
    """f32[T, vocab] from the last hidden states (final norm, LM head, soft-capping)."""
    h = self.final_norm(x)
    logits = self.embed.attend(h) if self.lm_head is None else self.lm_head(h)
    logits = logits.astype(jnp.float32)
    cap = self.cfg.final_logit_softcap
    if cap is not None:
      logits = cap * jnp.tanh(logits / cap)
    return logits

  @_numerics
  def __call__(
    self,
    cache: ModelCache,
    inputs: StepInputs,
    *,
    implementation: str | None = None,
    logits_rows: jax.Array | None = None,
  ) -> tuple[jax.Array, ModelCache]:
    """One step: (logits f32[T, vocab], new cache).

    `logits_rows` (int32[R]): compute the final norm and the LM head for these token rows only
    and return f32[R, vocab] (the engine samples one row per sequence: the head over every
    prefill token is ~30% of a step's FLOPs at a 32k vocabulary, `BENCHMARKS.md` §9).
    """
    cfg = self.cfg
    if inputs.decode and inputs.num_tokens != inputs.num_seqs:
      raise ValueError(
        f"inputs.decode needs one token per sequence, got {inputs.num_tokens} tokens for "
        f"{inputs.num_seqs} sequences"
      )
    d = inputs.num_decodes
    if d and (inputs.decode or not 0 < d < inputs.num_seqs):
      raise ValueError(
        f"inputs.num_decodes must be in [0, {inputs.num_seqs}) and 0 with decode, got {d}"
      )
    k_all, v_all = cache.k, cache.v
    pools = {
      "G": [cache.gdn_state, cache.gdn_conv],
      "M": [cache.mamba_state, cache.mamba_conv],
    }
    rec = {k: cfg.recurrent_index(k) for k in "GM" if k in cfg.layer_kinds}
    x = self._embed(inputs.token_ids)
    for block, kind, group, slot in zip(
      self.blocks, cfg.layer_kinds, cfg.layer_group, cfg.layer_slot, strict=True
    ):
      h = block.mixer_norm(x)
      if kind == MLP_ONLY:
        x = x + block.mlp(h)
        continue
      if kind in "AS":
        y, k_all, v_all = _attend(block, h, k_all, v_all, slot, group, inputs, implementation)
      else:
        sp, cp = pools[kind]
        y, sp, cp = block.mixer(
          h,
          sp,
          cp,
          query_start_loc=inputs.query_start_loc,
          state_read=inputs.state_read[rec[kind]],
          state_write=inputs.state_write[rec[kind]],
          ckpt_write=inputs.ckpt_write[rec[kind]],
          ckpt_every=inputs.ckpt_every,
          decode=inputs.decode,
          num_decodes=d,
          layer=slot,
          implementation=implementation,
        )
        pools[kind] = [sp, cp]
      x = block.feed_forward(block.mixer_residual(x, y))
    if logits_rows is not None:
      x = x[logits_rows]
    logits = self._logits(x)
    new_cache = ModelCache(
      k=k_all,
      v=v_all,
      gdn_state=pools["G"][0],
      gdn_conv=pools["G"][1],
      mamba_state=pools["M"][0],
      mamba_conv=pools["M"][1],
    )
    return logits, new_cache

  @_numerics
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
    x = self._embed(inputs.token_ids)
    for block, kind, group, slot in zip(
      self.blocks, cfg.layer_kinds, cfg.layer_group, cfg.layer_slot, strict=True
    ):
      h = block.mixer_norm(x)
      if kind == MLP_ONLY:
        x = x + block.mlp(h)
        continue
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
      x = block.feed_forward(block.mixer_residual(x, y))
    logits = self._logits(x)
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
  y, k_all, v_all = block.mixer(
    h,
    k_all,
    v_all,
    positions=inputs.positions,
    block_table=inputs.block_tables[group],
    slot_mapping=inputs.slot_mapping[group],
    seq_lens=inputs.seq_lens,
    query_start_loc=inputs.query_start_loc,
    layer=slot,
    implementation=implementation,
  )
  return y, k_all, v_all


def build_model(cfg: ModelConfig, seed: int = 0) -> HybridLM:
  """A `HybridLM` with random weights drawn from `seed` (deterministic)."""
  return HybridLM(cfg, rngs=nnx.Rngs(params=seed))
