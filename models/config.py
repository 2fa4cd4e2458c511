"""Static model configuration (`ModelConfig`) and the tiny presets.

A model is a stack of `num_layers` decoder blocks; block i has the mixer named by
`layer_pattern[i % len(layer_pattern)]`:

  G = Gated DeltaNet (Qwen3-Next / Qwen3.5), M = Mamba2 (Nemotron-H),
  A or F = full (causal) attention, S = sliding-window attention (`window` tokens),
  - = an MLP-only layer (Nemotron-H's "-"; only with `block_style="single"`).

How a block wires its sublayers (`block_style`):

  "pre_norm" (Qwen3.5, Qwen3-Next, the tiny presets): x + mixer(norm(x)); x + mlp(norm(x)).
  "sandwich" (Gemma 3): x + norm(mixer(norm(x))); x + norm(mlp(norm(x))).
  "single" (Nemotron-H): one sublayer per layer, x + sublayer(norm(x)), the sublayer being the
    mixer (G, M, A, S) or the MLP (-).

The other architecture switches (all off in the tiny presets, set by `models.hf_config` from a
Hugging Face `config.json`): RMSNorm scaling by (1 + w) (`norm_offset`), the attention's output
gate (`attn_output_gate`), per-head q/k RMSNorm (`qk_norm`), partial or no rotary embedding
(`rotary_dim`), the attention scale (`attn_scale`), linear RoPE scaling of the full-attention
layers (`rope_factor`), the MLP's activation and gate (`mlp_activation`, `mlp_gated`), scaled
embeddings (`embed_scale`), tied LM head (`tie_word_embeddings`), final-logit soft-capping
(`final_logit_softcap`) and Mamba2's lower bound on the time step (`mamba_dt_min`).

Sparse mixture-of-experts feed-forward layers (`models.moe`; all off in the presets): the layers
listed in `moe_layers` replace their MLP by a router over `moe_num_experts` experts of width
`moe_hidden`, each token using its `moe_top_k` best, plus an optional shared expert of width
`moe_shared_hidden` (Qwen3.5-MoE / Qwen3-Next: every (or every `decoder_sparse_step`-th) layer's
MLP; Nemotron-H: its "E" layers, which are MLP-only "-" layers of the "single" block style). The
experts and the shared expert use the MLP's activation and gate (`mlp_activation`,
`mlp_gated`). Example::

  moe = qwen35_tiny(moe_num_experts=4, moe_top_k=2, moe_hidden=32, moe_layers=(0, 1, 2, 3))
  moe.layer_ffn                 # ('moe', 'moe', 'moe', 'moe')

Cache groups follow vLLM's grouping by spec: all full-attention layers form the group
"full", all sliding-window layers the group "swa", and the recurrent layers one "mamba"
group (`recurrent_grouping="shared"`, default) or one "mamba" group per recurrent kind, G
and M apart (`"per_kind"`: two recurrent groups, each with its own block table, state ids
and copies); groups are ordered by first appearance in the pattern. Example::

  cfg = hybrid3_tiny()          # pattern "GSGA", 4 layers
  cfg.layer_kinds               # ('G', 'S', 'G', 'A')
  cfg.cache_groups              # ('mamba', 'swa', 'full')
  cfg.layer_group               # (0, 1, 0, 2)
  two = ModelConfig(layer_pattern="GMA", num_layers=3, recurrent_grouping="per_kind")
  two.cache_groups              # ('mamba', 'mamba', 'full')
  two.recurrent_groups          # (0, 1): G layers in group 0, M layers in group 1

`ModelConfig` is frozen and hashable (a static jit argument); bad values raise
`ValueError` naming the field, the value and the allowed range. No JAX import here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

LAYER_LETTERS = "GMAFS-"
MLP_ONLY = "-"
_LETTER_TO_GROUP = {"G": "mamba", "M": "mamba", "A": "full", "F": "full", "S": "swa"}
DTYPES = ("float32", "bfloat16")
RECURRENT_GROUPINGS = ("shared", "per_kind")
BLOCK_STYLES = ("pre_norm", "sandwich", "single")
MLP_ACTIVATIONS = ("silu", "gelu_tanh", "relu2")
MOE_ROUTERS = ("softmax", "sigmoid")


def _check_int(field: str, value: Any, *, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, int):
    raise ValueError(f"{field} must be an integer >= {minimum}, got {value!r}")
  if value < minimum:
    raise ValueError(f"{field} must be >= {minimum}, got {value}")


def _check_pos_float(field: str, value: Any) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
    raise ValueError(f"{field} must be a number > 0, got {value!r}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Frozen, validated description of a hybrid decoder.

  Attributes:
    layer_pattern: letters from "GMAFS", repeated (and truncated) to `num_layers`.
    num_layers: decoder blocks (>= 1).
    vocab_size: token ids in [0, vocab_size).
    d_model: residual width.
    mlp_hidden: SwiGLU hidden width.
    num_heads / num_kv_heads / head_dim: attention (A/F/S) heads; num_heads is a multiple
      of num_kv_heads (GQA).
    window: sliding window W in tokens for S layers: a query at position p sees keys at
      positions (p - W, p]. Required iff the pattern has an S.
    rope_theta: RoPE base of full-attention layers; rope_local_theta: of S layers.
    gdn_num_k_heads / gdn_num_v_heads / gdn_head_k_dim / gdn_head_v_dim: GDN heads
      (num_v_heads a multiple of num_k_heads; value head h uses k-head h // ratio).
    mamba_num_heads / mamba_head_dim / mamba_state_dim / mamba_n_groups: Mamba2 heads H,
      head dim P, state dim N and B/C groups G (H a multiple of G).
    conv_kernel: causal depthwise conv width K of G and M layers (conv state keeps K-1 rows).
    norm_eps: RMSNorm epsilon.
    dtype: parameter and activation dtype ("float32" or "bfloat16"); recurrent states,
      norms, gates and logits are always fp32.
    recurrent_grouping: "shared" (G and M layers form one "mamba" cache group) or
      "per_kind" (one "mamba" cache group per recurrent kind present).
    block_style: "pre_norm" | "sandwich" | "single" (module docstring).
    norm_offset: RMSNorms scale by (1 + w), w initialised to 0 (Qwen3-Next / Qwen3.5 / Gemma 3),
      instead of w initialised to 1. The GDN / Mamba2 gated norms always scale by w.
    attn_output_gate: the query projection also emits a per-head gate g (HF layout: per head
      [query | gate], 2 * head_dim wide) and the attention output is o * sigmoid(g).
    qk_norm: RMSNorm (over head_dim, `norm_offset` applies) on q and k before RoPE.
    rotary_dim: leading channels of each head that RoPE rotates (even, <= head_dim); None =
      head_dim; 0 = no positional embedding (Nemotron-H's attention).
    rope_factor: linear RoPE scaling of the full-attention layers (positions / factor).
    attn_scale: softmax scale; None = head_dim ** -0.5.
    mlp_activation: "silu" | "gelu_tanh" | "relu2" (relu(x) ** 2).
    mlp_gated: down(act(gate(x)) * up(x)) if True, else down(act(up(x))).
    embed_scale: embeddings are multiplied by sqrt(d_model) (cast to `dtype`), as Gemma 3.
    tie_word_embeddings: the LM head is the embedding matrix (no separate lm_head).
    final_logit_softcap: logits = c * tanh(logits / c) when set.
    mamba_dt_min: Mamba2's time step is max(softplus(dt + dt_bias), mamba_dt_min)
      (Nemotron-H's `time_step_limit`); 0 = no bound.
    moe_layers: sorted indices of the layers whose feed-forward is the sparse MoE block
      (`models.moe.MoE`) instead of the MLP; () = none. With block_style="single" each must be
      an MLP-only ("-") layer.
    moe_num_experts: routed experts E (>= 1 iff `moe_layers` is non-empty, else 0).
    moe_top_k: experts per token k, in [1, E].
    moe_hidden: width I of each routed expert.
    moe_shared_hidden: width of the shared expert every token also runs (0 = none).
    moe_shared_gate: the shared expert's output is scaled by sigmoid(x . w), w [d_model]
      (Qwen's `shared_expert_gate`); needs a shared expert.
    moe_router: "softmax" (Qwen: top-k of softmax(logits)) or "sigmoid" (Nemotron-H: top-k of
      sigmoid(logits) + a per-expert selection bias, within the best `moe_topk_group` of
      `moe_n_group` expert groups); `models.moe.route` states both rules.
    moe_norm_topk: the k weights are divided by their sum.
    moe_n_group / moe_topk_group: expert groups G (divides E, >= 2 experts each) and groups a
      token may choose from, in [1, G]; G > 1 only with the sigmoid router.
    moe_scaling: the routed experts' weights are multiplied by this (`routed_scaling_factor`).
  """

  layer_pattern: str
  num_layers: int
  vocab_size: int = 256
  d_model: int = 64
  mlp_hidden: int = 128
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 16
  window: int | None = None
  rope_theta: float = 10000.0
  rope_local_theta: float = 10000.0
  gdn_num_k_heads: int = 2
  gdn_num_v_heads: int = 4
  gdn_head_k_dim: int = 16
  gdn_head_v_dim: int = 16
  mamba_num_heads: int = 4
  mamba_head_dim: int = 16
  mamba_state_dim: int = 16
  mamba_n_groups: int = 1
  conv_kernel: int = 4
  norm_eps: float = 1e-6
  dtype: str = "float32"
  recurrent_grouping: str = "shared"
  block_style: str = "pre_norm"
  norm_offset: bool = False
  attn_output_gate: bool = False
  qk_norm: bool = False
  rotary_dim: int | None = None
  rope_factor: float = 1.0
  attn_scale: float | None = None
  mlp_activation: str = "silu"
  mlp_gated: bool = True
  embed_scale: bool = False
  tie_word_embeddings: bool = False
  final_logit_softcap: float | None = None
  mamba_dt_min: float = 0.0
  moe_layers: tuple[int, ...] = ()
  moe_num_experts: int = 0
  moe_top_k: int = 0
  moe_hidden: int = 0
  moe_shared_hidden: int = 0
  moe_shared_gate: bool = False
  moe_router: str = "softmax"
  moe_norm_topk: bool = True
  moe_n_group: int = 1
  moe_topk_group: int = 1
  moe_scaling: float = 1.0

  def __post_init__(self):
    pattern = self.layer_pattern
    if not isinstance(pattern, str) or not pattern:
      raise ValueError(
        f"layer_pattern must be a non-empty string over {LAYER_LETTERS!r}, got {pattern!r}"
      )
    for i, ch in enumerate(pattern):
      if ch not in LAYER_LETTERS:
        raise ValueError(
          f"layer_pattern[{i}]={ch!r} is not a layer letter; allowed: G (GDN), M (Mamba2), "
          "A/F (full attention), S (sliding window), - (MLP only)"
        )
    for name in (
      "num_layers",
      "vocab_size",
      "d_model",
      "mlp_hidden",
      "num_heads",
      "num_kv_heads",
      "head_dim",
      "gdn_num_k_heads",
      "gdn_num_v_heads",
      "gdn_head_k_dim",
      "gdn_head_v_dim",
      "mamba_num_heads",
      "mamba_head_dim",
      "mamba_state_dim",
      "mamba_n_groups",
    ):
      _check_int(name, getattr(self, name), minimum=1)
    _check_int("conv_kernel", self.conv_kernel, minimum=2)
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"num_heads must be a multiple of num_kv_heads={self.num_kv_heads}, got {self.num_heads}"
      )
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
    if self.gdn_num_v_heads % self.gdn_num_k_heads:
      raise ValueError(
        f"gdn_num_v_heads must be a multiple of gdn_num_k_heads={self.gdn_num_k_heads}, "
        f"got {self.gdn_num_v_heads}"
      )
    if self.mamba_num_heads % self.mamba_n_groups:
      raise ValueError(
        f"mamba_num_heads must be a multiple of mamba_n_groups={self.mamba_n_groups}, "
        f"got {self.mamba_num_heads}"
      )
    if "S" in self.layer_kinds:
      if self.window is None:
        raise ValueError("window is required when layer_pattern has S layers (tokens, >= 1)")
      _check_int("window", self.window, minimum=1)
    elif self.window is not None:
      raise ValueError(f"window is only valid with S layers in layer_pattern, got {self.window!r}")
    _check_pos_float("rope_theta", self.rope_theta)
    _check_pos_float("rope_local_theta", self.rope_local_theta)
    _check_pos_float("norm_eps", self.norm_eps)
    if self.dtype not in DTYPES:
      raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
    if self.recurrent_grouping not in RECURRENT_GROUPINGS:
      raise ValueError(
        f"recurrent_grouping must be one of {RECURRENT_GROUPINGS}, got {self.recurrent_grouping!r}"
      )
    self._check_architecture()
    self._check_moe()

  def _check_architecture(self) -> None:
    """The architecture switches (see the class docstring)."""
    if self.block_style not in BLOCK_STYLES:
      raise ValueError(f"block_style must be one of {BLOCK_STYLES}, got {self.block_style!r}")
    if MLP_ONLY in self.layer_kinds and self.block_style != "single":
      raise ValueError(
        f"layer_pattern has MLP-only layers ({MLP_ONLY!r}), which need block_style='single', "
        f"got block_style={self.block_style!r}"
      )
    if not any(k != MLP_ONLY for k in self.layer_kinds):
      raise ValueError(f"layer_pattern needs at least one mixer layer, got {self.layer_pattern!r}")
    if self.rotary_dim is not None:
      _check_int("rotary_dim", self.rotary_dim, minimum=0)
      if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
        raise ValueError(
          f"rotary_dim must be even and in [0, head_dim={self.head_dim}], got {self.rotary_dim}"
        )
    _check_pos_float("rope_factor", self.rope_factor)
    if self.attn_scale is not None:
      _check_pos_float("attn_scale", self.attn_scale)
    if self.mlp_activation not in MLP_ACTIVATIONS:
      raise ValueError(
        f"mlp_activation must be one of {MLP_ACTIVATIONS}, got {self.mlp_activation!r}"
      )
    if self.final_logit_softcap is not None:
      _check_pos_float("final_logit_softcap", self.final_logit_softcap)
    dt_min = self.mamba_dt_min
    if isinstance(dt_min, bool) or not isinstance(dt_min, (int, float)) or dt_min < 0:
      raise ValueError(f"mamba_dt_min must be a number >= 0, got {dt_min!r}")

  def _check_moe(self) -> None:
    """The sparse MoE fields (see the class docstring)."""
    layers = self.moe_layers
    if not isinstance(layers, tuple) or any(
      isinstance(i, bool) or not isinstance(i, int) for i in layers
    ):
      raise ValueError(f"moe_layers must be a tuple of layer indices, got {layers!r}")
    if list(layers) != sorted(set(layers)) or any(not 0 <= i < self.num_layers for i in layers):
      raise ValueError(
        f"moe_layers must be increasing indices in [0, num_layers={self.num_layers}), "
        f"got {layers!r}"
      )
    if not layers:
      if self.moe_num_experts != 0:
        raise ValueError(
          f"moe_num_experts must be 0 without moe_layers, got {self.moe_num_experts!r}"
        )
      return
    _check_int("moe_num_experts", self.moe_num_experts, minimum=1)
    e = self.moe_num_experts
    _check_int("moe_top_k", self.moe_top_k, minimum=1)
    if self.moe_top_k > e:
      raise ValueError(f"moe_top_k must be in [1, moe_num_experts={e}], got {self.moe_top_k}")
    _check_int("moe_hidden", self.moe_hidden, minimum=1)
    _check_int("moe_shared_hidden", self.moe_shared_hidden, minimum=0)
    if self.moe_shared_gate and not self.moe_shared_hidden:
      raise ValueError("moe_shared_gate needs a shared expert (moe_shared_hidden >= 1), got 0")
    if self.moe_router not in MOE_ROUTERS:
      raise ValueError(f"moe_router must be one of {MOE_ROUTERS}, got {self.moe_router!r}")
    _check_int("moe_n_group", self.moe_n_group, minimum=1)
    g = self.moe_n_group
    if g > 1 and self.moe_router != "sigmoid":
      raise ValueError(f"moe_n_group must be 1 with moe_router={self.moe_router!r}, got {g}")
    if e % g or (g > 1 and e // g < 2):
      raise ValueError(
        f"moe_n_group must divide moe_num_experts={e} into groups of >= 2 experts, got {g}"
      )
    _check_int("moe_topk_group", self.moe_topk_group, minimum=1)
    if self.moe_topk_group > g:
      raise ValueError(f"moe_topk_group must be in [1, moe_n_group={g}], got {self.moe_topk_group}")
    if self.moe_top_k > self.moe_topk_group * (e // g):
      raise ValueError(
        f"moe_top_k must be <= the experts of moe_topk_group={self.moe_topk_group} groups "
        f"({self.moe_topk_group * (e // g)}), got {self.moe_top_k}"
      )
    _check_pos_float("moe_scaling", self.moe_scaling)
    if self.block_style == "single":
      bad = [i for i in layers if self.layer_kinds[i] != MLP_ONLY]
      if bad:
        raise ValueError(
          f"moe_layers with block_style='single' must be MLP-only ({MLP_ONLY!r}) layers, got "
          f"layer {bad[0]} of kind {self.layer_kinds[bad[0]]!r}"
        )

  # ---- derived, static ----
  @property
  def layer_ffn(self) -> tuple[str | None, ...]:
    """The feed-forward of each layer: "mlp", "moe" (`moe_layers`) or None (a "single"-style
    mixer layer, which has none)."""
    single = self.block_style == "single"
    return tuple(
      "moe" if i in self.moe_layers else (None if single and kind != MLP_ONLY else "mlp")
      for i, kind in enumerate(self.layer_kinds)
    )

  @property
  def layer_kinds(self) -> tuple[str, ...]:
    """Mixer letter of each layer; F is normalised to A ("-" = MLP only, no mixer)."""
    p = self.layer_pattern
    return tuple("A" if p[i % len(p)] == "F" else p[i % len(p)] for i in range(self.num_layers))

  def _group_key(self, kind: str) -> str:
    g = _LETTER_TO_GROUP[kind]
    if g == "mamba" and self.recurrent_grouping == "per_kind":
      return f"mamba:{kind}"
    return g

  @property
  def _group_keys(self) -> tuple[str, ...]:
    out: list[str] = []
    for k in self.layer_kinds:
      if k == MLP_ONLY:
        continue
      key = self._group_key(k)
      if key not in out:
        out.append(key)
    return tuple(out)

  @property
  def cache_groups(self) -> tuple[str, ...]:
    """Cache group kinds ("full" | "swa" | "mamba") in order of first appearance."""
    return tuple(key.split(":")[0] for key in self._group_keys)

  @property
  def layer_group(self) -> tuple[int, ...]:
    """Cache group index of each layer (-1 for an MLP-only layer, which caches nothing)."""
    keys = self._group_keys
    return tuple(-1 if k == MLP_ONLY else keys.index(self._group_key(k)) for k in self.layer_kinds)

  @property
  def recurrent_groups(self) -> tuple[int, ...]:
    """Indices of the "mamba" cache groups, in group order (empty without recurrent layers).

    `StepInputs.state_read` etc. have one row per recurrent group, in this order.
    """
    return tuple(i for i, kind in enumerate(self.cache_groups) if kind == "mamba")

  def recurrent_index(self, kind: str) -> int:
    """Row of `StepInputs.state_read` etc. used by the layers of recurrent kind "G" or "M"."""
    if kind not in "GM" or kind not in self.layer_kinds:
      raise ValueError(f"kind must be a recurrent letter of the pattern (G or M), got {kind!r}")
    return self.recurrent_groups.index(self._group_keys.index(self._group_key(kind)))

  @property
  def layer_slot(self) -> tuple[int, ...]:
    """Index of each layer within its cache array family (attention, GDN or Mamba2; the
    MLP-only layers count among themselves)."""
    counters = {"attn": 0, "G": 0, "M": 0, MLP_ONLY: 0}
    out = []
    for k in self.layer_kinds:
      fam = "attn" if k in "AS" else k
      out.append(counters[fam])
      counters[fam] += 1
    return tuple(out)

  def count(self, kinds: str) -> int:
    """Number of layers whose letter is in `kinds` (e.g. "AS" = attention layers)."""
    return sum(k in kinds for k in self.layer_kinds)

  @property
  def recurrent_group(self) -> int | None:
    """Index of the first "mamba" cache group, or None when there is no recurrent layer."""
    g = self.recurrent_groups
    return g[0] if g else None

  @property
  def num_recurrent_rows(self) -> int:
    """Rows of `StepInputs.state_read` etc.: one per recurrent group, at least 1."""
    return max(1, len(self.recurrent_groups))

  @property
  def gdn_conv_dim(self) -> int:
    """Channels of the GDN conv: [q | k | v] = 2 * H_k * d_k + H_v * d_v."""
    return (
      2 * self.gdn_num_k_heads * self.gdn_head_k_dim + self.gdn_num_v_heads * self.gdn_head_v_dim
    )

  @property
  def mamba_d_inner(self) -> int:
    return self.mamba_num_heads * self.mamba_head_dim

  @property
  def mamba_conv_dim(self) -> int:
    """Channels of the Mamba2 conv: [x | B | C] = d_inner + 2 * G * N."""
    return self.mamba_d_inner + 2 * self.mamba_n_groups * self.mamba_state_dim

  @property
  def rope_dim(self) -> int:
    """Channels of each attention head that RoPE rotates (0 = no RoPE)."""
    return self.head_dim if self.rotary_dim is None else self.rotary_dim

  @property
  def softmax_scale(self) -> float:
    return self.head_dim**-0.5 if self.attn_scale is None else self.attn_scale

  def replace(self, **changes: Any) -> ModelConfig:
    return dataclasses.replace(self, **changes)


# ---- presets (tiny: CPU tests run in seconds; weights are random from a seed) ----


def qwen35_tiny(**overrides: Any) -> ModelConfig:
  """Qwen3.5-like: three GDN layers then one full-attention layer."""
  kw: dict[str, Any] = dict(layer_pattern="GGGA", num_layers=4, vocab_size=256, d_model=64)
  kw.update(overrides)
  return ModelConfig(**kw)


def nemotron_h_tiny(**overrides: Any) -> ModelConfig:
  """Nemotron-H-like: three Mamba2 layers then one attention layer."""
  kw: dict[str, Any] = dict(
    layer_pattern="MMMA", num_layers=4, vocab_size=256, d_model=64, mamba_n_groups=2
  )
  kw.update(overrides)
  return ModelConfig(**kw)


def gemma3_tiny(**overrides: Any) -> ModelConfig:
  """Gemma 3-like: five sliding-window layers then one global layer."""
  kw: dict[str, Any] = dict(
    layer_pattern="SSSSSF",
    num_layers=6,
    vocab_size=256,
    d_model=64,
    window=24,
    rope_theta=1_000_000.0,
    rope_local_theta=10_000.0,
  )
  kw.update(overrides)
  return ModelConfig(**kw)


def hybrid3_tiny(**overrides: Any) -> ModelConfig:
  """All three cache-group kinds: GDN, sliding window and full attention ("GSGA")."""
  kw: dict[str, Any] = dict(
    layer_pattern="GSGA", num_layers=4, vocab_size=256, d_model=64, window=24
  )
  kw.update(overrides)
  return ModelConfig(**kw)


PRESETS = {
  "qwen35_tiny": qwen35_tiny,
  "nemotron_h_tiny": nemotron_h_tiny,
  "gemma3_tiny": gemma3_tiny,
  "hybrid3_tiny": hybrid3_tiny,
}


def get_preset(name: str, **overrides: Any) -> ModelConfig:
  """Returns the preset `name` with `overrides` applied."""
  if name not in PRESETS:
    raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {name!r}")
  return PRESETS[name](**overrides)
