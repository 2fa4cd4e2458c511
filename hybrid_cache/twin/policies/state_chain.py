"""Twin of `hybrid_cache.core.policies.state_chain`: attention pins stop at the deepest
kept recurrent state."""

from __future__ import annotations

from hybrid_cache.config import CacheConfig


def pin(config: CacheConfig, groups, keyed, default, num_prompt: int, alignment: int):
  """Per group, the row indices to pin. `groups`: per group (kind, block size, need);
  `keyed`: per group the keyed row indices (increasing); `default`: SPEC B1's indices;
  `alignment`: the hit alignment the prompt boundary is floored to."""
  end = max(num_prompt - 1, 0) // alignment * alignment
  for (kind, bs, _), k in zip(groups, keyed):
    if kind == "mamba" and k:
      end = max(end, (k[-1] + 1) * bs)
  out = []
  for (kind, bs, need), k, d in zip(groups, keyed, default):
    last = end // bs - 1
    if kind == "mamba":
      out.append(list(d))
    elif kind == "swa":
      out.append([i for i in k if last - need < i <= last])
    else:
      out.append([i for i in k if i <= last])
  return out
