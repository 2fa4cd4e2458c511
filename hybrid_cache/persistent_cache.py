"""JAX's persistent compilation cache for the command-line tools and the tests.

Every new cache configuration compiles the jitted core (seconds each, `core/compile_cache.py`);
with the persistent cache on, a second run of the same tool, suite or sweep loads those
programs from disk instead (measured in `BENCHMARKS.md`, "Cache core speed").

Location: `$HYBRID_CACHE_JAX_CACHE` if set, else `~/.cache/hybrid_cache_jax` (shared by the
tests, `python -m hybrid_cache.sim`, `python -m hybrid_cache.replay` and `python -m
experiments.run`). Off: `HYBRID_CACHE_JAX_CACHE=off`, or the tools' flag (`--no-compile-cache`;
`experiments.run --nocompile_cache`). Programs that compile in under half a second are not
written (JAX's `jax_persistent_cache_min_compile_time_secs`). A directory already configured in
the process (`jax.config.jax_compilation_cache_dir`) is kept.
"""

from __future__ import annotations

import os

import jax

ENV = "HYBRID_CACHE_JAX_CACHE"
DEFAULT_DIR = os.path.join("~", ".cache", "hybrid_cache_jax")
OFF = "off"
MIN_COMPILE_SECONDS = 0.5


def cache_dir() -> str | None:
  """The directory the tools use: `$HYBRID_CACHE_JAX_CACHE` or the default; None when off."""
  value = os.environ.get(ENV, DEFAULT_DIR)
  if value.strip().lower() in (OFF, ""):
    return None
  return os.path.expanduser(value)


def enable(path: str | None = None) -> str | None:
  """Turns the persistent compilation cache on (`path` or `cache_dir()`); returns the directory
  in use, None when it is off. Idempotent; a directory already configured wins."""
  current = jax.config.jax_compilation_cache_dir
  if current:
    return current
  path = path or cache_dir()
  if path is None:
    return None
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
  return path
