"""Compile keys of the jitted cache core and the bounded registry of its live programs.

Why (issue 13, measured with `python -m experiments.bench_compile`, XLA:CPU, jax 0.10.2):
every jitted entry point took the whole `CacheConfig` as a static argument, so each new
configuration compiled ~12 programs (5-7 s) whose code stayed mapped for the life of the
process: each configuration added ~1,500 lines to /proc/self/maps (XLA:CPU's thunk runtime JITs
every fusion kernel into its own code, read-only and data pages: ~3 mappings per kernel, ~480
kernels per configuration; `--xla_cpu_parallel_codegen_split_count=1` does not change that)
and ~100 MiB of RSS. A replay of a few dozen scenario files in one process reached the
kernel's 65,530-mapping limit and died (`LLVM compilation error: Cannot allocate memory`, then
a segfault). The programs are held by each jitted function's C++ dispatch cache, keyed on the
static config; `jit_fn.clear_cache()` returns every mapping of its programs (the Python-level
lowering/compilation caches only hold them weakly).

Two remedies, both here:

* `compile_key(config)`: the canonical config the core compiles for. The fields that only
  enter as values (`DYNAMIC_FIELDS`) are read at run time from `CacheState.params`
  (`fresh_state.runtime_params`) and replaced here by fixed placeholders; static shapes are
  bucketed: the id space `num_blocks + state_slots` to the next power of two, `state_slots` to
  a 0/1 flag (a second pool, `CacheConfig.state_slots`; the padding blocks are never free, never
  allocated and excluded from every count, see `fresh_state.init_state`; the index bucket
  count and the eviction order window (`eviction.order_window`) only depend on that power of
  two),
  `max_model_len` so that the block-table width is a power of two (kept exact for eviction
  policies that read costs, `policies.reads_costs`: flop_aware's efficiency table is
  normalised over the real width), and the cost fields are dropped for the others (never
  read). Configs with equal keys share compiled programs.
* `jitted(config, name, make)`: the jitted function `name` of `compile_key(config)`, made once
  by `make(key)` (a `jax.jit` of the implementation with the key bound, so each key has its
  own dispatch cache) and kept in a registry of at most `max_live_keys()` keys (least
  recently used first out; default 16, env `HYBRID_CACHE_MAX_LIVE_CONFIGS`). A key that falls
  out has `clear_cache()` called on each of its functions, returning their programs' memory
  mappings; using it again recompiles (correct, only slower). A key holds ~1,300 mappings and
  ~90 MiB (five programs, 2026-11-29), so 16 keys stay far below the mapping limit; 16 covers
  the differential generator's ten families without evictions.

One program per entry point and key (issue 29): `schedule_step` pads its entries to
`step_entries` (powers of 8) and runs them in a while loop that stops at the last valid one;
`release_request` takes `preempt` as a traced bool. Before, the step compiled once per
power-of-two batch size and again for admit-only batches, and the release twice: 8-12
programs per key instead of 5.

What stays static, and what a change of it costs (`python -m experiments.bench_compile --vary
fields`, 2026-11-29, 2-core CPU, idle, XLA:CPU jax 0.10.2, persistent cache off; seconds
compiling one new key, its five programs): every field below still starts a new key.

  field (compile key)                        new key   why static
  retention_interval, watermark, budget,     0 s       runtime (`DYNAMIC_FIELDS`)
  num_blocks within its bucket, ...
  num_blocks across a power of two           3.4 s     pool array shapes (padding costs step
                                                        time linear in the pool)
  max_model_len across a table-width bucket  3.6 s     block-table shapes
  max_requests                               3.2 s     request-table shapes
  block sizes, hash block                    3.5 s     table positions <-> tokens, key gathers
  window                                     3.5 s     blocks a window needs (`swa_need`)
  group count and kinds                      3.5-3.8 s the per-group code is unrolled per group
  recurrent mode (align / all / none)        3.2 s     placement rule per group
  partial hits                               5.4 s     extra copy-on-write and fine paths
  fine_keys                                  5.6 s     fine lookup path
  eviction / placement / admission /         3.7-4.0 s the policy's code (`policies`)
  retention policy, pinning
  speculative tokens                         3.6 s     lookahead blocks (shapes)
  state_slots flag, byte_budget flag         4.2 s     a second free queue and its counts
  prefix caching off                         2.9 s     no lookup or key code at all

Every static field costs about one key (3-6 s), so the lever is sharing keys, not one field:
scenarios and sweeps that differ in sizes and settings inside one family share every program
(`--vary families`: median 0.002 s per new configuration cold, mean 1.35 s, the first of each
family paying one key; BENCHMARKS.md section 5). Turning the group structure, block sizes or
windows into runtime values would be the next step for sweeps across families; none is done
here (each would trade a measured step-time cost for ~3.5 s per key, not yet measured).

Nothing else in the core may keep jitted functions keyed on a config.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import threading
from collections.abc import Callable
from typing import Any

from hybrid_cache import policies
from hybrid_cache.config import CacheConfig

# Fields read from `CacheState.params` inside jit (see `fresh_state.runtime_params`), with the
# placeholder value every compile key carries (valid for `CacheConfig` validation; never read
# by the core: a read of the placeholder would be a bug).
DYNAMIC_FIELDS = {
  "max_num_batched_tokens": 1 << 30,
  "watermark_blocks": 0,
  "full_sequence_must_fit": True,
  "retention_interval": None,
  "pin_min_drop_size": 1,
  "marconi_junction": True,
  "free_order": "scratch_first",
  "page_bytes": 1,
  "slot_bytes": 1,
}
_COST_FIELDS = ("eviction_flops_linear", "eviction_flops_quadratic", "eviction_block_bytes")


def next_pow2(n: int) -> int:
  """Smallest power of two >= n (n >= 1)."""
  return 1 << max(0, (n - 1).bit_length())


STEP_ENTRIES_BASE = 8


def step_entries(n: int) -> int:
  """The padded entry count E of a `schedule_step` batch of n entries: the next power of 8
  (at least 8). The step runs its entries in a while loop that stops at the last valid one,
  so padding costs no step time, only the rows of the packed output (i32[E + 1, K]); powers
  of 8 keep the programs per key to one for batches of <= 8 entries (every scenario and most
  tests), two up to 64."""
  e = STEP_ENTRIES_BASE
  while e < n:
    e *= STEP_ENTRIES_BASE
  return e


def bucket_num_blocks(num_blocks: int) -> int:
  """Pool size the arrays are padded to: the next power of two."""
  return next_pow2(num_blocks)


def bucket_max_model_len(config: CacheConfig) -> int:
  """A `max_model_len` whose block-table width (`max_blocks_per_request` without the EAGLE
  slots) is the next power of two of the config's: `pow2(cdiv(L, min block)) * min block`.
  It covers the real one (hash rows included: the hash block divides every block size)."""
  bmin = min(config.group_block_sizes)
  return next_pow2(-(-config.max_model_len // bmin)) * bmin


@functools.lru_cache(maxsize=1024)
def compile_key(config: CacheConfig) -> CacheConfig:
  """The canonical config the core compiles for (module docstring); idempotent."""
  changes: dict[str, Any] = dict(DYNAMIC_FIELDS)
  # the padded id space is `num_blocks + state_slots` (`CacheConfig.pool_size`); a second
  # pool is a static flag (state_slots 1), its size a runtime parameter (`CacheState.first_slot`)
  flag = 1 if config.state_slots else 0
  changes["state_slots"] = flag
  changes["num_blocks"] = bucket_num_blocks(config.pool_size) - flag
  # a shared byte budget is a static flag too (its values are runtime parameters)
  changes["byte_budget"] = 1 if config.byte_budget is not None else None
  if policies.reads_costs(config.eviction):
    changes["max_model_len"] = config.max_model_len
  else:
    changes["max_model_len"] = bucket_max_model_len(config)
    changes.update({f: () for f in _COST_FIELDS})
  if all(getattr(config, k) == v for k, v in changes.items()):
    return config
  return dataclasses.replace(config, **changes)


# ---- registry of live keys ----


def _default_max_live() -> int:
  raw = os.environ.get("HYBRID_CACHE_MAX_LIVE_CONFIGS", "16")
  try:
    n = int(raw)
  except ValueError:
    raise ValueError(
      f"HYBRID_CACHE_MAX_LIVE_CONFIGS must be an integer >= 1, got {raw!r}"
    ) from None
  if n < 1:
    raise ValueError(f"HYBRID_CACHE_MAX_LIVE_CONFIGS must be an integer >= 1, got {raw!r}")
  return n


_lock = threading.Lock()
_live: collections.OrderedDict[CacheConfig, dict[str, Callable]] = collections.OrderedDict()
_max_live = _default_max_live()
_evictions = 0


def _evict_down_to(n: int) -> None:
  """Drops least recently used keys until at most `n` remain (caller holds the lock)."""
  global _evictions
  while len(_live) > n:
    _, fns = _live.popitem(last=False)
    for fn in fns.values():
      fn.clear_cache()
    _evictions += 1


def jitted(config: CacheConfig, name: str, make: Callable[[CacheConfig], Callable]) -> Callable:
  """The jitted function `name` for `compile_key(config)`, made by `make(key)` on first use.

  Marks the key most recently used; a new key beyond `max_live_keys()` evicts the least
  recently used one (its functions' compiled programs are released).
  """
  key = compile_key(config)
  with _lock:
    fns = _live.get(key)
    if fns is None:
      fns = _live[key] = {}
      _evict_down_to(_max_live)
    else:
      _live.move_to_end(key)
    fn = fns.get(name)
    if fn is None:
      fn = fns[name] = make(key)
    return fn


def max_live_keys() -> int:
  """How many compile keys keep their programs."""
  return _max_live


def set_max_live_keys(n: int) -> int:
  """Sets the registry capacity (evicting at once down to it); returns the previous one."""
  global _max_live
  if isinstance(n, bool) or not isinstance(n, int) or n < 1:
    raise ValueError(f"max live keys must be an integer >= 1, got {n!r}")
  with _lock:
    prev, _max_live = _max_live, n
    _evict_down_to(n)
  return prev


def live_keys() -> tuple[CacheConfig, ...]:
  """The live compile keys, least recently used first."""
  with _lock:
    return tuple(_live)


def cache_size(config: CacheConfig, name: str) -> int:
  """Compiled programs the function `name` of `config`'s key holds (0 if not live)."""
  with _lock:
    fn = _live.get(compile_key(config), {}).get(name)
  return 0 if fn is None else fn._cache_size()  # noqa: SLF001 - jax's per-function count


def evictions() -> int:
  """Keys evicted since the process started."""
  return _evictions


def clear() -> None:
  """Evicts every key (releases all programs of the cache core)."""
  with _lock:
    _evict_down_to(0)


def entry_point(**jit_kwargs) -> Callable:
  """Decorator: `impl(config, state, ...)` becomes an entry point with the same signature that
  runs `jax.jit(functools.partial(impl, key), **jit_kwargs)` for `key = compile_key(config)`
  (`jitted`): one jitted function, with its own dispatch cache, per key, released when the key
  leaves the registry. Inside `impl`, `config` is the key. With the key bound, the state is
  argument 0 (`donate_argnums=(0,)`). `entry.cache_size(config)`: programs compiled for it.
  """
  import jax  # noqa: PLC0415 - this module's other parts stay importable without JAX

  def deco(impl: Callable) -> Callable:
    name = f"{impl.__module__}.{impl.__qualname__}"

    def make(key: CacheConfig) -> Callable:
      return jax.jit(functools.partial(impl, key), **jit_kwargs)

    @functools.wraps(impl)
    def entry(config: CacheConfig, *args, **kwargs):
      return jitted(config, name, make)(*args, **kwargs)

    entry.cache_size = lambda config: cache_size(config, name)
    return entry

  return deco
