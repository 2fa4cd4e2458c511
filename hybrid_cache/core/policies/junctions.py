"""Placement `junctions`: a recurrent state is kept only at a request's replay boundaries.

Marconi (MLSys'25, "judicious admission") keeps a state where a later request can resume: at
the end of the prompt (a multi-turn continuation hits there) and at the junction where the
request's prefix left the cache's tree (vLLM 0.33's `shared_prefix_boundary`, where a sibling
resumes). Every other state a chunk leaves behind is not registered. The boundaries are
floored to the hit alignment, as vLLM's `reachable_block_mask` floors them: the recurrent
groups keep exactly vLLM's mask at `retention_interval=0`, whatever `retention_interval` says
(so on a model without sliding-window groups the whole run equals `retention_interval=0` under
the built-in `vllm` placement; tests/hybrid_cache/policies_test.py checks that equality).
Twin: `hybrid_cache/twin/policies/junctions.py`.
"""

from __future__ import annotations

import jax

from hybrid_cache.core.groups import recurrent
from hybrid_cache.core.layout import Layout


def keep(lay: Layout, r, g: int, pos, boundaries, default) -> jax.Array:
  """bool[MB]: state block i is kept iff it ends at a boundary b > 0 floored to the hit
  alignment: i == floor(b / align) * align / B - 1 (`boundaries`: the prompt's last position
  and the junction, traced i32; `default`, vLLM's mask, is not read). That is vLLM's own mask
  at retention 0 (`recurrent.retention_mask`), whatever the configured interval."""
  return recurrent.retention_mask(pos, lay.groups[g].block_size, lay.hit_align, 0, boundaries)
