"""Host-side cost model of FLOP-aware eviction (SPEC B2, M§1.4–1.5): FLOPs saved per byte.

A keyed block of group g with token end E (its key covers the prefix [0, E), block size B)
saves, when it is hit:

* full / swa group: the group's compute of its own tokens [E - B, E):
  `F_g(E) - F_g(E - B)`;
* mamba group: the whole prefix, `F_g(E)` (a recurrent state replaces recomputing every token
  before it; Marconi charges only the edge since its parent node holds a state too, a block
  pool does not know the previous state, so this is the saving against a cold start).

with `F_g(L) = lin*L + quad*L^2` (full), `lin*L + quad*L*min(L, window)` (swa, the sim cost
model's non-causal count) and `lin*L` (mamba) (each kind's `prefix_flops` / `block_flops` in
`core/groups/`); `lin`, `quad` and the block's bytes come from
`CacheConfig.eviction_flops_linear / _quadratic / eviction_block_bytes` (empty = 1, 0, 1).
Efficiency = FLOPs / bytes, quantised once per config to int32 in [0, 2^30] relative to the
largest efficiency any block of the config can have, so the jitted core and the plain-Python
twin compare exactly the same integers.
"""

from __future__ import annotations

import functools

import numpy as np

from hybrid_cache.config import CacheConfig

ALPHA_MAX = 100.0
ALPHA_MILLI_MAX = int(ALPHA_MAX * 1000)  # 1000 * NORM + ALPHA_MILLI_MAX * NORM < 2^31


def alpha_milli(alpha: float) -> int:
  """alpha as the int32 thousandths the state holds; ValueError outside [0, ALPHA_MAX].

  Shared by the jitted core (`policies.flop_aware.set_alpha`) and the plain-Python twin
  (`twin.eviction`), so both accept and round alpha the same way.
  """
  if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)):
    raise ValueError(f"alpha must be a number in [0, {ALPHA_MAX:g}], got {alpha!r}")
  if not 0.0 <= float(alpha) <= ALPHA_MAX:
    raise ValueError(f"alpha must be in [0, {ALPHA_MAX:g}], got {alpha!r}")
  return int(round(float(alpha) * 1000))


EFF_BITS = 30

# the eviction clock of a policy with one (`policies.reads_clock`; core `eviction.rebase_clock`,
# twin `twin.eviction.rebase_clock`): above CLOCK_LIMIT the clock and every stamp drop by
# CLOCK_REBASE (stamps floored at 0), so that priorities stamp + weight (weight <= 2^28) stay
# within the frame's [0, 2^30]
CLOCK_LIMIT = 1 << 29
CLOCK_REBASE = 1 << 28


def group_costs(config: CacheConfig) -> tuple[tuple[float, float, float], ...]:
  """(linear, quadratic, block_bytes) per group, defaults filled in."""
  n = config.num_groups
  lin = config.eviction_flops_linear or (1.0,) * n
  quad = config.eviction_flops_quadratic or (0.0,) * n
  byt = config.eviction_block_bytes or (1.0,) * n
  return tuple(zip(lin, quad, byt))


def block_flops(config: CacheConfig) -> np.ndarray:
  """float64[G, MB + 1]: FLOPs saved by the block of group g ending at token j * B_g (j >= 1):
  its kind's `block_flops` (`groups.rules`; module docstring)."""
  from hybrid_cache.core.groups import rules  # the twin imports this module without JAX

  mb = config.max_blocks_per_request
  out = np.zeros((config.num_groups, mb + 1), np.float64)
  j = np.arange(1, mb + 1, dtype=np.float64)
  for g, (spec, (lin, quad, _)) in enumerate(zip(config.resolved_groups, group_costs(config))):
    out[g, 1:] = rules(spec).block_flops(spec, j * spec.block_size, lin, quad)
  return out


@functools.lru_cache(maxsize=64)
def efficiency_table(config: CacheConfig) -> np.ndarray:
  """int32[G, MB + 1]: quantised FLOPs-per-byte of the block of group g ending at j * B_g.

  Read-only. Entry = rint(eff / max_eff * 2^30), max over the whole table; all 0 if no block
  saves anything. Index column j = token end // block size of the group (column 0 unused).
  """
  byt = np.array([c[2] for c in group_costs(config)], np.float64)
  return _quantised(block_flops(config) / byt[:, None], EFF_BITS)


def _quantised(values: np.ndarray, bits: int) -> np.ndarray:
  """Read-only int32 `rint(values / max * 2^bits)` (all 0 when the max is not > 0)."""
  top = float(values.max())
  if top > 0:
    q = np.rint(values / top * float(1 << bits)).astype(np.int64)
  else:
    q = np.zeros(values.shape, np.int64)
  out = q.astype(np.int32)
  out.setflags(write=False)
  return out


SPAN_BITS = 24


@functools.lru_cache(maxsize=64)
def span_table(config: CacheConfig) -> np.ndarray:
  """int32[G, J + 1]: FLOPs of the whole model's prefix per byte of a block of group g, at
  every multiple j * u of the hash block u = `resolved_hash_block_size` (J = ceil(max_model_len
  / u)), quantised so that a difference of two entries is the FLOPs saved per byte over a span.

  Entry = rint(F(j * u) / bytes_g / top * 2^24), F(L) = sum over groups h of the kind's
  `prefix_flops(L)` with h's linear / quadratic cost (the model's prefill of L tokens, every
  layer), bytes_g = g's block bytes (`group_costs`), top the largest F(J * u) / bytes_g (all 0
  if nothing costs anything). Non-decreasing in j. Read-only; shared by both twins of
  `greedy_dual` (`T[g, E // u] - T[g, A // u]`: FLOPs of [A, E) per byte of g's block).
  """
  from hybrid_cache.core.groups import rules  # the twin imports this module without JAX

  u = config.resolved_hash_block_size
  j = np.arange(-(-config.max_model_len // u) + 1, dtype=np.float64)
  total = np.zeros(j.shape, np.float64)
  for spec, (lin, quad, _) in zip(config.resolved_groups, group_costs(config)):
    total += rules(spec).prefix_flops(spec, j * u, lin, quad)
  byt = np.array([c[2] for c in group_costs(config)], np.float64)
  return _quantised(total[None, :] / byt[:, None], SPAN_BITS)


@functools.lru_cache(maxsize=64)
def block_span_eff(config: CacheConfig) -> np.ndarray:
  """int32[G]: per non-recurrent group, the `span_table` FLOPs per byte of one of its blocks at
  the prefix's start (`T[g, B_g / u] - T[g, 0]`); -1 for recurrent groups (valued by their
  span back to the previous state instead). Constant per group, so that a chain's KV blocks
  weigh the same whatever their depth (`greedy_dual`'s module docstring). Read-only."""
  from hybrid_cache.core.groups import rules  # the twin imports this module without JAX

  table = span_table(config)
  u = config.resolved_hash_block_size
  last = table.shape[1] - 1
  out = np.asarray(
    [
      -1 if rules(g).RECURRENT else int(table[i, min(g.block_size // u, last)] - table[i, 0])
      for i, g in enumerate(config.resolved_groups)
    ],
    np.int32,
  )
  out.setflags(write=False)
  return out
