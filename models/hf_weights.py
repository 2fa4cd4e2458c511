"""Where each of our parameters comes from in a Hugging Face checkpoint, and how it is laid out.

`weight_map(arch)` maps every parameter path of `HybridLM(arch.config)` (dotted, as
`nnx.to_pure_dict` nests them: "blocks.3.mixer.q_proj.kernel") to a `Source`: the checkpoint
tensor's name (without the decoder prefix, which `models.pretrained` resolves) and the function
that turns that tensor into our layout:

* linear layers: torch's weight [out, in] -> our kernel [in, out] (transpose);
* causal conv weights: [C, 1, K] -> [C, K] (tap K-1 multiplies the newest token in both);
* the GDN gated norm: one [d_v] weight shared by the value heads -> tiled to [H_v * d_v];
* Qwen3-Next's fused projections: `in_proj_qkvz` [H_k * (2 d_k + 2 r d_v), d] holds, per key
  head, [q | k | v (r heads) | z (r heads)] (r = H_v / H_k) and `in_proj_ba` [H_k * 2r, d] holds
  [b | a] per key head: split into Qwen3.5's separate in_proj_qkv / in_proj_z / in_proj_b /
  in_proj_a (value head h then belongs to key head h // r in both).
Everything else (norm weights, A_log, dt_bias, D, conv bias, embeddings) is copied as is.

Names follow transformers 5's modeling files (`Qwen3_5ForCausalLM`, `Qwen3NextForCausalLM`,
`NemotronHForCausalLM`, `Gemma3ForCausalLM`); the LM head is "lm_head.weight" (top level) unless
the embeddings are tied.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp

from models.config import MLP_ONLY
from models.hf_config import HFArchitecture

LM_HEAD = "lm_head.weight"  # top level, outside the decoder prefix


def _t(w):
  return jnp.swapaxes(w, 0, 1)


def _same(w):
  return w


def _conv(w):
  return w.reshape(w.shape[0], w.shape[-1])


@dataclasses.dataclass(frozen=True)
class Source:
  """One parameter's origin: the checkpoint tensor `name` and `transform` (tensor -> ours)."""

  name: str
  transform: Callable = _same


def weight_map(arch: HFArchitecture) -> dict[str, Source]:
  """Our parameter path -> its `Source`, for every parameter of `HybridLM(arch.config)`."""
  cfg = arch.config
  family = _FAMILIES[arch.model_type]
  out: dict[str, Source] = {}
  names = _NAMES[arch.model_type]
  out["embed.embedding"] = Source(names["embed"])
  out["final_norm.weight"] = Source(names["final_norm"])
  if not cfg.tie_word_embeddings:
    out["lm_head.kernel"] = Source(LM_HEAD, _t)
  for i, kind in enumerate(cfg.layer_kinds):
    for ours, src in family(cfg, kind, f"{names['layers']}.{i}").items():
      out[f"blocks.{i}.{ours}"] = src
  return out


_NAMES = {
  "qwen3_5_text": dict(embed="embed_tokens.weight", final_norm="norm.weight", layers="layers"),
  "qwen3_next": dict(embed="embed_tokens.weight", final_norm="norm.weight", layers="layers"),
  "gemma3_text": dict(embed="embed_tokens.weight", final_norm="norm.weight", layers="layers"),
  "nemotron_h": dict(embed="embeddings.weight", final_norm="norm_f.weight", layers="layers"),
}


def _mlp(prefix: str, gated: bool = True) -> dict[str, Source]:
  out = {"mlp.up.kernel": Source(f"{prefix}.up_proj.weight", _t)}
  out["mlp.down.kernel"] = Source(f"{prefix}.down_proj.weight", _t)
  if gated:
    out["mlp.gate.kernel"] = Source(f"{prefix}.gate_proj.weight", _t)
  return out


def _attention(prefix: str, qk_norm: bool) -> dict[str, Source]:
  out = {
    f"mixer.{p}_proj.kernel": Source(f"{prefix}.{p}_proj.weight", _t) for p in ("q", "k", "v", "o")
  }
  if qk_norm:
    out["mixer.q_norm.weight"] = Source(f"{prefix}.q_norm.weight")
    out["mixer.k_norm.weight"] = Source(f"{prefix}.k_norm.weight")
  return out


