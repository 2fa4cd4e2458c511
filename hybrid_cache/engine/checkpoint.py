"""Orbax checkpoints of a warm engine cache (the only module of hybrid_cache importing orbax).

A warm cache = the cache core's `CacheState` pytree (pool, hash index, clocks) plus the
model's KV pages and recurrent state pools (`models.cache.ModelCache`). Saved while the
engine is idle (no unfinished request), restored into an idle engine built with the same
model config, cache config and seed, so an experiment can restart from a warm cache.

Layout of `path`::

  path/meta.json    model config, cache config, seed (checked on restore)
  path/arrays/      Orbax StandardCheckpointer: {"cache_state": ..., "model_cache": ...}

Example::

  save_warm_cache(engine, "/tmp/warm")
  fresh = Engine(...same arguments...)
  restore_warm_cache(fresh, "/tmp/warm")   # fresh now hits the saved prefixes
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from hybrid_cache.engine.engine import Engine


def _nonempty(tree) -> dict[str, Any]:
  """Flat {path: leaf} of the non-empty leaves (Orbax refuses zero-size arrays)."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {jax.tree_util.keystr(p): x for p, x in flat if x.size}


def _merge(tree, restored: dict[str, Any]):
  """`tree` with the leaves found in `restored` (by path) replaced."""
  return jax.tree_util.tree_map_with_path(
    lambda p, x: restored.get(jax.tree_util.keystr(p), x), tree
  )


def _meta(engine: Engine) -> dict[str, Any]:
  cc = engine.cache_config
  return {
    "model_config": dataclasses.asdict(engine.model_config),
    "cache_config": repr(cc),
    "seed": engine.seed,
  }


def _state_of(engine: Engine):
  state = getattr(engine.manager, "state", None)
  if state is None:
    raise ValueError(
      "engine.manager must be the jitted JaxCacheManager (cache_manager='jax') to checkpoint "
      f"its CacheState, got {type(engine.manager).__name__}"
    )
  return state


def _check_idle(engine: Engine, what: str) -> None:
  if engine.has_unfinished() or engine.manager.active_requests():
    raise ValueError(
      f"engine must be idle to {what} a warm cache; it has {engine.num_unfinished} unfinished "
      "requests"
    )


def save_warm_cache(engine: Engine, path: str) -> str:
  """Writes the engine's CacheState and model cache under `path` (absolute or relative)."""
  _check_idle(engine, "save")
  state = _state_of(engine)
  path = os.path.abspath(path)
  os.makedirs(path, exist_ok=True)
  ckpt = ocp.StandardCheckpointer()
  arrays = {"cache_state": _nonempty(state), "model_cache": _nonempty(engine.cache)}
  ckpt.save(os.path.join(path, "arrays"), arrays)
  ckpt.wait_until_finished()
  with open(os.path.join(path, "meta.json"), "w") as f:
    json.dump(_meta(engine), f, indent=1, sort_keys=True)
  return path


def restore_warm_cache(engine: Engine, path: str) -> None:
  """Loads a `save_warm_cache` checkpoint into an idle engine with the same configs and seed.

  Raises:
    ValueError: the engine is busy, or its model config, cache config or seed differ from
      the checkpoint's (the field is named).
  """
  _check_idle(engine, "restore")
  path = os.path.abspath(path)
  with open(os.path.join(path, "meta.json")) as f:
    saved = json.load(f)
  mine = json.loads(json.dumps(_meta(engine)))
  for key in ("model_config", "cache_config", "seed"):
    if saved[key] != mine[key]:
      raise ValueError(
        f"{key} of the engine ({mine[key]!r:.200}) differs from the checkpoint's "
        f"({saved[key]!r:.200})"
      )
  state = _state_of(engine)
  live = {"cache_state": _nonempty(state), "model_cache": _nonempty(engine.cache)}
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, live)
  out = ocp.StandardCheckpointer().restore(os.path.join(path, "arrays"), target)
  engine.manager.state = _merge(state, out["cache_state"])
  engine.cache = _merge(engine.cache, out["model_cache"])
  engine.manager.refresh_stats()  # the host-side pool counters follow the restored state
