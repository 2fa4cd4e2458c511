"""Pure-JAX paged attention (vectorised gather + dense masked softmax in fp32) and KV writes.

Shapes (shared by every implementation):
  q:               [T, H_q, D] queries of a ragged batch, packed by sequence.
  k_pages/v_pages: [num_blocks, block_size, H_kv, D]; H_q is a multiple of H_kv (GQA: query head
                   ``h`` reads kv head ``h // (H_q // H_kv)``).
  block_tables:    int32[N, max_blocks]; position ``p`` of sequence ``n`` lives in block
                   ``block_tables[n, p // block_size]`` at offset ``p % block_size``. Blocks holding
                   no attended position (outside the window, past the end) are never read, so they
                   may be the null block 0.
  seq_lens:        int32[N] tokens in each sequence including this step's queries.
  query_start_loc: int32[N+1]; sequence ``n`` owns rows ``[qsl[n], qsl[n+1])`` of ``q``; they are
                   its LAST ``q_len`` positions ``seq_len - q_len .. seq_len - 1``.
Semantics: causal; with ``window=W`` a query at position ``p`` attends keys in ``(p-W, p]``;
scores ``scale * q.k`` (default ``D**-0.5``), softmax and accumulation in fp32, output in q's dtype.
Rows past ``qsl[N]`` (padding) are zero.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_HIGHEST = jax.lax.Precision.HIGHEST
_GATHER_BUDGET_BYTES = 64 * 1024 * 1024


def token_positions(query_start_loc, seq_lens, num_tokens):
  """Per query row: ``(seq_id, position, valid)`` (seq_id clamped to [0, N) for invalid rows)."""
  n = seq_lens.shape[0]
  t = jnp.arange(num_tokens, dtype=jnp.int32)
  seq = jnp.searchsorted(query_start_loc[1:], t, side="right").astype(jnp.int32)
  valid = t < query_start_loc[n]
  seq = jnp.minimum(seq, n - 1)
  q_len = query_start_loc[seq + 1] - query_start_loc[seq]
  pos = seq_lens[seq] - q_len + (t - query_start_loc[seq])
  return seq, pos, valid


def num_key_blocks(block_size: int, max_blocks: int, window: int | None) -> int:
  """Blocks gathered per query row: all of them, or enough to cover a window of W keys."""
  if window is None:
    return max_blocks
  return min(max_blocks, (window - 1) // block_size + 2)


def paged_attention_reference(
  q,
  k_pages,
  v_pages,
  block_tables,
  seq_lens,
  query_start_loc=None,
  *,
  window=None,
  scale=None,
  layer=None,
):
  """Paged attention by gathering each query row's keys; see the module docstring. `layer`:
  the pages are stacked [L, num_blocks, ...] and layer `layer`'s are gathered directly."""
  num_tokens, num_q_heads, head_dim = q.shape
  _, block_size, num_kv_heads, _ = k_pages.shape[-4:]
  lead = () if layer is None else (layer,)
  max_blocks = block_tables.shape[1]
  group = num_q_heads // num_kv_heads
  if query_start_loc is None:
    query_start_loc = jnp.arange(seq_lens.shape[0] + 1, dtype=jnp.int32)
  scale = head_dim**-0.5 if scale is None else scale
  seq, pos, valid = token_positions(
    jnp.asarray(query_start_loc, jnp.int32), jnp.asarray(seq_lens, jnp.int32), num_tokens
  )
  nkb = num_key_blocks(block_size, max_blocks, window)
  nkeys = nkb * block_size
  # Rows per gather tile so one tile's gathered K and V stay within the budget.
  per_row = 2 * nkeys * num_kv_heads * head_dim * 4
  tile = int(max(1, min(num_tokens, _GATHER_BUDGET_BYTES // per_row)))
  num_tiles = -(-num_tokens // tile)
  pad = num_tiles * tile - num_tokens

  def padded(x):
    return jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)).reshape(num_tiles, tile, *x.shape[1:])

  block_tables = jnp.asarray(block_tables, jnp.int32)
  qg = q.reshape(num_tokens, num_kv_heads, group, head_dim)

  def one_tile(args):
    qt, st, pt, vt = args  # [tile, H_kv, G, D], [tile], [tile], [tile]
    if window is None:
      first = jnp.zeros_like(pt)
    else:
      first = jnp.clip(jnp.maximum(pt - window + 1, 0) // block_size, 0, max_blocks - nkb)
    blk_idx = first[:, None] + jnp.arange(nkb, dtype=jnp.int32)[None]  # [tile, nkb]
    blocks = jnp.take_along_axis(block_tables[st], blk_idx, axis=1)
    kpos = (blk_idx[:, :, None] * block_size + jnp.arange(block_size)[None, None]).reshape(
      tile, nkeys
    )
    k = k_pages[(*lead, blocks)].reshape(tile, nkeys, num_kv_heads, head_dim).astype(jnp.float32)
    v = v_pages[(*lead, blocks)].reshape(tile, nkeys, num_kv_heads, head_dim).astype(jnp.float32)
    s = jnp.einsum("thgd,tkhd->thgk", qt.astype(jnp.float32), k, precision=_HIGHEST) * scale
    mask = kpos <= pt[:, None]
    if window is not None:
      mask &= kpos > (pt[:, None] - window)
    mask &= vt[:, None]
    # Zero unattended values: stale pages may hold NaN/Inf and 0 * NaN would leak into the sum.
    v = jnp.where(mask[:, :, None, None], v, 0.0)
    mask = mask[:, None, None, :]
    s = jnp.where(mask, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.where(mask, jnp.exp(s - m), 0.0)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    o = jnp.einsum("thgk,tkhd->thgd", p, v, precision=_HIGHEST)
    return o / jnp.where(denom > 0, denom, 1.0)

  out = jax.lax.map(one_tile, (padded(qg), padded(seq), padded(pos), padded(valid)))
  out = out.reshape(num_tiles * tile, num_q_heads, head_dim)[:num_tokens]
  return out.astype(q.dtype)


def write_kv_reference(k_pages, v_pages, k, v, slot_mapping, layer=None):
  """Scatters ``k, v [T, H_kv, D]`` to flat slots ``block * block_size + offset``; -1 skips.

  Slots out of range are skipped as well. Returns ``(k_pages, v_pages)``; in place when the
  caller donates the pages to its ``jit``. With ``layer`` (a static int) the pages are the
  stacked ``[L, num_blocks, B, H_kv, D]`` of every layer and layer ``layer``'s are written in
  place (no copy of the layer's pages out and back).
  """
  lead = () if layer is None else (layer,)
  num_blocks, block_size = k_pages.shape[len(lead) : len(lead) + 2]
  total = num_blocks * block_size
  slot = jnp.asarray(slot_mapping, jnp.int32)
  slot = jnp.where((slot >= 0) & (slot < total), slot, total)
  blk, off = slot // block_size, slot % block_size

  def scatter(pages, x):
    return pages.at[(*lead, blk, off)].set(x.astype(pages.dtype), mode="drop")

  return scatter(k_pages, k), scatter(v_pages, v)
