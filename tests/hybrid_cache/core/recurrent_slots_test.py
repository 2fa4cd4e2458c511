"""Recurrent state slots (vLLM §5.1-5.4) and the engine's mode-"all" chunk cap.

`recurrent_slots.state_slots` (jitted core) against its plain-Python twin
`twin.rules.recurrent_state_slots` on random chunks; both backends' `EntryResult.recurrent`
on served requests (the hypothesis machines of `differential_test.py` compare them on random
schedules too); and the property the engine relies on in mode "all": chunks capped by
`recurrent_slots.kernel_chunk_cap` get every block boundary's state written into that boundary's
block, by a checkpoint or the chunk's final write.
"""

from __future__ import annotations

import functools

import hypothesis.strategies as st
import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.config import ResolvedGroup
from hybrid_cache.core.groups import recurrent_slots
from hybrid_cache.factory import make_manager
from hybrid_cache.twin import rules
from hybrid_cache.types import ScheduleEntry

MB = 16


def _spec(mode: str, bs: int) -> ResolvedGroup:
  return ResolvedGroup("mamba", bs, None, mode, False)


@functools.partial(jax.jit, static_argnums=0)
def _slots(spec, row, start, n):
  return recurrent_slots.state_slots(spec, row, start, n)


def _decode(spec, row, start, n):
  read, write, first, count = np.asarray(_slots(spec, np.asarray(row, np.int32), start, n))
  return int(read), int(write), tuple(int(b) for b in row[first : first + count])


@settings(deadline=None, max_examples=200)
@given(
  mode=st.sampled_from(("none", "align", "all")),
  bs=st.sampled_from((2, 4, 8)),
  data=st.data(),
)
def test_state_slots_match_the_twin_rule(mode, bs, data):
  end = data.draw(st.integers(1, MB * bs))
  start = data.draw(st.integers(0, end - 1))
  row = data.draw(st.lists(st.integers(0, 99), min_size=MB, max_size=MB))
  got = _decode(_spec(mode, bs), row, start, end - start)
  assert got == rules.recurrent_state_slots(mode, row, start, end - start, bs)


def test_state_slots_examples():
  row = [7, 8, 9] + [0] * (MB - 3)
  # mode all, B=4: read after 4 tokens (7), checkpoint after 8 (8), final state after 10 (9)
  assert _decode(_spec("all", 4), row, 4, 6) == (7, 9, (8,))
  assert _decode(_spec("all", 4), row, 0, 8) == (-1, 8, (7, 8))  # first chunk: from zeros
  assert _decode(_spec("all", 4), row, 5, 1) == (8, 8, ())  # decode inside a block
  # align: the running-state column cdiv(end, B) - 1, read after the pre-forward copy
  assert _decode(_spec("align", 4), row, 4, 6) == (9, 9, ())
  assert _decode(_spec("none", 4), row, 4, 6) == (7, 7, ())
  # not scheduled
  assert tuple(np.asarray(_slots(_spec("all", 4), np.asarray(row, np.int32), 4, 0))) == (
    -1,
    -1,
    0,
    0,
  )


@settings(deadline=None, max_examples=300)
@given(
  bs=st.sampled_from((1, 2, 4, 8)),
  num_tokens=st.integers(1, 200),
  data=st.data(),
)
def test_kernel_chunk_cap_keeps_chunks_checkpointable(bs, num_tokens, data):
  spec = _spec("all", bs)
  # the engine's request states: computed on a block boundary (capped chunks, aligned hits)
  # or one token short of the sequence (a decode)
  computed = data.draw(
    st.one_of(st.integers(0, (num_tokens - 1) // bs).map(lambda k: k * bs), st.just(num_tokens - 1))
  )
  budget = data.draw(st.integers(1, 300))
  cap = recurrent_slots.kernel_chunk_cap(spec, computed, num_tokens, budget)
  assert cap <= min(budget, num_tokens - computed)
  if cap > 0:
    end = computed + cap
    assert end == num_tokens or end % bs == 0
    recurrent_slots.check_kernel_chunk(spec, computed, cap)  # never crosses from inside a block
  else:
    # no boundary within the budget: only when the sequence end is out of reach too
    assert computed + budget < num_tokens
    assert (computed + budget) // bs * bs <= computed
  for mode in ("none", "align"):
    assert recurrent_slots.kernel_chunk_cap(_spec(mode, bs), computed, num_tokens, budget) is None


def test_kernel_chunk_cap_example():
  spec = _spec("all", 4)
  assert recurrent_slots.kernel_chunk_cap(spec, 4, 27, 7) == 4
  assert recurrent_slots.kernel_chunk_cap(spec, 4, 27, 30) == 23
  assert recurrent_slots.kernel_chunk_cap(spec, 5, 27, 2) == -1
  with pytest.raises(AssertionError, match="crosses a block boundary"):
    recurrent_slots.check_kernel_chunk(spec, 5, 4)
  recurrent_slots.check_kernel_chunk(spec, 5, 3)  # ends on the boundary
  recurrent_slots.check_kernel_chunk(_spec("align", 4), 5, 9)  # align chunks carry no checkpoints


def _config(mode: str, **kw) -> CacheConfig:
  return CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("mamba", mode=mode), GroupSpec("mamba", mode=mode)),
    block_size=4,
    num_blocks=96,
    max_model_len=64,
    max_requests=4,
    max_num_batched_tokens=64,
    **kw,
  )


