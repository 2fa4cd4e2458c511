"""Packed-sequence chunk layout: round trips and chunk/sequence invariants."""

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from kernels.pallas import packing

_T, _N = 64, 4  # fixed shapes: one compilation per chunk size


@functools.cache
def _layout_fn(chunk):
  def f(cu):
    lay = packing.chunk_layout(cu, _T, chunk)
    x = jnp.arange(1, _T + 1, dtype=jnp.float32)[:, None] * jnp.ones((1, 3), jnp.float32)
    chunks = packing.to_chunks(x, lay)
    seq, pos = packing.token_positions(cu, _T)
    arrays = {k: v for k, v in vars(lay).items() if isinstance(v, jax.Array)}
    arrays.update(gather_index=lay.gather_index, chunk_is_first=lay.chunk_is_first)
    return arrays, x, chunks, packing.from_chunks(chunks, lay), seq, pos

  return jax.jit(f)


@settings(max_examples=40)
@given(
  cuts=st.lists(st.integers(0, _T), min_size=_N - 1, max_size=_N - 1),
  chunk=st.sampled_from([1, 4, 16]),
)
def test_chunk_layout_round_trip_and_invariants(cuts, chunk):
  cu = np.array([0, *sorted(cuts), _T], np.int32)
  lengths = np.diff(cu)
  out = jax.tree.map(np.asarray, _layout_fn(chunk)(jnp.asarray(cu)))
  arrays, x, chunks, back, seq, pos = out
  lay = types.SimpleNamespace(num_chunks=chunks.shape[0], **arrays)
  t, n = _T, _N
  assert chunks.shape == (lay.num_chunks, chunk, 3)
  np.testing.assert_array_equal(back, x)
  gidx = lay.gather_index.reshape(lay.num_chunks, chunk)
  start, count = lay.first, lay.count
  np.testing.assert_array_equal(count, -(-lengths // chunk))
  np.testing.assert_array_equal(lay.lengths, lengths)
  assert count.sum() <= lay.num_chunks
  for s in range(n):
    for c in range(count[s]):
      toks = gidx[start[s] + c]
      valid = toks[toks < t]
      # A chunk holds consecutive tokens of one sequence starting at a multiple of chunk.
      assert len(valid) >= 1 and np.all(seq[valid] == s)
      np.testing.assert_array_equal(pos[valid], c * chunk + np.arange(len(valid)))
      assert bool(lay.chunk_is_first[start[s] + c]) == (c == 0)
      slot = start[s] + c
      assert lay.seq[slot] == s and lay.local[slot] == c
      assert lay.start[slot] == cu[s] + c * chunk and lay.length[slot] == len(valid)
      np.testing.assert_array_equal(lay.token_chunk[valid], slot)
      np.testing.assert_array_equal(lay.token_pos[valid], np.arange(len(valid)))
  unused = np.arange(lay.num_chunks) >= count.sum()
  assert np.all(lay.seq[unused] == n) and np.all(lay.length[unused] == 0)
  # Padding slots are zeros.
  assert np.all(chunks.reshape(-1, 3)[gidx.reshape(-1) == t] == 0)


def test_empty_token_stream():
  @jax.jit
  def f(cu, x):
    lay = packing.chunk_layout(cu, 0, 4)
    out = packing.to_chunks(x, lay)
    return out, packing.from_chunks(out, lay)

  out, back = f(jnp.array([0, 0], jnp.int32), jnp.zeros((0, 2)))
  assert out.shape == (1, 4, 2) and not np.any(np.asarray(out))
  assert back.shape == (0, 2)


@pytest.mark.parametrize(
  "cu, match",
  [
    (np.array([[0, 4]]), "cu_seqlens"),
    (np.array([0.0, 4.0]), "cu_seqlens"),
    (np.array([1, 4]), "cu_seqlens"),
  ],
)
def test_bad_cu_seqlens(cu, match):
  with pytest.raises(ValueError, match=match):
    packing.normalize_cu_seqlens(cu, 4)


def test_resolve_checkpoints_defaults():
  cu = np.array([0, 10, 45], np.int32)
  assert packing.resolve_checkpoints(None, None, 45, cu, 4) == (0, 0)
  assert packing.resolve_checkpoints(8, None, 45, cu, 4) == (8, 4)
  assert packing.resolve_checkpoints(8, None, 45, None, 4) == (8, 5)
  assert packing.resolve_checkpoints(8, 2, 45, cu, 4) == (8, 2)
  with pytest.raises(ValueError, match="checkpoint_every"):
    packing.resolve_checkpoints(6, None, 45, cu, 4)
  with pytest.raises(ValueError, match="max_checkpoints"):
    packing.resolve_checkpoints(None, 3, 45, cu, 4)


def test_extra_chunk_slots_are_padding():
  """A larger ``num_chunks`` (the GDN kernels use T // C + N) only appends unused slots."""
  cu = jnp.asarray([0, 5, 5, 70], jnp.int32)
  tight = packing.chunk_layout(cu, 70, 16)
  assert tight.num_chunks == packing.max_chunks(70, 3, 16) == 7  # chunks: 1 + 0 + 5 = 6
  wide = packing.chunk_layout(cu, 70, 16, num_chunks=10)
  for name in ("seq", "start", "length", "local"):
    a, b = np.asarray(getattr(tight, name)), np.asarray(getattr(wide, name))
    np.testing.assert_array_equal(b[:7], a)
  np.testing.assert_array_equal(np.asarray(wide.seq[7:]), [3, 3, 3])
  np.testing.assert_array_equal(np.asarray(wide.length[7:]), [0, 0, 0])
  for name in ("first", "count", "lengths", "token_chunk", "token_pos"):
    np.testing.assert_array_equal(np.asarray(getattr(wide, name)), np.asarray(getattr(tight, name)))
  gidx = np.asarray(wide.gather_index).reshape(10, 16)
  np.testing.assert_array_equal(gidx[:7], np.asarray(tight.gather_index).reshape(7, 16))
  assert np.all(gidx[7:] == 70)
