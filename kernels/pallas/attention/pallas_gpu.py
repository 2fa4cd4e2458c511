"""Pallas (GPU, Triton backend) paged attention for ragged prefill + decode batches.

Why not ``jax.experimental.pallas.ops.gpu.paged_attention``: it serves one decode query per
sequence, with pages laid out ``[H_kv, num_pages, page_size, D]`` and no sliding window; ours needs
ragged multi-token queries, windows and the ``[num_blocks, block_size, H_kv, D]`` layout shared with
the cache manager. ``decode_attention`` and ``attention``/``attention_mgpu`` there take dense
(unpaged) K/V. This kernel is the simple flash-attention form over pages:

* Queries are regrouped per kv head, ``[H_kv, T*G, D]`` (G = H_q / H_kv; row ``r`` = token
  ``r // G``, head ``r % G``), and split into query blocks of ``block_q`` tokens that never cross a
  sequence boundary. A small XLA prologue builds the block list (sequence, first row, rows, first
  position); the static grid is ``(cdiv(T, block_q) + N, H_kv)`` with empty blocks idle.
* Each program loops over key chunks of ``block_k`` positions (``block_k`` divides ``block_size``,
  so a chunk lies in one page) from the window start to its last query position, reading the page
  id from the block table; online softmax in fp32, ``acc`` in fp32 registers.
Triton constraints: ``D``, ``block_q * G`` and ``block_k`` powers of two, ``block_k >= 16``,
``block_q * G >= 16`` (``api`` checks these for ``implementation="pallas"``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

_M_INIT = -1e30


def pick_block_k(block_size: int, cap: int = 64) -> int:
  """Largest power of two dividing ``block_size``, at most ``cap``."""
  return min(cap, block_size & -block_size)


def pick_block_q(group: int, max_rows: int = 64) -> int:
  """Query tokens per program so that ``block_q * group`` rows are about ``max_rows`` (>= 16)."""
  return max(1, min(16, max_rows // group), -(-16 // group))


def query_blocks(query_start_loc, seq_lens, num_tokens: int, block_q: int):
  """Static-size list of query blocks: int32[4, NB] rows (seq, first token, num tokens, first pos).

  ``NB = cdiv(num_tokens, block_q) + N`` bounds the number of blocks; unused blocks have 0 tokens.
  """
  n = seq_lens.shape[0]
  q_lens = query_start_loc[1:] - query_start_loc[:-1]
  nb = (q_lens + block_q - 1) // block_q
  cum = jnp.cumsum(nb)
  num = -(-num_tokens // block_q) + n
  b = jnp.arange(num, dtype=jnp.int32)
  seq = jnp.minimum(jnp.searchsorted(cum, b, side="right"), n - 1).astype(jnp.int32)
  j = b - (cum[seq] - nb[seq])
  valid = b < cum[n - 1]
  first = query_start_loc[seq] + j * block_q
  count = jnp.where(valid, jnp.minimum(block_q, q_lens[seq] - j * block_q), 0)
  pos0 = seq_lens[seq] - q_lens[seq] + j * block_q
  return jnp.stack([seq, first, count, pos0]).astype(jnp.int32)


def _kernel(
  blk_ref, bt_ref, q_ref, k_ref, v_ref, o_ref, *, group, block_q, block_k, block_size, window, scale
):
  b = pl.program_id(0)
  h = pl.program_id(1)
  seq = blk_ref[0, b]
  first = blk_ref[1, b]
  count = blk_ref[2, b]
  pos0 = blk_ref[3, b]
  rows = block_q * group
  head_dim = q_ref.shape[-1]
  r = jnp.arange(rows, dtype=jnp.int32)
  row_ok = (r // group) < count
  row_pos = pos0 + r // group
  row_mask = jnp.broadcast_to(row_ok[:, None], (rows, head_dim))
  q = plgpu.load(q_ref.at[h, pl.ds(first * group, rows), :], mask=row_mask, other=0)
  fp32 = q.dtype == jnp.float32
  precision = jax.lax.Precision.HIGHEST if fp32 else None

  last = pos0 + count - 1  # last query position of the block (count may be 0)
  lo = jnp.zeros_like(pos0) if window is None else jnp.maximum(pos0 - window + 1, 0)
  c_lo = lo // block_k
  c_hi = jnp.where(count > 0, last // block_k + 1, c_lo)

  def body(c, carry):
    acc, m, denom = carry
    kstart = c * block_k
    page = bt_ref[seq, kstart // block_size]
    off = kstart % block_size
    kpos = kstart + jnp.arange(block_k, dtype=jnp.int32)
    key_ok = (kpos >= lo) & (kpos <= last)
    k = k_ref[page, pl.ds(off, block_k), h, :]
    v = v_ref[page, pl.ds(off, block_k), h, :]
    v = jnp.where(key_ok[:, None], v, jnp.zeros_like(v))  # stale pages may hold NaN
    s = jax.lax.dot_general(
      q, k, (((1,), (1,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
    )
    s = s * scale
    mask = (kpos[None, :] <= row_pos[:, None]) & row_ok[:, None]
    if window is not None:
      mask &= kpos[None, :] > row_pos[:, None] - window
    s = jnp.where(mask, s, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    alpha = jnp.exp(m - m_new)
    p = jnp.exp(s - m_new[:, None])
    denom = alpha * denom + jnp.sum(p, axis=1)
    pv = jax.lax.dot_general(
      p.astype(v.dtype),
      v,
      (((1,), (0,)), ((), ())),
      precision=precision,
      preferred_element_type=jnp.float32,
    )
    return acc * alpha[:, None] + pv, m_new, denom

  init = (
    jnp.zeros((rows, head_dim), jnp.float32),
    jnp.full((rows,), _M_INIT, jnp.float32),
    jnp.zeros((rows,), jnp.float32),
  )
  acc, _, denom = jax.lax.fori_loop(c_lo, c_hi, body, init)
  out = acc / jnp.where(denom > 0, denom, 1.0)[:, None]
  plgpu.store(o_ref.at[h, pl.ds(first * group, rows), :], out.astype(o_ref.dtype), mask=row_mask)


@functools.partial(
  jax.jit,
  static_argnames=("window", "scale", "block_q", "block_k", "interpret", "num_warps", "num_stages"),
)
def paged_attention_pallas(
  q,
  k_pages,
  v_pages,
  block_tables,
  seq_lens,
  query_start_loc,
  *,
  window=None,
  scale=None,
  block_q=None,
  block_k=None,
  interpret=False,
  num_warps=None,
  num_stages=2,
):
  """Paged attention with the Pallas kernel; contract as in ``reference.py`` (inputs validated)."""
  num_tokens, num_q_heads, head_dim = q.shape
  _, block_size, num_kv_heads, _ = k_pages.shape
  group = num_q_heads // num_kv_heads
  block_q = pick_block_q(group) if block_q is None else block_q
  block_k = pick_block_k(block_size) if block_k is None else block_k
  scale = head_dim**-0.5 if scale is None else float(scale)
  if num_warps is None:  # keep the fp32 accumulator [block_q * G, D] in registers
    num_warps = 8 if block_q * group * head_dim > 64 * 128 else 4
  qsl = jnp.asarray(query_start_loc, jnp.int32)
  seq_lens = jnp.asarray(seq_lens, jnp.int32)
  blocks = query_blocks(qsl, seq_lens, num_tokens, block_q)
  qg = q.reshape(num_tokens, num_kv_heads, group, head_dim).transpose(1, 0, 2, 3)
  qg = qg.reshape(num_kv_heads, num_tokens * group, head_dim)
  kernel = functools.partial(
    _kernel,
    group=group,
    block_q=block_q,
    block_k=block_k,
    block_size=block_size,
    window=window,
    scale=scale,
  )
  out = pl.pallas_call(
    kernel,
    grid=(blocks.shape[1], num_kv_heads),
    out_shape=jax.ShapeDtypeStruct(qg.shape, q.dtype),
    compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
    interpret=interpret,
    name="paged_attention_ragged",
  )(blocks, jnp.asarray(block_tables, jnp.int32), qg, k_pages, v_pages)
  out = out.reshape(num_kv_heads, num_tokens, group, head_dim).transpose(1, 0, 2, 3)
  out = out.reshape(num_tokens, num_q_heads, head_dim)
  valid = jnp.arange(num_tokens) < qsl[-1]
  return jnp.where(valid[:, None, None], out, jnp.zeros_like(out))
