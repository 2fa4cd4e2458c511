"""Per-model cost model: bytes of KV per token and of one recurrent checkpoint, FLOPs, TTFT.

Two FLOP conventions:
- "marconi" (Marconi's `utils.py`, fp16, no GQA, D = d_model, N = state dim):
    F_attn(L) = 8 L D^2 + 4 L^2 D,  F_mlp(L) = 16 L D^2,  F_ssm(L) = 12 L D^2 + 16 L D N + 10 L D
    kv bytes per token and attention layer = 2 * D * 2, one SSM layer's state
    = D N 2 + (2 D + 2 N) * 4 * 2 (SSM state + a 4-wide conv state, fp16).
- "generic" (GQA attention, SWA, gated MLP, GDN or Mamba2 with their real state shapes):
    attention: projections 2 L D (g Hq + 2 Hkv) d + output 2 L Hq d D + scores/AV 4 L min(L, W) Hq d
    (W = window, or L for full attention: the same non-causal count as Marconi's 4 L^2 D;
    g = 2 with an output gate, `attn_output_gate`: Qwen3.5's / Qwen3-Next's q_proj emits the
    query and a sigmoid gate of Hq d each; the gate's elementwise product is not counted, as no
    norm or activation is; g = 1 otherwise);
    MLP: 2 L D d_ff * mlp_matrices;
    sparse MoE layer (active parameters only: the router, the k routed experts a token runs,
    the shared expert and its gate): 2 L D (E + k I m + S m + g), E = `moe_experts`,
    k = `moe_top_k`, I = `moe_d_ff`, S = `moe_shared_d_ff` (0 = none), m = `moe_matrices`
    (3 SwiGLU, 2 relu2), g = 1 with Qwen's shared-expert gate (`moe_shared_gate`) else 0;
    the routing itself (softmax / sigmoid, top-k) is not counted, as no activation is;
    GDN: 2 L D (conv_dim + Hv dv + 2 Hv) + 2 L Hv dv D + 2 K conv_dim L + 6 L Hv dk dv;
    Mamba2: 2 L D (2 d_inner + 2 G N + H) + 2 L d_inner D + 2 K conv_dim L + 6 L H P N.
  State of one GDN layer: Hv dk dv * state_bytes + (K - 1) conv_dim * conv_bytes;
  Mamba2: H P N * state_bytes + (K - 1) (d_inner + 2 G N) * conv_bytes.
  MoE layers hold no cache: KV and state bytes do not depend on them.

TTFT: Marconi's fitted Jamba-1.5-Mini prefill line, TTFT_ms(L) = 17.81 + 0.05296 s with
s = 50 floor(L / 50) + 50 capped at 31,950 (`ttft_ms`). Configs may set their own line (every
preset here keeps Marconi's: an assumption for the non-Marconi shapes). `step_ms(T)` is the
same line without the grid, for one engine step that computes T tokens (concurrent replay).

vLLM's block size for a hybrid (`vllm_block_size`, page equality): vLLM 0.33
`Platform._align_hybrid_block_size` (vllm/platforms/interface.py) raises the attention block
size until ONE attention layer's page covers ONE recurrent layer's state page (groups hold
equal numbers of layers, so the rule is per layer, not over the whole model):

  page_1 = 2 kv_heads head_dim kv_bytes     (FullAttentionSpec(block_size=1).page_size_bytes)
  state  = state_bytes_per_layer           (MambaSpec: conv + temporal, unpadded)
  a      = max(16, 16)                     (FlashAttention/Triton: MultipleOf(16); default 16)
  a      = lcm(a, checkpoint alignment)    (align mode; FlashInfer's GDN prefill on SM90: 64,
                                            Mamba2 layers declare none: 1)
  B      = a * cdiv(state, a * page_1), rounded up to a multiple of 16

and then pads the recurrent page to exactly B * page_1. Qwen3.5-4B shapes: page_1 = 4,096 B,
state = 2,146,304 B (524 tokens of one layer's KV), so B = 528 with a = 16 (the 528 reported in
vLLM #40696) and 576 with FlashInfer's 64-token checkpoint alignment (Hopper, align mode).

Presets in `MODELS`; `hf_cost_model.py` builds a `CostModel` from a Hugging Face
`config.json` (Qwen3.5 / Qwen3.5-MoE / Qwen3-Next, Nemotron-H, Gemma 3).

Example (Marconi's default 7B hybrid)::

  m = get_model("marconi_7b")
  m.state_bytes            # 26_787_840 = 24 * 1_116_160
  m.kv_bytes_per_token     # 65_536 = 4 * 2 * 4096 * 2
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

VLLM_KERNEL_BLOCK = 16  # FlashAttention / Triton attention: MultipleOf(16) kernel blocks
VLLM_DEFAULT_BLOCK = 16  # vllm/config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE


@dataclasses.dataclass(frozen=True)
class CostModel:
  """Layer counts and shapes of a hybrid model (see module docstring for the formulas).

  Attributes:
    name: preset name.
    d_model: hidden size D.
    n_attn: full-attention layers; n_swa: sliding-window layers (window `swa_window`).
    n_recurrent: recurrent layers of kind `recurrent` ("marconi_ssm", "gdn", "mamba2").
    n_mlp: dense MLP layers (d_ff wide, `mlp_matrices` weight matrices each).
    n_moe: sparse MoE layers (their feed-forward; Qwen3.5-MoE, Qwen3-Next, Nemotron-H "E"),
      each `moe_flops`: moe_experts routed experts of moe_d_ff, moe_top_k per token, a shared
      expert of moe_shared_d_ff (0 = none; gated when moe_shared_gate), moe_matrices weight
      matrices per expert. 0 and unset in every preset.
    q_heads, kv_heads, head_dim: attention shapes; kv_dtype_bytes: bytes per KV element.
    attn_output_gate: the attention's q projection also emits an output gate of Hq head_dim
      (Qwen3.5, Qwen3-Next): counted in the projection FLOPs (module docstring). The presets
      leave it off.
    rec_heads, rec_dk, rec_dv: GDN (Hv, dk, dv) or Mamba2 (H, N, P) state shape.
    rec_groups: Mamba2 groups G (GDN: key heads Hk); conv_kernel: K.
    state_dtype_bytes / conv_dtype_bytes: bytes per recurrent / conv state element.
    flops_style: "marconi" or "generic".
    vllm_checkpoint_alignment: the token alignment vLLM's recurrent layers declare for
      prefill checkpoints in align mode (`get_prefill_checkpoint_alignment`: 64 for GDN with
      FlashInfer's prefill, chosen on Hopper; 1 = none declared, as Mamba2 and Triton GDN).
  """

  name: str
  d_model: int
  n_attn: int
  n_recurrent: int
  n_mlp: int
  n_swa: int = 0
  swa_window: int = 0
  recurrent: str = "marconi_ssm"
  q_heads: int = 0
  kv_heads: int = 0
  head_dim: int = 0
  attn_output_gate: bool = False
  kv_dtype_bytes: int = 2
  rec_heads: int = 0
  rec_dk: int = 0
  rec_dv: int = 0
  rec_groups: int = 0
  conv_kernel: int = 4
  state_dtype_bytes: int = 4
  conv_dtype_bytes: int = 2
  d_ff: int = 0
  mlp_matrices: int = 3
  ssm_state_dim: int = 128  # Marconi's N
  flops_style: str = "generic"
  ttft_intercept_ms: float = 17.81
  ttft_slope_ms: float = 0.05296
  vllm_checkpoint_alignment: int = 1  # the recurrent layers' prefill checkpoint alignment
  n_moe: int = 0
  moe_experts: int = 0
  moe_top_k: int = 0
  moe_d_ff: int = 0
  moe_shared_d_ff: int = 0
  moe_shared_gate: bool = False
  moe_matrices: int = 3

  # ---- bytes ----
  @property
  def kv_bytes_per_token_per_layer(self) -> int:
    if self.flops_style == "marconi":
      return 2 * self.d_model * 2
    return 2 * self.kv_heads * self.head_dim * self.kv_dtype_bytes

  @property
  def kv_bytes_per_token(self) -> int:
    """KV bytes of one token over all full-attention layers."""
    return self.n_attn * self.kv_bytes_per_token_per_layer

  @property
  def swa_kv_bytes_per_token(self) -> int:
    """KV bytes of one token over all sliding-window layers (while inside the window)."""
    return self.n_swa * self.kv_bytes_per_token_per_layer

  @property
  def conv_dim(self) -> int:
    if self.recurrent == "gdn":
      return 2 * self.rec_groups * self.rec_dk + self.rec_heads * self.rec_dv
    if self.recurrent == "mamba2":
      return self.rec_heads * self.rec_dv + 2 * self.rec_groups * self.rec_dk
    return 2 * self.d_model + 2 * self.ssm_state_dim

  @property
  def state_bytes_per_layer(self) -> int:
    """One recurrent layer's checkpoint (temporal state + conv state) in bytes."""
    if self.recurrent == "marconi_ssm":
      d, n = self.d_model, self.ssm_state_dim
      return d * n * 2 + (2 * d + 2 * n) * 4 * 2
    temporal = self.rec_heads * self.rec_dk * self.rec_dv * self.state_dtype_bytes
    return temporal + (self.conv_kernel - 1) * self.conv_dim * self.conv_dtype_bytes

  @property
  def state_bytes(self) -> int:
    """One checkpoint of every recurrent layer, in bytes."""
    return self.n_recurrent * self.state_bytes_per_layer

  def vllm_block_size(self, checkpoint_alignment: int | None = None) -> int:
    """The attention block size vLLM 0.33 picks by page equality (module docstring).

    `checkpoint_alignment` overrides `vllm_checkpoint_alignment` (1: Triton GDN, Mamba2).
    Models without recurrent layers keep vLLM's default block, 16.
    """
    align = self.vllm_checkpoint_alignment if checkpoint_alignment is None else checkpoint_alignment
    if isinstance(align, bool) or not isinstance(align, int) or align < 1:
      raise ValueError(f"checkpoint_alignment must be an integer >= 1, got {align!r}")
    if not self.n_recurrent:
      return VLLM_DEFAULT_BLOCK
    a = math.lcm(VLLM_KERNEL_BLOCK, align)
    page_1 = self.kv_bytes_per_token_per_layer
    b = a * -(-self.state_bytes_per_layer // (a * page_1))
    return VLLM_KERNEL_BLOCK * -(-b // VLLM_KERNEL_BLOCK)

  def vllm_page_padding(self, block_size: int | None = None) -> float:
    """Share of vLLM's recurrent page that is padding at `block_size` (default: vLLM's)."""
    b = self.vllm_block_size() if block_size is None else block_size
    page = b * self.kv_bytes_per_token_per_layer
    return 1.0 - self.state_bytes_per_layer / page if self.n_recurrent else 0.0

  def kv_bytes(self, tokens):
    """Full-attention KV bytes of `tokens` tokens (int or int array)."""
    return self.kv_bytes_per_token * tokens

  # ---- FLOPs (forward, L tokens from scratch; works on ints and int64 arrays) ----
  def attn_flops(self, L):
    """One full-attention layer over L tokens."""
    if self.flops_style == "marconi":
      d = self.d_model
      return 8 * L * d**2 + 4 * L**2 * d
    return self._attn(L, L)

  def swa_flops(self, L):
    if self.flops_style == "marconi":
      return self.attn_flops(L)
    w = np.minimum(L, self.swa_window) if isinstance(L, np.ndarray) else min(L, self.swa_window)
    return self._attn(L, w)

  def _attn(self, L, ctx):
    d, hq, hkv, hd = self.d_model, self.q_heads, self.kv_heads, self.head_dim
    q_out = 2 * hq if self.attn_output_gate else hq  # query (+ gate) rows of q_proj, in heads
    return 2 * L * d * (q_out + 2 * hkv) * hd + 2 * L * hq * hd * d + 4 * L * ctx * hq * hd

  def mlp_flops(self, L):
    if self.flops_style == "marconi":
      return 16 * L * self.d_model**2
    return 2 * L * self.d_model * self.d_ff * self.mlp_matrices

  def moe_flops(self, L):
    """One sparse MoE layer over L tokens, active parameters only (module docstring)."""
    m = self.moe_matrices
    per_token = (
      self.moe_experts
      + self.moe_top_k * self.moe_d_ff * m
      + self.moe_shared_d_ff * m
      + int(self.moe_shared_gate)
    )
    return 2 * L * self.d_model * per_token

  def recurrent_flops(self, L):
    """One recurrent layer over L tokens (linear in L)."""
    d = self.d_model
    if self.recurrent == "marconi_ssm":
      n = self.ssm_state_dim
      return 12 * L * d**2 + 16 * L * d * n + 10 * L * d
    k, cd = self.conv_kernel, self.conv_dim
    if self.recurrent == "gdn":
      hv, dk, dv = self.rec_heads, self.rec_dk, self.rec_dv
      return (
        2 * L * d * (cd + hv * dv + 2 * hv)
        + 2 * L * hv * dv * d
        + 2 * k * cd * L
        + 6 * L * hv * dk * dv
      )
    h, n, p, g = self.rec_heads, self.rec_dk, self.rec_dv, self.rec_groups
    di = h * p
    return (
      2 * L * d * (2 * di + 2 * g * n + h) + 2 * L * di * d + 2 * k * cd * L + 6 * L * h * p * n
    )

  def prefill_flops(self, L):
    """All layers over L tokens: what a hit of L tokens saves (Marconi's per-request sum)."""
    return (
      self.n_recurrent * self.recurrent_flops(L)
      + self.n_attn * self.attn_flops(L)
      + self.n_swa * self.swa_flops(L)
      + self.n_mlp * self.mlp_flops(L)
      + self.n_moe * self.moe_flops(L)
    )

  def ttft_ms(self, L):
    """Simulated TTFT of a prefill of L uncached tokens (Marconi's grid + fitted line)."""
    s = np.minimum(50 * (np.asarray(L, np.int64) // 50) + 50, 31_950)
    return self.ttft_intercept_ms + self.ttft_slope_ms * s

  def step_ms(self, tokens: int) -> float:
    """One engine step computing `tokens` tokens (all requests of the step): the TTFT line's
    intercept + slope * tokens, without `ttft_ms`'s 50-token grid and cap."""
    return self.ttft_intercept_ms + self.ttft_slope_ms * tokens


MODELS: dict[str, CostModel] = {
  # Marconi's default: NVIDIA Attention-Mamba2 hybrid 7B (24 SSM, 4 attention, 28 MLP layers).
  "marconi_7b": CostModel(
    name="marconi_7b",
    d_model=4096,
    n_attn=4,
    n_recurrent=24,
    n_mlp=28,
    recurrent="marconi_ssm",
    q_heads=32,
    kv_heads=32,
    head_dim=128,
    ssm_state_dim=128,
    flops_style="marconi",
  ),
  # Qwen3.5-0.8B-like: 24 layers (18 GDN / 6 attention), GDN Hk 16 / Hv 16, d 128, conv 6144.
  "qwen3_5_0_8b": CostModel(
    name="qwen3_5_0_8b",
    d_model=1024,
    n_attn=6,
    n_recurrent=18,
    n_mlp=24,
    recurrent="gdn",
    q_heads=8,
    kv_heads=2,
    head_dim=256,
    rec_heads=16,
    rec_dk=128,
    rec_dv=128,
    rec_groups=16,
    d_ff=3584,
  ),
  # Qwen3.5-9B-like: 32 layers (24 GDN / 8 attention), GDN Hk 16 / Hv 32, d 128, conv 8192.
  "qwen3_5_9b": CostModel(
    name="qwen3_5_9b",
    d_model=4096,
    n_attn=8,
    n_recurrent=24,
    n_mlp=32,
    recurrent="gdn",
    q_heads=16,
    kv_heads=4,
    head_dim=256,
    rec_heads=32,
    rec_dk=128,
    rec_dv=128,
    rec_groups=16,
    d_ff=12288,
  ),
  # Nemotron-H-8B-like: 24 Mamba2 + 4 attention + 24 MLP, H 128, P 64, N 128, G 8.
  "nemotron_h_8b": CostModel(
    name="nemotron_h_8b",
    d_model=4096,
    n_attn=4,
    n_recurrent=24,
    n_mlp=24,
    recurrent="mamba2",
    q_heads=32,
    kv_heads=8,
    head_dim=128,
    rec_heads=128,
    rec_dk=128,
    rec_dv=64,
    rec_groups=8,
    d_ff=21504,
    mlp_matrices=2,
  ),
  # Qwen3.5-4B-like (`qwen3_5_like`; reference/kernels.md §GDN table and its Qwen3.5-4B-derived
  # config: 32 layers, full attention every 4th -> 24 GDN / 8 attention, hidden 2560,
  # intermediate 9216, GDN Hk 16 / Hv 32, dk = dv = 128, conv 4, `mamba_ssm_dtype: float32`
  # (vLLM's Qwen3_5 config hook takes it: fp32 state, bf16 conv), attention 16 Q / 4 KV heads of
  # 256). One GDN layer: 32*128*128*4 + 3*8192*2 = 2,146,304 B; one attention layer's KV 4,096
  # B/token. vLLM block: 576 with FlashInfer's GDN prefill (Hopper, align mode: checkpoint
  # alignment 64, `vllm_checkpoint_alignment`), 528 with Triton's (vLLM #40696's figure).
  # Assumption: the MLP is dense SwiGLU in every layer (3 matrices), as the 0.8B/9B configs.
  "qwen3_5_like": CostModel(
    name="qwen3_5_like",
    d_model=2560,
    n_attn=8,
    n_recurrent=24,
    n_mlp=32,
    recurrent="gdn",
    q_heads=16,
    kv_heads=4,
    head_dim=256,
    rec_heads=32,
    rec_dk=128,
    rec_dv=128,
    rec_groups=16,
    d_ff=9216,
    vllm_checkpoint_alignment=64,
  ),
  # Nemotron-H-8B-like (`nemotron_h_like`; reference/kernels.md §4.2: Mamba2 H 128, P 64, N 128,
  # G 8; the same shapes as `nemotron_h_8b`: 52 layers = 24 Mamba2 + 4 attention (32 Q / 8 KV
  # heads of 128) + 24 squared-ReLU MLPs (2 matrices, 21,504 wide), hidden 4096, conv 4,
  # d_inner 8192). vLLM keeps the SSM state in fp32 for NemotronH (`NemotronHForCausalLMConfig`
  # DEFAULT_MAMBA_SSM_CACHE_DTYPE) and the conv state in the model dtype (bf16). One Mamba2 layer:
  # 128*64*128*4 + 3*(8192 + 2*8*128)*2 = 4,255,744 B; one attention layer 4,096 B/token; vLLM
  # block 16 * cdiv(4,255,744, 16 * 4,096) = 1,040 (Mamba2 declares no checkpoint alignment).
  "nemotron_h_like": CostModel(
    name="nemotron_h_like",
    d_model=4096,
    n_attn=4,
    n_recurrent=24,
    n_mlp=24,
    recurrent="mamba2",
    q_heads=32,
    kv_heads=8,
    head_dim=128,
    rec_heads=128,
    rec_dk=128,
    rec_dv=64,
    rec_groups=8,
    d_ff=21504,
    mlp_matrices=2,
  ),
  # Gemma-3-4B-like: 34 layers, 5 sliding-window (1024) : 1 full, GQA 8 / 4, head_dim 256.
  "gemma3_4b": CostModel(
    name="gemma3_4b",
    d_model=2560,
    n_attn=6,
    n_swa=28,
    swa_window=1024,
    n_recurrent=0,
    n_mlp=34,
    recurrent="none",
    q_heads=8,
    kv_heads=4,
    head_dim=256,
    d_ff=10240,
  ),
}


def get_model(name: str) -> CostModel:
  """The preset `name`; ValueError listing the presets otherwise."""
  if name not in MODELS:
    raise ValueError(f"model must be one of {sorted(MODELS)}, got {name!r}")
  return MODELS[name]