@pytest.mark.parametrize("mode", ["all", "align", "none", "off"])
def test_served_requests_slots_agree_across_backends(mode):
  """Two requests sharing a prefix, served in engine-capped chunks (mode all) or free ones,
  then decoded: equal `recurrent` on both backends, one entry per recurrent group."""
  cfg = _config("align", enable_prefix_caching=False) if mode == "off" else _config(mode)
  spec = _spec("none" if mode == "off" else mode, 4)
  results = []
  for backend in ("jax", "reference"):
    m = make_manager(cfg, backend)
    out = []
    for name, prompt in (("a", list(range(30))), ("b", list(range(22)) + [90, 91, 92])):
      m.add_request(name, prompt)
      for budget in (7, 9, 5, 64, 64, 64):
        v = m.request_view(name)
        if v.num_computed_tokens >= v.num_tokens:
          m.append_tokens(name, [5])  # a decode step
          v = m.request_view(name)
        cap = recurrent_slots.kernel_chunk_cap(spec, v.num_computed_tokens, v.num_tokens, budget)
        if cap is not None and cap <= 0:
          continue
        e = m.schedule([ScheduleEntry(name, budget if cap is None else cap)]).entries[0]
        out.append((e.scheduled_tokens, e.num_computed_tokens, e.recurrent))
        if e.scheduled_tokens:
          assert [s.group for s in e.recurrent] == [1, 2]
        else:
          assert e.recurrent == ()
      m.free(name)
    results.append(out)
  assert results[0] == results[1]
  assert any(s for _, _, s in results[0])


@pytest.mark.parametrize("backend", ["jax", "reference"])
def test_mode_all_writes_every_boundary_state(backend):
  """Mode all with engine-capped chunks: over a request's chunks, each boundary b <= N gets
  the state after b tokens written into the block at column b // B - 1 of its table (vLLM
  §5.4), and each chunk after the first reads the block the previous one wrote."""
  cfg = _config("all")
  spec = _spec("all", 4)
  m = make_manager(cfg, backend)
  n_tok = 37
  m.add_request("a", list(range(n_tok)))
  boundaries = set()
  last_write = -1
  for budget in (6, 3, 10, 5, 9, 64):
    v = m.request_view("a")
    if v.num_computed_tokens >= n_tok:
      break
    cap = recurrent_slots.kernel_chunk_cap(spec, v.num_computed_tokens, n_tok, budget)
    if cap <= 0:
      continue
    e = m.schedule([ScheduleEntry("a", cap)]).entries[0]
    start, end = e.num_computed_tokens - e.scheduled_tokens, e.num_computed_tokens
    recurrent_slots.check_kernel_chunk(spec, start, e.scheduled_tokens)
    row = m.request_view("a").block_ids[1]
    s = e.recurrent[0]
    assert s.group == 1 and s.read == last_write
    written = {end: s.write}
    if start % 4 == 0:
      written.update({start + 4 * (j + 1): b for j, b in enumerate(s.checkpoints)})
    for b, blk in written.items():
      assert blk == row[(b - 1) // 4] and blk > 0
      if b % 4 == 0:
        boundaries.add(b)
    last_write = s.write
  assert m.request_view("a").num_computed_tokens == n_tok
  assert boundaries == set(range(4, n_tok + 1, 4))
