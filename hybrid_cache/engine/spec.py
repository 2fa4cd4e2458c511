"""Speculative decoding in the engine: config checks, the verify step and its state commits.

A decoding request with a drafter (`hybrid_cache.engine.drafter`) runs one *verify window*
per step instead of one token: its last sampled token t at position p (not yet computed) and
up to k = `CacheConfig.num_speculative_tokens` draft tokens d_1..d_k at positions p+1..p+k.
One forward of the target over all windows (S = k + 1 tokens each, shorter windows padded)
gives the greedy token after every window position and, from the multi-token verify kernels
(`gated_delta_rule_verify`, `ssd_verify`, `short_conv.verify_conv`), the recurrent and conv
state after every position. Greedy acceptance: a = the number of leading drafts equal to the
target's greedy tokens; the request emits d_1..d_a and the target's token after d_a (a + 1
tokens) and has computed p..p+a.

Where things go (B = block size, c = the block column of p, b = (c + 1) * B):
  * Recurrent state: the state after p + a + 1 tokens (index a of the window; the conv
    window is the verify input shifted by a + 1 rows) goes to the request's private *carry*
    slot (a pool id >= `CacheConfig.pool_size`, never handed out by the core), which the
    next window reads. In mode `align`, when the accepted tokens reach the block boundary b
    (p + 1 <= b <= p + a + 1), the state after exactly b tokens (window index b - p - 1) is
    also written to the core's state block of column c: that is the block whose hash the core
    registers for [0, b) (vLLM's post-forward copy §5.3 picks the same per-token state,
    `hybrid_cache.twin.rules.post_forward_copy`; here the verify step writes it directly).
    Requires k < B, so a window crosses at most one boundary.
  * K/V: window positions in column c are written to the core's block; positions >= b go to
    the request's private page (same private id), because the core allocated blocks only
    through p. Once the core gives column c + 1 a block, the private page is copied there
    (`copy_kv_pages`) before any forward of that step.
  * The core's view: only verified tokens are appended (`append_tokens`), so the core runs one
    step behind the engine: its next schedule covers the accepted drafts and the new last
    token ("catch-up" tokens the engine has already computed: no model work for them), which
    allocates their blocks and registers their hashes exactly as for ordinary decoding. The
    core's block-aligned split may cut such a catch-up at a block boundary; the window then
    waits one step.

Drafters that do not read the target's hidden states run like vLLM's non-EAGLE speculators:
no EAGLE lookup drop or window shift (`use_eagle` must be False). Mode `all` has no vLLM
rule with speculation and is refused. Drafting never writes the target's pools.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hybrid_cache.config import CacheConfig
from hybrid_cache.engine import model_step
from hybrid_cache.engine.drafter import Drafter
from models.cache import ModelCache
from models.config import ModelConfig
from models.step_inputs import StepInputs


def check_speculative(
  model: ModelConfig, cache: CacheConfig, drafter: Drafter | None, mode: str | None
) -> int:
  """Returns k (0 = no speculation); ValueError naming the field for a config that cannot run.

  Rules: a drafter needs num_speculative_tokens k in [1, block_size) (one block boundary per
  verify window at most) and its vocab_size equal to the model's; without a drafter k must be
  0; use_eagle must be False (these drafters do not read the target's hidden states); the
  recurrent mode must not be `all` (vLLM defines no speculative rule for it).
  """
  k = cache.num_speculative_tokens
  if drafter is None:
    if k:
      raise ValueError(
        f"num_speculative_tokens must be 0 without a drafter (pass Engine(drafter=...)), got {k}"
      )
    return 0
  vocab = getattr(drafter, "vocab_size", None)
  if vocab != model.vocab_size:
    raise ValueError(
      f"drafter.vocab_size must equal the model's vocab_size={model.vocab_size}, got {vocab!r}"
    )
  if not callable(getattr(drafter, "propose", None)) or not callable(
    getattr(drafter, "record", None)
  ):
    raise ValueError("drafter must have propose(tokens, k) and record(tokens) methods")
  if k < 1:
    raise ValueError(f"num_speculative_tokens must be >= 1 with a drafter, got {k}")
  if k >= cache.block_size:
    raise ValueError(
      f"num_speculative_tokens must be < block_size={cache.block_size} (a verify window may "
      f"cross at most one block boundary), got {k}"
    )
  if cache.use_eagle:
    raise ValueError(
      "use_eagle must be False with this drafter: it does not read the target's hidden "
      "states, so vLLM's EAGLE cache rules (dropped block, window shift) do not apply"
    )
  if mode == "all":
    raise ValueError(
      "cache_config.groups[].mode 'all' cannot be combined with num_speculative_tokens > 0: "
      "vLLM defines no rule for it; use mode 'align' or 'none'"
    )
  return k


def check_proposal(draft: Sequence[int], k: int, vocab: int) -> list[int]:
  """The drafter's answer as a list of at most k ints in [0, vocab) (ValueError otherwise)."""
  try:
    out = [int(t) for t in draft]
  except (TypeError, ValueError):
    raise ValueError(f"drafter.propose must return a sequence of ints, got {draft!r:.80}") from None
  if len(out) > k:
    raise ValueError(f"drafter.propose returned {len(out)} tokens, must be <= k={k}")
  bad = [t for t in out if not 0 <= t < vocab]
  if bad:
    raise ValueError(f"drafter.propose returned token {bad[0]}; must be in [0, {vocab})")
  return out


def boundary_commit(start: int, block_size: int) -> tuple[int, int]:
  """(column, window index) of the block-boundary state a window starting at `start` may commit.

  The boundary b = (start // B + 1) * B; its state (after b tokens, window index b - start - 1)
  belongs to the core's state block in column start // B and is committed iff the accepted
  count a >= that index. This is vLLM's post-forward copy (§5.3,
  `hybrid_cache.twin.rules.post_forward_copy` with num_computed = start, num_scheduled = 1 + k,
  num_draft = k, num_accepted = a + 1): dest = column, bias = window index.
  """
  col = start // block_size
  return col, (col + 1) * block_size - start - 1


@dataclasses.dataclass
class Window:
  """One request's verify window (host side).

  Attributes:
    tokens: the last sampled token, then the drafts (1 + num_drafts tokens).
    start: position of tokens[0] (= tokens the engine has computed).
    tables: per cache group, the block table to use (private page patched in).
    state_read: per recurrent group, the pool id holding the state after `start` tokens.
    carry: the request's private pool id (receives the state after the accepted position).
    boundary_blocks: per recurrent group, the core block receiving the state at the next
      block boundary if the accepted tokens reach it (-1 = none).
    boundary_offset: window index of the token completing that boundary (-1 = none).
  """

  tokens: list[int]
  start: int
  tables: list[list[int]]
  state_read: list[int]
  carry: int
  boundary_blocks: list[int]
  boundary_offset: int


def build_verify_inputs(
  cfg: ModelConfig,
  windows: Sequence[Window],
  block_size: int,
  *,
  window: int,
  pad_seqs: int,
  max_blocks: int,
) -> tuple[StepInputs, dict[str, np.ndarray]]:
  """Packs windows into uniform [N * S] `StepInputs` (+ the commit arrays for `verify_step`).

  Every window occupies S = `window` rows; rows past its tokens and padding windows (up to
  `pad_seqs`) write no K/V (slot -1) and read no state; their outputs are ignored. Returns
  (inputs, arrays) with arrays: drafts int32[N, S-1], num_drafts int32[N], carry int32[R, N],
  boundary int32[R, N], boundary_offset int32[N].
  """
  groups = cfg.cache_groups
  rows = cfg.num_recurrent_rows
  n, s = pad_seqs, window
  tokens = np.zeros((n, s), np.int32)
  positions = np.zeros((n, s), np.int32)
  seq_lens = np.full((n,), s, np.int32)
  tables = [np.zeros((n, max_blocks), np.int32) for _ in groups]
  slots = [np.full((n, s), -1, np.int32) for _ in groups]
  read = np.full((rows, n), -1, np.int32)
  carry = np.full((rows, n), -1, np.int32)
  boundary = np.full((rows, n), -1, np.int32)
  offset = np.full((n,), -1, np.int32)
  drafts = np.zeros((n, s - 1), np.int32)
  num_drafts = np.zeros((n,), np.int32)
  for i, w in enumerate(windows):
    m = len(w.tokens)
    tokens[i, :m] = w.tokens
    positions[i] = w.start + np.arange(s)
    seq_lens[i] = w.start + s
    drafts[i, : m - 1] = w.tokens[1:]
    num_drafts[i] = m - 1
    for g, kind in enumerate(groups):
      row = w.tables[g][:max_blocks]
      tables[g][i, : len(row)] = row
      if kind == "mamba":
        continue
      for j in range(m):
        p = w.start + j
        slots[g][i, j] = row[p // block_size] * block_size + p % block_size
    read[:, i] = w.state_read
    carry[:, i] = w.carry
    boundary[:, i] = w.boundary_blocks
    offset[i] = w.boundary_offset
  inputs = StepInputs(
    token_ids=jnp.asarray(tokens.reshape(-1)),
    positions=jnp.asarray(positions.reshape(-1)),
    query_start_loc=jnp.asarray(np.arange(n + 1, dtype=np.int32) * s),
    seq_lens=jnp.asarray(seq_lens),
    block_tables=tuple(jnp.asarray(t) for t in tables),
    slot_mapping=tuple(jnp.asarray(x.reshape(-1)) for x in slots),
    state_read=jnp.asarray(read),
    state_write=jnp.asarray(np.full((rows, n), -1, np.int32)),
    ckpt_write=jnp.zeros((rows, n, 0), jnp.int32),
  )
  arrays = dict(
    drafts=drafts, num_drafts=num_drafts, carry=carry, boundary=boundary, boundary_offset=offset
  )
  return inputs, arrays


def _scatter(pool: jax.Array, ids: jax.Array, vals: jax.Array) -> jax.Array:
  """pool [L, NB, *S]; ids int32[N] (-1 = skip); vals [L, N, *S]."""
  nb = pool.shape[1]
  ids = jnp.where(ids >= 0, ids, nb)
  return pool.at[:, ids].set(vals.astype(pool.dtype), mode="drop")


def greedy_accept(target: jax.Array, drafts: jax.Array, num_drafts: jax.Array) -> jax.Array:
  """Accepted drafts per window: leading i < num_drafts with drafts[:, i] == target[:, i].

  target int32[N, S] (greedy token after each window position), drafts int32[N, S-1].
  """
  s1 = drafts.shape[1]
  ok = (target[:, :s1] == drafts) & (jnp.arange(s1)[None, :] < num_drafts[:, None])
  return jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)


def commit_states(
  cfg: ModelConfig,
  cache: ModelCache,
  per_token: dict[str, tuple[jax.Array, jax.Array]],
  accepted: jax.Array,
  carry: jax.Array,
  boundary: jax.Array,
  boundary_offset: jax.Array,
) -> ModelCache:
  """Writes the state after the accepted position to `carry` and, when the accepted tokens
  reach it, the state at the block boundary to `boundary` (see module docstring)."""
  n = accepted.shape[0]
  rows = jnp.arange(n)
  reach = (boundary_offset >= 0) & (boundary_offset <= accepted)
  b_idx = jnp.maximum(boundary_offset, 0)
  changes = {}
  for kind, s_name, c_name in model_step.FAMILIES:
    if kind not in per_token:
      continue
    r = cfg.recurrent_index(kind)
    states, windows = per_token[kind]
    b_ids = jnp.where(reach, boundary[r], -1)
    for name, vals in ((s_name, states), (c_name, windows)):
      pool = getattr(cache, name)
      pool = _scatter(pool, b_ids, vals[:, rows, b_idx])
      pool = _scatter(pool, carry[r], vals[:, rows, accepted])
      changes[name] = pool
  return cache.replace(**changes)


@functools.partial(jax.jit, donate_argnames=("cache",))
def copy_kv_pages(cache: ModelCache, src: jax.Array, dst: jax.Array) -> ModelCache:
  """K/V pages src[l, j] -> dst[l, j] for attention layer slot l (-1 = padding)."""
  nb = cache.k.shape[1]

  def one(pages):
    for layer in range(pages.shape[0]):
      ids = jnp.where(dst[layer] >= 0, dst[layer], nb)
      pages = pages.at[layer, ids].set(pages[layer, jnp.maximum(src[layer], 0)], mode="drop")
    return pages

  return cache.replace(k=one(cache.k), v=one(cache.v))


@functools.partial(
  jax.jit, static_argnames=("graphdef", "implementation", "window"), donate_argnames=("cache",)
)
def verify_step(
  graphdef,
  params,
  cache,
  copy_src,
  copy_dst,
  inputs,
  drafts,
  num_drafts,
  carry,
  boundary,
  boundary_offset,
  implementation,
  window,
):
  """Core state copies, verify forward, greedy acceptance, state commits.

  Returns (target int32[N, S], accepted int32[N], logits f32[N, S, V], cache).
  """
  cache = model_step.apply_copies(cache, copy_src, copy_dst, implementation)
  model = nnx.merge(graphdef, params)
  logits, cache, per_token = model.verify(
    cache, inputs, window=window, implementation=implementation
  )
  n = num_drafts.shape[0]
  logits = logits.reshape(n, window, -1)
  target = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  accepted = greedy_accept(target, drafts, num_drafts)
  cache = commit_states(model.cfg, cache, per_token, accepted, carry, boundary, boundary_offset)
  return target, accepted, logits, cache
