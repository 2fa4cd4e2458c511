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
  in_proj_a (value head h then belongs to key head h // r in both);
* sparse MoE experts (`models.moe.MoE`: w_gate / w_up [E, d, I], w_down [E, I, d]): the
  per-expert tensors `experts.{e}.{gate,up,down}_proj.weight` ([I, d] / [d, I], what
  `save_pretrained` writes and the published checkpoints hold) transposed and stacked over e, or
  the fused layout of transformers 5's modules (`save_pretrained(save_original_format=False)`):
  Qwen's `experts.gate_up_proj` [E, 2I, d] ([gate | up] rows) and `experts.down_proj` [E, d, I],
  Nemotron-H's `experts.up_proj` [E, I, d] and `experts.down_proj` [E, d, I]; the router
  `gate.weight` [E, d] transposed.
Everything else (norm weights, A_log, dt_bias, D, conv bias, embeddings, the router's
`e_score_correction_bias`) is copied as is.

Names follow transformers 5's modeling files (`Qwen3_5ForCausalLM`, `Qwen3_5MoeForCausalLM`,
`Qwen3NextForCausalLM`, `NemotronHForCausalLM`, `Gemma3ForCausalLM`); the LM head is
"lm_head.weight" (top level) unless the embeddings are tied.
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


def _stack_t(ws):
  """Per-expert torch weights [out, in] (a list over experts) -> our [E, in, out]."""
  return jnp.stack([_t(w) for w in ws])


def _experts_t(w):
  """A fused expert tensor [E, out, in] -> our [E, in, out]."""
  return jnp.swapaxes(w, 1, 2)


@dataclasses.dataclass(frozen=True)
class Source:
  """One parameter's origin: the checkpoint tensor(s) and how they become ours.

  Attributes:
    name: a tensor name, or a tuple of names (e.g. one per expert) read together.
    transform: tensor -> our layout (a list of the tensors, in `name`'s order, for a tuple).
    alternative: another layout of the same parameter, read when the checkpoint lacks one of
      `name`'s tensors (the fused experts of transformers 5's in-memory modules).
  """

  name: str | tuple[str, ...]
  transform: Callable = _same
  alternative: Source | None = None

  @property
  def names(self) -> tuple[str, ...]:
    return self.name if isinstance(self.name, tuple) else (self.name,)


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
  for i, (kind, ffn) in enumerate(zip(cfg.layer_kinds, cfg.layer_ffn, strict=True)):
    for ours, src in family(cfg, kind, ffn, f"{names['layers']}.{i}").items():
      out[f"blocks.{i}.{ours}"] = src
  return out


_NAMES = {
  "qwen3_5_text": dict(embed="embed_tokens.weight", final_norm="norm.weight", layers="layers"),
  "qwen3_5_moe_text": dict(embed="embed_tokens.weight", final_norm="norm.weight", layers="layers"),
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


def _moe(cfg, prefix: str, shared: str) -> dict[str, Source]:
  """The MoE block under `prefix` (Qwen's `mlp`, Nemotron-H's `mixer`); `shared`: the shared
  expert's module name (Qwen `shared_expert`, Nemotron-H `shared_experts`)."""
  e, i = cfg.moe_num_experts, cfg.moe_hidden
  experts = f"{prefix}.experts"

  def per_expert(proj: str) -> tuple[str, ...]:
    return tuple(f"{experts}.{j}.{proj}.weight" for j in range(e))

  fused_down = Source(f"{experts}.down_proj", _experts_t)
  out = {
    "mlp.router.kernel": Source(f"{prefix}.gate.weight", _t),
    "mlp.w_down": Source(per_expert("down_proj"), _stack_t, fused_down),
  }
  if cfg.mlp_gated:  # Qwen: fused [gate | up] rows
    gate_up = f"{experts}.gate_up_proj"
    out["mlp.w_gate"] = Source(
      per_expert("gate_proj"), _stack_t, Source(gate_up, lambda w: _experts_t(w[:, :i]))
    )
    out["mlp.w_up"] = Source(
      per_expert("up_proj"), _stack_t, Source(gate_up, lambda w: _experts_t(w[:, i:]))
    )
  else:  # Nemotron-H: up only
    out["mlp.w_up"] = Source(
      per_expert("up_proj"), _stack_t, Source(f"{experts}.up_proj", _experts_t)
    )
  if cfg.moe_router == "sigmoid":
    out["mlp.score_bias"] = Source(f"{prefix}.gate.e_score_correction_bias")
  if cfg.moe_shared_hidden:
    for ours, src in _mlp(f"{prefix}.{shared}", gated=cfg.mlp_gated).items():
      out[ours.replace("mlp.", "mlp.shared.", 1)] = src
  if cfg.moe_shared_gate:
    out["mlp.shared_gate.kernel"] = Source(f"{prefix}.{shared}_gate.weight", _t)
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


def _qwen(cfg, kind: str, ffn: str, prefix: str, *, fused: bool) -> dict[str, Source]:
  out = {
    "mixer_norm.weight": Source(f"{prefix}.input_layernorm.weight"),
    "mlp_norm.weight": Source(f"{prefix}.post_attention_layernorm.weight"),
    **(_moe(cfg, f"{prefix}.mlp", "shared_expert") if ffn == "moe" else _mlp(f"{prefix}.mlp")),
  }
  if kind == "G":
    out.update(_gdn(cfg, f"{prefix}.linear_attn", fused))
  else:
    out.update(_attention(f"{prefix}.self_attn", qk_norm=True))
  return out


def _nemotron_h(cfg, kind: str, ffn: str | None, prefix: str) -> dict[str, Source]:
  out = {"mixer_norm.weight": Source(f"{prefix}.norm.weight")}
  mixer = f"{prefix}.mixer"
  if ffn == "moe":
    out.update(_moe(cfg, mixer, "shared_experts"))
  elif kind == MLP_ONLY:
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


def _gemma3(cfg, kind: str, ffn: str, prefix: str) -> dict[str, Source]:
  return {
    "mixer_norm.weight": Source(f"{prefix}.input_layernorm.weight"),
    "post_mixer_norm.weight": Source(f"{prefix}.post_attention_layernorm.weight"),
    "mlp_norm.weight": Source(f"{prefix}.pre_feedforward_layernorm.weight"),
    "post_mlp_norm.weight": Source(f"{prefix}.post_feedforward_layernorm.weight"),
    **_mlp(f"{prefix}.mlp"),
    **_attention(f"{prefix}.self_attn", qk_norm=True),
  }


_FAMILIES = {
  "qwen3_5_text": lambda cfg, kind, ffn, prefix: _qwen(cfg, kind, ffn, prefix, fused=False),
  "qwen3_5_moe_text": lambda cfg, kind, ffn, prefix: _qwen(cfg, kind, ffn, prefix, fused=False),
  "qwen3_next": lambda cfg, kind, ffn, prefix: _qwen(cfg, kind, ffn, prefix, fused=True),
  "nemotron_h": _nemotron_h,
  "gemma3_text": _gemma3,
}
