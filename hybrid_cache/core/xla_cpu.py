"""XLA:CPU speed tricks of the jitted core, in one place, each beside the plain code it replaces.

The core's rules are written with plain `jnp` (cumsum, argsort, nonzero, sum); the few spots
where XLA:CPU (jax 0.10, the CI and simulator backend) is slow call a primitive from here
instead. Every primitive returns exactly what its plain twin returns (tests/hybrid_cache/core/
xla_cpu_test.py), so a trick can never change a rule, only its speed.

Each trick stays only while it buys >= 10% on `experiments/bench_scheduler.py` (batch 64) or on
the simulator's core replay (issue 14). `python -m experiments.bench_xla_tricks` measures that:
it runs both benchmarks with every trick on and with one trick at a time replaced by its plain
twin, named in the environment variable `HYBRID_CACHE_PLAIN_XLA` (comma-separated `TRICKS`
names; read once at import). The measured gains are in each docstring and in BENCHMARKS.md
(2026-11-25, 2-core CPU, load 3-7: medians of 3-5 interleaved rounds, each the minimum of 3
timings; "x" = plain twin / trick). All tricks together: batch 64 1.5-1.8x (process CPU), scan
2.0x, lru replay 1.7x, flop_aware replay 1.6-2.3x.

Dropped by that rule (the core now runs their plain code): the admit-only step's free-queue
order computed once per step with one req_info write per entry (`queue_order` / `one_write`:
<= 1.03x on every benchmark; it was three of `pop_many`'s five paths). Checked against the
commit before, full Mooncake trace at 10 GB (3 interleaved pairs, load ~1.5-2): lru replay
5.79 -> 5.77 s, flop_aware 7.65 -> 8.06 s (medians; the rounds spread 15-50%).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

TRICKS = (
  "prefix_count",  # cumsum by triangular matmuls
  "row_count",  # row sums by a matrix-vector product
  "materialise",  # identity scatter as a fusion barrier
  "stable_argsort",  # two-pass radix argsort
  "ordered_after",  # fake data dependence ordering a read before an in-place write
  "pop_window",  # pops read the queue head from a key-offset window instead of ranking
  # (`block_pool.pop_many`; measured 1.57x on the scan, 2.80x on the lru replay)
)


def _plain_from_env() -> frozenset[str]:
  names = frozenset(n.strip() for n in os.environ.get("HYBRID_CACHE_PLAIN_XLA", "").split(","))
  names -= {""}
  unknown = sorted(names - set(TRICKS))
  if unknown:
    raise ValueError(
      f"HYBRID_CACHE_PLAIN_XLA: unknown trick(s) {unknown}; allowed: {', '.join(TRICKS)}"
    )
  return names


PLAIN: frozenset[str] = _plain_from_env()
_HI = jax.lax.Precision.HIGHEST


def enabled(name: str) -> bool:
  """Whether trick `name` (one of `TRICKS`) is on (i.e. not named in HYBRID_CACHE_PLAIN_XLA)."""
  if name not in TRICKS:
    raise ValueError(f"unknown trick {name!r}; allowed: {', '.join(TRICKS)}")
  return name not in PLAIN


def prefix_count(mask: jax.Array, width: int = 32) -> jax.Array:
  """i32[N]: inclusive prefix count of `mask` (bool[N]); plain twin `jnp.cumsum(mask)`.

  Replaces: `cumsum`, which XLA:CPU lowers to a reduce-window (quadratic in N). Instead a
  [N/w, w] x [w, w] triangular matmul (counts inside rows of `width`) plus the rows' offsets,
  the same way recursively (`_prefix_sum`); exact in f32 (counts < 2^24, HIGHEST precision:
  no TF32 on GPUs).
  Measured: 1.05x on the lru replay, ~1.0x on the scheduler benchmarks: kept as borderline
  (at load 3-7 the rounds spread +-15%; re-measure on an idle machine).
  """
  if not enabled("prefix_count"):
    return jnp.cumsum(mask.astype(jnp.int32)).astype(jnp.int32)
  return _prefix_sum(mask.astype(jnp.float32), width).astype(jnp.int32)


def _prefix_sum(x: jax.Array, width: int) -> jax.Array:
  """f32[N]: inclusive prefix sum of `x` (f32[N] integers, total < 2^24) for `prefix_count`:
  rows of `width` by one triangular matmul, the rows' offsets by the same recursively (a
  [N/w, N/w] matmul for the offsets cost 0.57 ms a step at N = 2^16 inside the scan)."""
  n = x.shape[0]
  rows = -(-n // width)
  x = jnp.zeros((rows * width,), jnp.float32).at[:n].set(x).reshape(rows, width)
  up = jnp.asarray(np.arange(width)[:, None] <= np.arange(width)[None, :], jnp.float32)
  within = jnp.matmul(x, up, precision=_HI)
  totals = within[:, -1]
  if rows <= width:
    low = jnp.asarray(np.arange(rows)[None, :] < np.arange(rows)[:, None], jnp.float32)
    off = jnp.matmul(low, totals, precision=_HI)
  else:
    off = _prefix_sum(totals, width) - totals
  return (within + off[:, None]).reshape(-1)[:n]


def row_prefix_counts(rows: jax.Array) -> jax.Array:
  """i32[R, N]: inclusive prefix count along each row of `rows` (bool[R, N], N < 2^24); plain
  twin `jnp.cumsum(rows, axis=1)`. One [R, N] x [N, N] triangular matmul (see `prefix_count`)
  for the short rows of block tables (N = max blocks per request); rows longer than
  `_ROW_BLOCK_FROM` take `prefix_count`'s blocked sum, row by row."""
  if not enabled("prefix_count"):
    return jnp.cumsum(rows.astype(jnp.int32), axis=1).astype(jnp.int32)
  n = rows.shape[1]
  if n > _ROW_BLOCK_FROM:  # long rows: `prefix_count`'s blocked sum, row by row
    return jax.vmap(lambda row: _prefix_sum(row, 32))(rows.astype(jnp.float32)).astype(jnp.int32)
  tri = jnp.asarray((np.arange(n)[:, None] <= np.arange(n)[None, :]).astype(np.float32))
  return jnp.matmul(rows.astype(jnp.float32), tri, precision=_HI).astype(jnp.int32)


