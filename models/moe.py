"""The sparse mixture-of-experts feed-forward block (`MoE`) and its routing rule (`route`).

The layers of `ModelConfig.moe_layers` replace their MLP by, for each token t of x [T, d]:

  y_t = sum_{j < k} w[t, j] * expert_{e[t, j]}(x_t) + shared(x_t) [* sigmoid(x_t . g)]

where `route` picks k of the E experts e[t] with weights w[t] from the router's logits
x_t @ W_r [E]. An expert is the model's MLP at width I = `moe_hidden` (`mlp_activation`,
`mlp_gated`): down(act(gate(x)) * up(x)) (Qwen: SwiGLU) or down(act(up(x))) (Nemotron-H: relu2,
no gate); the shared expert is the same MLP at `moe_shared_hidden`, run by every token, with
Qwen's sigmoid gate when `moe_shared_gate`.

Routing, as transformers 5's modeling files (the reference semantics; `route`):

  softmax (`Qwen3NextTopKRouter`, `Qwen3_5MoeTopKRouter`): logits in the model dtype,
    p = softmax(logits) in fp32, e = the k largest p, w = p[e], divided by sum(w) when
    `moe_norm_topk` (Qwen3.5-MoE always; Qwen3-Next's `norm_topk_prob`).
  sigmoid (`NemotronHTopkRouter`, DeepSeek-V3's rule): router weights and logits in fp32,
    s = sigmoid(logits), c = s + b (b = `e_score_correction_bias`, a per-expert bias used to
    choose experts only). With G = `moe_n_group` groups of E / G consecutive experts, a group
    scores the sum of its two largest c, and only the experts of the `moe_topk_group` best
    groups stay candidates; e = the k largest c among them, w = s[e] (without b), divided by
    sum(w) + 1e-20 when `moe_norm_topk`, times `moe_scaling` (`routed_scaling_factor`).

Dispatch is sparse and capacity-free (no token is dropped, however unbalanced the routing):
the T*k (token, j) assignments are sorted by expert and laid out in tiles of R rows, each tile
holding rows of a single expert (expert e's n_e rows fill ceil(n_e / R) tiles, the last one
padded with a zero row); a `lax.scan` over the tiles runs each tile's [R, d] @ [d, I] matmuls with
that tile's expert weights. The rows computed are at most T*k + min(E, T*k) * (R - 1), with
R = `tile_rows(T*k, E)` (about T*k / E, a power of two <= 128), against E * T for "every expert on
every token, then mask". The outputs are gathered back to (token, j) order and summed over j in
that order (a gather, not a scatter-add), so the order of a token's sum never depends on the
other tokens of the step.

Why tiles and not `jax.lax.ragged_dot` (sort by expert + grouped matmul) by default: in jax
0.10.2 ragged_dot's CPU lowering expands the sorted operand to [E, T*k, d] under a group mask,
i.e. the dense computation (E times the work; seen in the compiled HLO: 1,024 tokens, 64 experts,
top 8, d 512, I 256 take 1.97 s against 0.10 s with the tiles on the 2-core CPU), and its GPU
lowering could not be checked here. It remains available as `method="ragged_dot"` (the grouped
matmul TPUs lower natively), tested equal to the tiles.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers
from models.config import ModelConfig

METHODS = ("tiles", "ragged_dot")
MAX_TILE_ROWS = 128


def tile_rows(num_assignments: int, num_experts: int) -> int:
  """Rows R of a dispatch tile: the largest power of two <= max(1, A // E), at most 128.

  R near the mean rows per expert keeps the padding (< R rows per expert used) about the size
  of the real work when the routing is balanced, and a tile's matmul large enough to be a
  matmul; decode steps (A < E) take R = 1: no padding at all.
  """
  per_expert = max(1, num_assignments // num_experts)
  return min(MAX_TILE_ROWS, 1 << (per_expert.bit_length() - 1))


def num_tiles(num_assignments: int, num_experts: int, rows: int) -> int:
  """Static bound on the tiles a dispatch of A assignments over E experts fills: the
  sum over the (at most min(E, A)) experts used of ceil(n_e / R) <= (A + min(E, A) (R - 1)) / R."""
  return (num_assignments + min(num_experts, num_assignments) * (rows - 1)) // rows


def route(logits: jax.Array, cfg: ModelConfig, bias: jax.Array | None = None):
  """The experts and weights of each token (rules in the module docstring).

  Args:
    logits: [T, E] router logits (any float dtype; computed on in fp32).
    cfg: the model config (`moe_router`, `moe_top_k`, `moe_norm_topk`, groups, scaling).
    bias: f32[E] the sigmoid router's selection bias (None = 0).
  Returns:
    (weights f32[T, k], experts int32[T, k]); experts in decreasing order of the choice score.
  """
  k = cfg.moe_top_k
  logits = logits.astype(jnp.float32)
  if cfg.moe_router == "softmax":
    probs = jax.nn.softmax(logits, axis=-1)
    weights, experts = jax.lax.top_k(probs, k)
    if cfg.moe_norm_topk:
      weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights * cfg.moe_scaling, experts
  scores = jax.nn.sigmoid(logits)
  choice = scores if bias is None else scores + bias.astype(jnp.float32)
  t, e = choice.shape
  groups = cfg.moe_n_group
  if groups > 1:
    per = e // groups
    group_score = jnp.sum(jax.lax.top_k(choice.reshape(t, groups, per), 2)[0], axis=-1)
    _, best = jax.lax.top_k(group_score, cfg.moe_topk_group)  # [T, topk_group]
    keep = jnp.zeros((t, groups), bool).at[jnp.arange(t)[:, None], best].set(True)
    choice = jnp.where(jnp.repeat(keep, per, axis=1), choice, -jnp.inf)
  _, experts = jax.lax.top_k(choice, k)
  weights = jnp.take_along_axis(scores, experts, axis=-1)
  if cfg.moe_norm_topk:
    weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
  return weights * cfg.moe_scaling, experts


class MoE(nnx.Module):
  """Router + E routed experts + optional shared expert (module docstring).

  Parameters (E experts, width I, d = d_model): router.kernel [d, E] (fp32 for the sigmoid
  router, as Nemotron-H keeps it), score_bias f32[E] (sigmoid router only), w_gate [E, d, I]
  (gated experts only), w_up [E, d, I], w_down [E, I, d]; shared (a `layers.MLP`) and
  shared_gate.kernel [d, 1] when configured.

  `moe(x)` maps [T, d] -> [T, d] in x's dtype; routing weights and the sum over a token's k
  experts are fp32.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, e, i, dt = cfg.d_model, cfg.moe_num_experts, cfg.moe_hidden, cfg.dtype
    self.cfg = cfg
    sigmoid = cfg.moe_router == "sigmoid"
    self.router = layers.linear(d, e, "float32" if sigmoid else dt, rngs)
    self.score_bias = nnx.Param(jnp.zeros((e,), jnp.float32)) if sigmoid else None
    w_in = layers.dense_init(d)
    self.w_gate = nnx.Param(w_in(rngs.params(), (e, d, i), dt)) if cfg.mlp_gated else None
    self.w_up = nnx.Param(w_in(rngs.params(), (e, d, i), dt))
    self.w_down = nnx.Param(layers.dense_init(i)(rngs.params(), (e, i, d), dt))
    s = cfg.moe_shared_hidden
    self.shared = (
      layers.MLP(d, s, dt, rngs, activation=cfg.mlp_activation, gated=cfg.mlp_gated) if s else None
    )
    self.shared_gate = layers.linear(d, 1, dt, rngs) if cfg.moe_shared_gate else None

  def __call__(self, x: jax.Array, *, method: str = "tiles") -> jax.Array:
    """y [T, d] for x [T, d]; `method`: "tiles" (default) or "ragged_dot" (module docstring)."""
    if method not in METHODS:
      raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    cfg = self.cfg
    h = x.astype(jnp.float32) if cfg.moe_router == "sigmoid" else x
    bias = None if self.score_bias is None else self.score_bias[...]
    weights, experts = route(self.router(h), cfg, bias)
    per = self._experts(x, experts, method)  # [T, k, d]: output of the token's j-th expert
    out = weights[:, 0, None] * per[:, 0].astype(jnp.float32)
    for j in range(1, cfg.moe_top_k):  # a fixed order over j: per-token results
      out = out + weights[:, j, None] * per[:, j].astype(jnp.float32)
    y = out.astype(x.dtype)
    if self.shared is not None:
      shared = self.shared(x)
      if self.shared_gate is not None:
        gate = jax.nn.sigmoid(self.shared_gate(x).astype(jnp.float32))
        shared = (gate * shared.astype(jnp.float32)).astype(x.dtype)
      y = y + shared
    return y

  def _ffn(self, x: jax.Array, w_gate, w_up, w_down, ffn_dot) -> jax.Array:
    act = layers.ACTIVATIONS[self.cfg.mlp_activation]
    up = ffn_dot(x, w_up)
    hidden = act(up) if w_gate is None else act(ffn_dot(x, w_gate)) * up
    return ffn_dot(hidden, w_down)

  def _experts(self, x: jax.Array, experts: jax.Array, method: str) -> jax.Array:
    """[T, k, d]: each (token, j) assignment's expert output, computed grouped by expert."""
    t, k = experts.shape
    e, a = self.cfg.moe_num_experts, t * k
    flat = experts.reshape(a)
    order = jnp.argsort(flat, stable=True)  # assignments grouped by expert
    counts = jnp.bincount(flat, length=e)  # int32[E] rows of each expert
    sorted_experts = flat[order]
    gate = None if self.w_gate is None else self.w_gate[...]
    up, down = self.w_up[...], self.w_down[...]
    if method == "ragged_dot":
      xs = x[order // k]

      def grouped(lhs, w):
        return jax.lax.ragged_dot(lhs, w, counts)

      ys = self._ffn(xs, gate, up, down, grouped)  # [A, d] in sorted order
      slot = jnp.zeros(a, jnp.int32).at[order].set(jnp.arange(a, dtype=jnp.int32))
      return ys[slot].reshape(t, k, -1)
    rows = tile_rows(a, e)
    n = num_tiles(a, e, rows)
    tiles = (counts + rows - 1) // rows
    tile_end = jnp.cumsum(tiles)  # expert e owns tiles [tile_end[e] - tiles[e], tile_end[e])
    row_first = jnp.cumsum(counts) - counts
    rank = jnp.arange(a, dtype=jnp.int32) - row_first[sorted_experts]
    slot_sorted = (tile_end - tiles)[sorted_experts] * rows + rank
    slot = jnp.zeros(a, jnp.int32).at[order].set(slot_sorted)  # slot of assignment (t, j)
    token_of_slot = jnp.full((n * rows,), t, jnp.int32).at[slot].set(jnp.arange(a) // k)
    tile_expert = jnp.minimum(jnp.searchsorted(tile_end, jnp.arange(n), side="right"), e - 1)
    padded = jnp.concatenate([x, jnp.zeros((1, x.shape[1]), x.dtype)])  # row t: padding
    xs = padded[token_of_slot].reshape(n, rows, -1)

    def tile(carry, inputs):
      xt, ex = inputs
      w_g = None if gate is None else gate[ex]
      return carry, self._ffn(xt, w_g, up[ex], down[ex], jnp.matmul)

    _, ys = jax.lax.scan(tile, None, (xs, tile_expert))
    return ys.reshape(n * rows, -1)[slot].reshape(t, k, -1)
