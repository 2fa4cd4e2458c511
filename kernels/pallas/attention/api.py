"""Public entry points: ``paged_attention`` (ragged prefill + decode, full or sliding window) and
``write_kv`` (scatter new tokens into pages). Shapes and semantics: see ``reference.py``.

``write_kv`` updates the pages in place only when the caller donates them to its ``jit``.
"""

from __future__ import annotations

import jax
import numpy as np

from kernels.pallas import validation
from kernels.pallas.attention import pallas_gpu
from kernels.pallas.attention import reference
from kernels.pallas.common import resolve_implementation


def _shape_error(name, want, got):
  raise ValueError(f"{name} must have shape {want}, got shape {tuple(got)}")


def _first_bad(name, values, bad, allowed):
  if np.any(bad):
    k = tuple(int(i) for i in np.argwhere(bad)[0])
    k = k[0] if len(k) == 1 else k
    raise ValueError(f"{name}[{k}]={int(values[bad][0])} is out of range; allowed {allowed}")


def _validate(q, k_pages, v_pages, block_tables, seq_lens, query_start_loc, window, scale):
  if np.ndim(q) != 3:
    _shape_error("q", "[T, H_q, D]", np.shape(q))
  num_tokens, num_q_heads, head_dim = q.shape
  if np.ndim(k_pages) != 4:
    _shape_error("k_pages", "[num_blocks, block_size, H_kv, D]", np.shape(k_pages))
  if tuple(v_pages.shape) != tuple(k_pages.shape):
    _shape_error("v_pages", f"{tuple(k_pages.shape)} (same as k_pages)", v_pages.shape)
  num_blocks, block_size, num_kv_heads, kd = k_pages.shape
  if kd != head_dim:
    raise ValueError(f"k_pages head dim {kd} must equal q head dim D={head_dim}")
  if num_q_heads % num_kv_heads:
    raise ValueError(
      f"q heads H_q={num_q_heads} must be a multiple of k_pages heads H_kv={num_kv_heads}"
    )
  if np.ndim(block_tables) != 2:
    _shape_error("block_tables", "[N, max_blocks]", np.shape(block_tables))
  n, max_blocks = block_tables.shape
  validation.check_int("block_tables", block_tables)
  if np.shape(seq_lens) != (n,):
    _shape_error("seq_lens", f"[{n}] (one per block_tables row)", np.shape(seq_lens))
  validation.check_int("seq_lens", seq_lens)
  if query_start_loc is None:
    if num_tokens != n:
      raise ValueError(
        f"query_start_loc=None means one decode query per sequence: q has T={num_tokens} rows "
        f"but there are N={n} sequences"
      )
  else:
    if np.shape(query_start_loc) != (n + 1,):
      _shape_error("query_start_loc", f"[{n + 1}] (N+1)", np.shape(query_start_loc))
    validation.check_int("query_start_loc", query_start_loc)
  if window is not None and (not isinstance(window, (int, np.integer)) or window < 1):
    raise ValueError(f"window={window!r} must be None or a Python int >= 1")
  if scale is not None and not isinstance(scale, (int, float, np.floating)):
    raise ValueError(f"scale={scale!r} must be None or a Python float")

  lens = validation.concrete(seq_lens)
  qsl = np.arange(n + 1) if query_start_loc is None else validation.concrete(query_start_loc)
  capacity = max_blocks * block_size
  if lens is not None:
    _first_bad("seq_lens", lens, (lens < 0) | (lens > capacity), f"[0, {capacity}]")
  if qsl is not None:
    if qsl[0] != 0:
      raise ValueError(f"query_start_loc[0]={int(qsl[0])} must be 0")
    steps = np.diff(qsl)
    if np.any(steps < 0):
      k = int(np.argmax(steps < 0))
      raise ValueError(
        f"query_start_loc must be non-decreasing; query_start_loc[{k + 1}]={int(qsl[k + 1])} "
        f"< query_start_loc[{k}]={int(qsl[k])}"
      )
    if qsl[-1] > num_tokens:
      raise ValueError(f"query_start_loc[{n}]={int(qsl[-1])} exceeds the q rows T={num_tokens}")
    if lens is not None:
      too_long = steps > lens
      if np.any(too_long):
        k = int(np.argmax(too_long))
        raise ValueError(
          f"query_start_loc: sequence {k} has {int(steps[k])} queries but seq_lens[{k}]="
          f"{int(lens[k])}; queries must be the last q_len <= seq_len positions"
        )
  bt = validation.concrete(block_tables)
  if bt is not None and lens is not None:
    used = np.arange(max_blocks)[None, :] < -(-lens[:, None] // block_size)
    if window is not None and qsl is not None:
      # Blocks wholly before the first attended key of the first query may be anything.
      first_pos = lens - np.diff(qsl)
      first_key = np.maximum(first_pos - window + 1, 0)
      used &= np.arange(max_blocks)[None, :] >= (first_key // block_size)[:, None]
    bad = used & ((bt < 0) | (bt >= num_blocks))
    _first_bad("block_tables", bt, bad, f"[0, {num_blocks}) for attended blocks")


def paged_attention(
  q,
  k_pages,
  v_pages,
  block_tables,
  seq_lens,
  *,
  query_start_loc=None,
  window=None,
  scale=None,
  implementation=None,
  block_q=None,
  block_k=None,
  layer=None,
):
  """Causal (optionally sliding-window) paged attention over a ragged batch.

  Args:
    q: [T, H_q, D] queries, packed by sequence (prefill chunks and decodes mixed).
    k_pages, v_pages: [num_blocks, block_size, H_kv, D]; H_q % H_kv == 0.
    block_tables: int32[N, max_blocks] page ids; unattended entries may be 0 (null block).
    seq_lens: int32[N] sequence lengths including this step's queries.
    query_start_loc: int32[N+1] row offsets of each sequence's queries in ``q`` (its last q_len
      positions); None means decode (T == N, one query per sequence at ``seq_len - 1``).
    window: None (full attention) or W >= 1: a query at position p attends keys in (p-W, p].
    scale: score scale, default D**-0.5.
    implementation: ``"xla" | "pallas" | "interpret"`` or None (Pallas on GPU, else XLA).
    block_q, block_k: Pallas tiling (query tokens per program, keys per inner step).
    layer: (static int) the pages are the stacked [L, num_blocks, block_size, H_kv, D] of every
      layer and layer ``layer``'s are attended: the XLA path gathers from the stacked array
      directly (slicing the layer out first costs a copy of its pages per step); the Pallas
      kernels are given the slice.

  Returns:
    [T, H_q, D] in q's dtype (fp32 softmax); rows past ``query_start_loc[N]`` are zero.

  Raises:
    ValueError: bad shapes/dtypes/arguments, or (concrete values only) seq_lens beyond the block
      table capacity, a malformed query_start_loc, more queries than positions, or an attended
      block table entry out of range. Traced values are not checked; concrete device arrays are
      read on the host for the checks (a sync; call under ``jit`` to avoid it).
  """
  impl = resolve_implementation(implementation)
  if layer is not None:
    if np.ndim(k_pages) != 5 or not 0 <= layer < k_pages.shape[0]:
      raise ValueError(
        f"layer={layer} needs stacked pages [L, num_blocks, block_size, H_kv, D] with "
        f"0 <= layer < L, got shape {np.shape(k_pages)}"
      )
    view = jax.ShapeDtypeStruct(k_pages.shape[1:], k_pages.dtype)
    _validate(q, view, view, block_tables, seq_lens, query_start_loc, window, scale)
  else:
    _validate(q, k_pages, v_pages, block_tables, seq_lens, query_start_loc, window, scale)
  decode_only = query_start_loc is None
  if decode_only:
    query_start_loc = np.arange(block_tables.shape[0] + 1, dtype=np.int32)
  if impl == "xla":
    return _reference_jit(
      q,
      k_pages,
      v_pages,
      block_tables,
      seq_lens,
      query_start_loc,
      window=window,
      scale=scale,
      layer=layer,
    )
  if layer is not None:
    k_pages, v_pages = k_pages[layer], v_pages[layer]
  group = q.shape[1] // k_pages.shape[2]
  if block_q is None:
    # One query per sequence: the smallest tile that keeps the MMA at >= 16 rows.
    block_q = max(1, -(-16 // group)) if decode_only else pallas_gpu.pick_block_q(group)
  bq = block_q
  bk = pallas_gpu.pick_block_k(k_pages.shape[1]) if block_k is None else block_k
  if k_pages.shape[1] % bk:
    raise ValueError(f"block_k={bk} must divide block_size={k_pages.shape[1]}")
  if impl == "pallas":
    head_dim = q.shape[2]
    if not validation.is_pow2(head_dim, 16):
      raise ValueError(f"Pallas GPU kernel needs a power-of-two head dim >= 16, got D={head_dim}")
    if not validation.is_pow2(bk, 16):
      raise ValueError(
        f"Pallas GPU kernel needs block_k a power of two >= 16 dividing block_size, got "
        f"block_k={bk} for block_size={k_pages.shape[1]}"
      )
    if not validation.is_pow2(bq * group, 16):
      raise ValueError(
        f"Pallas GPU kernel needs block_q * (H_q // H_kv) a power of two >= 16, got "
        f"block_q={bq}, group={group}"
      )
  return pallas_gpu.paged_attention_pallas(
    q,
    k_pages,
    v_pages,
    block_tables,
    seq_lens,
    query_start_loc,
    window=window,
    scale=None if scale is None else float(scale),
    block_q=bq,
    block_k=bk,
    interpret=impl == "interpret",
  )


_reference_jit = jax.jit(
  reference.paged_attention_reference, static_argnames=("window", "scale", "layer")
)


def write_kv(k_pages, v_pages, k, v, slot_mapping, layer=None):
  """Writes ``k, v [T, H_kv, D]`` into flat slots ``block * block_size + offset`` (-1 = skip).

  Returns ``(k_pages, v_pages)``. XLA scatter; donate the pages in the caller's ``jit`` for an
  in-place update. ``layer`` (static int): the pages are the stacked ``[L, num_blocks,
  block_size, H_kv, D]`` of every layer; layer ``layer``'s are written (``reference``). Raises
  ValueError on shape mismatches and (concrete values only) slots outside ``[-1, num_blocks *
  block_size)``; traced out-of-range slots are skipped.
  """
  rank = 4 if layer is None else 5
  if np.ndim(k_pages) != rank:
    want = "[num_blocks, block_size, H_kv, D]" if layer is None else "[L, num_blocks, ...]"
    _shape_error("k_pages", want, np.shape(k_pages))
  if tuple(v_pages.shape) != tuple(k_pages.shape):
    _shape_error("v_pages", f"{tuple(k_pages.shape)} (same as k_pages)", v_pages.shape)
  if layer is not None and not 0 <= layer < k_pages.shape[0]:
    raise ValueError(f"layer must be in [0, {k_pages.shape[0]}), got {layer}")
  num_blocks, block_size, num_kv_heads, head_dim = k_pages.shape[rank - 4 :]
  if np.ndim(slot_mapping) != 1:
    _shape_error("slot_mapping", "[T]", np.shape(slot_mapping))
  validation.check_int("slot_mapping", slot_mapping)
  t = np.shape(slot_mapping)[0]
  for name, x in (("k", k), ("v", v)):
    if tuple(np.shape(x)) != (t, num_kv_heads, head_dim):
      _shape_error(name, f"[{t}, {num_kv_heads}, {head_dim}] (T, H_kv, D)", np.shape(x))
  slots = validation.concrete(slot_mapping)
  total = num_blocks * block_size
  if slots is not None:
    _first_bad("slot_mapping", slots, (slots < -1) | (slots >= total), f"[-1, {total})")
  return _write_kv_jit(k_pages, v_pages, k, v, slot_mapping, layer)


_write_kv_jit = jax.jit(reference.write_kv_reference, static_argnums=(5,))