def _gdn(cfg, prefix: str, fused: bool) -> dict[str, Source]:
  hv, dv = cfg.gdn_num_v_heads, cfg.gdn_head_v_dim
  out = {
    "mixer.A_log": Source(f"{prefix}.A_log"),
    "mixer.dt_bias": Source(f"{prefix}.dt_bias"),
    "mixer.conv_weight": Source(f"{prefix}.conv1d.weight", _conv),
    "mixer.norm.weight": Source(f"{prefix}.norm.weight", lambda w: jnp.tile(w, hv)),
    "mixer.out_proj.kernel": Source(f"{prefix}.out_proj.weight", _t),
  }
  if not fused:
    for p in ("qkv", "z", "b", "a"):
      out[f"mixer.in_proj_{p}.kernel"] = Source(f"{prefix}.in_proj_{p}.weight", _t)
    return out
  hk, dk = cfg.gdn_num_k_heads, cfg.gdn_head_k_dim
  r = hv // hk

  def qkvz(w):  # [hk * (2 dk + 2 r dv), d] -> per key head [q | k | v | z]
    g = w.reshape(hk, 2 * dk + 2 * r * dv, w.shape[-1])
    return g[:, :dk], g[:, dk : 2 * dk], g[:, 2 * dk : 2 * dk + r * dv], g[:, 2 * dk + r * dv :]

  def flat(x):
    return x.reshape(-1, x.shape[-1])

  def in_qkv(w):
    q, k, v, _ = qkvz(w)
    return _t(jnp.concatenate([flat(q), flat(k), flat(v)], axis=0))

  def in_z(w):
    return _t(flat(qkvz(w)[3]))

  def ba(w, j):  # [hk * 2r, d] -> per key head [b (r) | a (r)]
    g = w.reshape(hk, 2 * r, w.shape[-1])
    return _t(flat(g[:, j * r : (j + 1) * r]))

  fused_qkvz, fused_ba = f"{prefix}.in_proj_qkvz.weight", f"{prefix}.in_proj_ba.weight"
  out["mixer.in_proj_qkv.kernel"] = Source(fused_qkvz, in_qkv)
  out["mixer.in_proj_z.kernel"] = Source(fused_qkvz, in_z)
  out["mixer.in_proj_b.kernel"] = Source(fused_ba, lambda w: ba(w, 0))
  out["mixer.in_proj_a.kernel"] = Source(fused_ba, lambda w: ba(w, 1))
  return out


def _qwen(cfg, kind: str, prefix: str, *, fused: bool) -> dict[str, Source]:
  out = {
    "mixer_norm.weight": Source(f"{prefix}.input_layernorm.weight"),
    "mlp_norm.weight": Source(f"{prefix}.post_attention_layernorm.weight"),
    **_mlp(f"{prefix}.mlp"),
  }
  if kind == "G":
    out.update(_gdn(cfg, f"{prefix}.linear_attn", fused))
  else:
    out.update(_attention(f"{prefix}.self_attn", qk_norm=True))
  return out


def _nemotron_h(cfg, kind: str, prefix: str) -> dict[str, Source]:
  out = {"mixer_norm.weight": Source(f"{prefix}.norm.weight")}
  mixer = f"{prefix}.mixer"
  if kind == MLP_ONLY:
    out.update(_mlp(mixer, gated=False))
  elif kind == "A":
    out.update(_attention(mixer, qk_norm=False))
  else:
    out.update(
      {
        "mixer.in_proj.kernel": Source(f"{mixer}.in_proj.weight", _t),
        "mixer.conv_weight": Source(f"{mixer}.conv1d.weight", _conv),
        "mixer.conv_bias": Source(f"{mixer}.conv1d.bias"),
        "mixer.A_log": Source(f"{mixer}.A_log"),
        "mixer.D": Source(f"{mixer}.D"),
        "mixer.dt_bias": Source(f"{mixer}.dt_bias"),
        "mixer.norm.weight": Source(f"{mixer}.norm.weight"),
        "mixer.out_proj.kernel": Source(f"{mixer}.out_proj.weight", _t),
      }
    )
  return out


def _gemma3(cfg, kind: str, prefix: str) -> dict[str, Source]:
  return {
    "mixer_norm.weight": Source(f"{prefix}.input_layernorm.weight"),
    "post_mixer_norm.weight": Source(f"{prefix}.post_attention_layernorm.weight"),
    "mlp_norm.weight": Source(f"{prefix}.pre_feedforward_layernorm.weight"),
    "post_mlp_norm.weight": Source(f"{prefix}.post_feedforward_layernorm.weight"),
    **_mlp(f"{prefix}.mlp"),
    **_attention(f"{prefix}.self_attn", qk_norm=True),
  }


_FAMILIES = {
  "qwen3_5_text": lambda cfg, kind, prefix: _qwen(cfg, kind, prefix, fused=False),
  "qwen3_next": lambda cfg, kind, prefix: _qwen(cfg, kind, prefix, fused=True),
  "nemotron_h": _nemotron_h,
  "gemma3_text": _gemma3,
}
