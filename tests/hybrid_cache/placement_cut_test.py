"""Align-mode chunks cut where a stateful placement keeps a state (`core/split.py` `cuts`,
`core/step.py` `placement_cuts`, `core/policies/adaptive.py` `chunk_cuts`; twin
`schedule_rules.block_aligned_split(cuts=...)`, `twin/policies/adaptive.py` `chunk_cuts`)."""

from __future__ import annotations

import pytest

from hybrid_cache.config import CacheConfig
from hybrid_cache.config import GroupSpec
from hybrid_cache.factory import make_manager
from tests.hybrid_cache.policies_test import _COMMON
from tests.hybrid_cache.policies_test import _serve

# full attention + a recurrent group in align mode, block 4, placement `adaptive`
_ALIGN = dict(
  groups=(GroupSpec("full"), GroupSpec("mamba")),
  block_size=4,
  num_blocks=200,
  placement="adaptive",
  **_COMMON,
)


@pytest.mark.parametrize("backend", ["jax", "reference"])
def test_align_mode_computes_the_continuation_point_at_a_learned_alignment(backend):
  """20 requests leave a shared prefix after 8 or 24 tokens (2 or 6 units of 4: every
  divergence at a multiple of 2 units, none at a multiple of 4), so `adaptive` learns A = 2
  (from the 17th divergence on, `MIN_OBS`). A fresh 23-token prompt then keeps its
  continuation point, the last multiple of 2 units within it: 16 tokens (c = 4 units). Align
  mode computes a state only where a chunk ends; the prompt's one chunk would end at the last
  cacheable boundary, 20, which the placement does not keep. The cut at 16 makes the chunk end
  there (16, then 7): a later prefix of 16+ tokens hits 16. Without the cut nothing is kept and
  every lookup below hits 0 (checked by hand when the cut was added)."""
  m = make_manager(CacheConfig(**_ALIGN), backend)
  p8, p24 = [900 + i for i in range(8)], [700 + i for i in range(24)]
  for k in range(20):
    _serve(m, "a", (p8 if k % 2 else p24) + [10000 + 100 * k + i for i in range(6)])
  probe = [5000 + i for i in range(23)]
  _serve(m, "b", probe)
  assert [m.lookup(probe[:n] + [1]).hit_tokens for n in (8, 12, 16, 20, 23)] == [0, 0, 16, 16, 16]


def test_split_stops_at_a_cut_inside_the_chunk():
  """The split rule with a cut: the earliest of vLLM's stops and the cuts inside the chunk."""
  from hybrid_cache.twin.schedule_rules import block_aligned_split

  kw = dict(
    num_tokens=23, num_prompt_tokens=23, block_size=4, use_eagle=False, shared_prefix_boundary=0
  )
  assert block_aligned_split(0, 23, **kw) == 20  # vLLM: the last cacheable boundary
  assert block_aligned_split(0, 23, **kw, cuts=(16,)) == 16
  assert block_aligned_split(16, 7, **kw, cuts=(16,)) == 4  # a cut at the start is no stop
  assert block_aligned_split(0, 23, **kw, cuts=(24,)) == 20  # past the chunk: no stop
