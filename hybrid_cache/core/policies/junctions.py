"""Placement `junctions`: a recurrent state is kept only at a request's replay boundaries.

Marconi (MLSys'25, "judicious admission") keeps a state where a later request can resume: at
the end of the prompt (a multi-turn continuation hits there) and at the junction where the
request's prefix left the cache's tree (vLLM 0.33's `shared_prefix_boundary`, where a sibling
resumes). Every other state a chunk leaves behind is not registered. The boundaries are
floored to the hit alignment, as vLLM's `reachable_block_mask` floors them, so on a model
without sliding-window groups this placement equals `retention_interval=0` under the built-in
`vllm` placement, whatever `retention_interval` says (tests/hybrid_cache/policies_test.py checks
that equality). Oracle twin: `hybrid_cache/oracle/policies/junctions.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hybrid_cache.core.layout import Layout
from hybrid_cache.core.state import floor_to


def keep(lay: Layout, r, g: int, pos, boundaries, default) -> jax.Array:
  """bool[MB]: state block i is kept iff it ends at a boundary b > 0 floored to the hit
  alignment: i == floor(b / align) * align / B - 1 (`boundaries`: the prompt's last position
  and the junction, traced i32; `default`, vLLM's mask, is not read)."""
  bs = lay.groups[g].block_size
  mask = jnp.zeros(pos.shape, bool)
  for b in boundaries:
    mask |= (b > 0) & (pos == floor_to(b, lay.hit_align) // bs - 1)
  return mask