# rows longer than this take `_prefix_sum` (blocks of 32): the [N, N] matmul's cost grows as
# N^2 (at 64-token pages and Mooncake's max_model_len, N = 1,895: ~0.5 ms per lookup, 8% of a
# step)
_ROW_BLOCK_FROM = 256


def row_count(mask: jax.Array) -> jax.Array:
  """i32[k]: set entries per row of `mask` (bool[k, n], n < 2^24); plain twin
  `jnp.sum(mask, axis=1)`.

  Replaces: an integer reduction over more than 32 elements, which XLA:CPU splits into a
  reduce-window plus a reduce (two thunks); here one exact f32 matrix-vector product.
  Measured: 1.13x on the scan of admissions.
  """
  if not enabled("row_count"):
    return jnp.sum(mask, axis=1).astype(jnp.int32)
  ones = jnp.ones((mask.shape[1],), jnp.float32)
  return jnp.matmul(mask.astype(jnp.float32), ones, precision=_HI).astype(jnp.int32)


def materialise(x: jax.Array) -> jax.Array:
  """`x` (1-D) written to its own buffer: a fusion boundary; plain twin: `x` itself.

  Replaces: nothing in the result. XLA:CPU fuses a cheap elementwise producer (a bucket hash,
  a gathered group) into a pairwise [N, N] consumer and recomputes it N times per element;
  `lax.optimization_barrier` is expanded away before fusion, an identity scatter is not fused
  into its consumers. Measured: <= 1.02x on the benchmarks' 1,500-request replays, but the
  full-trace flop_aware replay (10 GB, every step re-keys and scans the index for dead states)
  ran 9.35 s without it vs 8.43 s for the commit before (3 interleaved pairs): kept.
  """
  if not enabled("materialise"):
    return x
  n = x.shape[0]
  return jnp.zeros_like(x).at[jnp.arange(n)].set(x, unique_indices=True, indices_are_sorted=True)


def stable_argsort(x: jax.Array) -> jax.Array:
  """i32[N]: `jnp.argsort(x, stable=True)` of int32 `x` (its plain twin), by two radix passes
  when N <= 2^16.

  Replaces: a stable argsort, which XLA:CPU runs as a sort of a (key, index) pair through a
  comparator call per comparison, several times slower than its fast path for one primitive
  operand. Each pass sorts one packed uint32, 16 key bits above the log2(N) position bits
  (unique, so no tie order is needed): first by the low 16 bits and block index, then by the
  high 16 bits and the first pass's position. Measured: 1.41x on the flop_aware replay (its
  re-keying sorts the free queue twice per step).
  """
  n = x.shape[0]
  bits = max(1, (n - 1).bit_length())
  if n > 1 << 16 or not enabled("stable_argsort"):
    return jnp.argsort(x, stable=True).astype(jnp.int32)
  u = jnp.uint32
  ux = x.astype(u) ^ u(1 << 31)  # order-preserving int32 -> uint32
  mask = u((1 << bits) - 1)
  idx = jnp.arange(n, dtype=u)
  perm1 = jnp.sort(((ux & u(0xFFFF)) << u(bits)) | idx) & mask
  perm = jnp.sort(((ux[perm1] >> u(16)) << u(bits)) | idx) & mask
  return perm1[perm].astype(jnp.int32)


def compact(mask: jax.Array, size: int) -> jax.Array:
  """i32[size]: indices of the set entries of `mask` (bool[N]) in increasing order, 0-padded;
  plain twin `jnp.nonzero(mask, size=size, fill_value=0)[0]`. Each set entry is scattered to
  its prefix count (`prefix_count`: unique destinations, extra entries dropped)."""
  n = mask.shape[0]
  p = prefix_count(mask, 64)
  dest = jnp.where(mask & (p <= size), p - 1, size)
  return jnp.zeros((size,), jnp.int32).at[dest].set(jnp.arange(n, dtype=jnp.int32), mode="drop")


def ordered_after(x: jax.Array, dep: jax.Array) -> jax.Array:
  """`x`, made data-dependent on `dep` (an int array that is >= 0 by construction); plain
  twin: `x`.

  Replaces: nothing in the result. An in-place scatter into an array happens only if XLA sees
  every read of that array ordered before it; a later scatter whose indices depend on a value
  computed from those reads (`dep`) is. Used where the pool's queue keys are gathered and then
  touched: without it XLA copies the [2, NB] key array twice per entry. Measured: 1.15x on the
  lru replay.
  """
  if not enabled("ordered_after"):
    return x
  return jnp.where(dep >= 0, x, jnp.zeros_like(x))


__all__ = [
  "PLAIN",
  "TRICKS",
  "compact",
  "enabled",
  "materialise",
  "ordered_after",
  "prefix_count",
  "row_count",
  "row_prefix_counts",
  "stable_argsort",
]
