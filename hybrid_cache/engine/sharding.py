"""Heads-sharded placement of the model's parameters and caches on a `jax.sharding.Mesh`.

One mesh axis (named "model", or the mesh's only axis) splits attention KV heads, GDN value
heads and Mamba2 heads, and the sparse MoE experts along their width I (tensor parallel inside
every expert: w_gate / w_up [E, d, I] by columns, w_down [E, I, d] by rows, so each device holds
a slice of every expert and no token moves between devices); everything else (embeddings, norms,
MLPs, MoE routers and shared experts, conv states, step inputs) is replicated. The jitted step
then runs under GSPMD propagation (mesh axes are made `Auto`), so the sharding changes where work
happens, never what is computed.

On XLA:CPU with virtual devices, start the process with the environment variable NPROC
larger than the number of devices (e.g. NPROC=32 for 8): the CPU client runs every device's
program on an intra-op pool (8 threads seen with 8 devices on the 2-core host), and a LAPACK
custom call (the GDN kernel's triangular solve) splits its work onto the same pool and waits
for it; with every thread in such a wait the step deadlocks. A bigger pool leaves a thread
free.

Example::

  mesh = heads_mesh(4)                  # 4 devices on axis "model"
  check_mesh(model_cfg, mesh)           # ValueError if 4 does not divide the heads
  params = shard_params(params, mesh); cache = shard_cache(cache, mesh)
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from models.cache import ModelCache
from models.config import ModelConfig

AXIS = "model"

# Parameter path suffixes whose kernels are split along heads: (module name, spec).
_COLUMN = ("q_proj", "k_proj", "v_proj", "in_proj_z")  # [d, heads * dim]: split outputs
_ROW = ("o_proj", "out_proj")  # [heads * dim, d]: split inputs
_EXPERT_COLUMN = ("w_gate", "w_up")  # MoE experts [E, d, I]: split I
_EXPERT_ROW = ("w_down",)  # [E, I, d]: split I


def heads_mesh(num_devices: int | None = None) -> Mesh:
  """A 1-D mesh over the first `num_devices` devices (all by default), axis "model", Auto."""
  devs = jax.devices()
  n = len(devs) if num_devices is None else num_devices
  if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(devs):
    raise ValueError(f"num_devices must be in [1, {len(devs)}], got {num_devices!r}")
  return Mesh(np.asarray(devs[:n]), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,))


def _axis(mesh: Mesh) -> str:
  if AXIS in mesh.axis_names:
    return AXIS
  if len(mesh.axis_names) == 1:
    return mesh.axis_names[0]
  raise ValueError(
    f"mesh.axis_names must contain {AXIS!r} (or be a single axis), got {mesh.axis_names}"
  )


def as_auto(mesh: Mesh) -> Mesh:
  """The same mesh with every axis `Auto` (GSPMD propagation; see ecosystem brief §6)."""
  auto = (jax.sharding.AxisType.Auto,) * len(mesh.axis_names)
  return Mesh(mesh.devices, mesh.axis_names, axis_types=auto)


def check_mesh(cfg: ModelConfig, mesh: Mesh) -> None:
  """Raises ValueError naming the field when the mesh axis size does not divide the heads
  (or the MoE experts' width)."""
  if not isinstance(mesh, Mesh):
    raise ValueError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
  n = mesh.shape[_axis(mesh)]
  fields = []
  if cfg.count("AS"):
    fields += ["num_heads", "num_kv_heads"]
  if cfg.count("G"):
    fields += ["gdn_num_k_heads", "gdn_num_v_heads"]
  if cfg.count("M"):
    fields += ["mamba_num_heads"]
  if cfg.moe_layers:
    fields += ["moe_hidden"]
  for f in fields:
    v = getattr(cfg, f)
    if v % n:
      raise ValueError(
        f"mesh axis {_axis(mesh)!r} has {n} devices, which does not divide {f}={v}; "
        f"use a mesh size that divides {f}"
      )


def cpu_deadlock_risk(cfg: ModelConfig, mesh: Mesh) -> str | None:
  """Why running `cfg` on `mesh` may deadlock on XLA:CPU, or None when it should not.

  XLA:CPU's intra-op pool has max(NPROC or cores, devices) threads (measured with jax 0.10.2:
  2 cores and 1/4/8/16 devices gave 2/4/8/16 threads; NPROC=16 with 8 devices gave 16). The
  GDN chunk kernel's LAPACK triangular solve blocks a pool thread while its split work waits
  for a free one, so a mesh of at least that many devices can leave no thread to run it.
  NPROC is read when the CPU client starts; this check reads it now.
  """
  if "G" not in cfg.layer_kinds or mesh.devices.size < 2:
    return None
  if any(d.platform != "cpu" for d in mesh.devices.flat):
    return None
  env = os.environ.get("NPROC", "")
  threads = int(env) if env.isdigit() else (os.cpu_count() or 1)
  pool = max(threads, len(jax.devices("cpu")))
  if mesh.devices.size < pool:
    return None
  return (
    f"a mesh of {mesh.devices.size} CPU devices with GDN layers can deadlock XLA:CPU (its "
    f"intra-op pool has ~{pool} threads, all of which the LAPACK triangular solve may block); "
    f"start the process with NPROC > {mesh.devices.size} (e.g. NPROC={4 * mesh.devices.size})"
  )


def _param_spec(path, leaf, axis: str) -> P:
  names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
  if getattr(leaf, "ndim", 0) == 3:
    if any(n in _EXPERT_COLUMN for n in names):
      return P(None, None, axis)
    if any(n in _EXPERT_ROW for n in names):
      return P(None, axis, None)
  if getattr(leaf, "ndim", 0) == 2 and "kernel" in names:
    if any(n in _COLUMN for n in names):
      return P(None, axis)
    if any(n in _ROW for n in names):
      return P(axis, None)
  return P()


def shard_params(params, mesh: Mesh):
  """`device_put` of an `nnx.State` with heads-split projection kernels (rest replicated)."""
  axis = _axis(mesh)
  specs = jax.tree_util.tree_map_with_path(lambda p, x: _param_spec(p, x, axis), params)
  shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
  return jax.device_put(params, shardings)


def cache_shardings(mesh: Mesh) -> ModelCache:
  """`NamedSharding`s of each `ModelCache` leaf: heads axes split, conv states replicated."""
  a = _axis(mesh)
  ns = lambda *s: NamedSharding(mesh, P(*s))
  return ModelCache(
    k=ns(None, None, None, a, None),
    v=ns(None, None, None, a, None),
    gdn_state=ns(None, None, a, None, None),
    gdn_conv=ns(),
    mamba_state=ns(None, None, a, None, None),
    mamba_conv=ns(),
  )


def _placed_cache_shardings(cache: ModelCache, mesh: Mesh) -> ModelCache:
  """`cache_shardings(mesh)`, with families without layers (empty arrays) replicated."""
  rep = NamedSharding(mesh, P())
  return jax.tree.map(lambda x, s: s if x.shape[0] else rep, cache, cache_shardings(mesh))


def shard_cache(cache: ModelCache, mesh: Mesh) -> ModelCache:
  """`device_put` of the cache with `cache_shardings(mesh)` (families without layers, whose
  arrays are empty, are replicated)."""
  return jax.device_put(cache, _placed_cache_shardings(cache, mesh))


def constrain_cache(cache: ModelCache, mesh: Mesh) -> ModelCache:
  """Inside jit: pins the cache to the shardings `shard_cache` gives it.

  A jitted step that returns the cache must give it back on its input shardings, otherwise
  GSPMD may pick others and the next step (fed the returned cache) compiles again.
  """
  return jax.lax.with_sharding_constraint(cache, _placed_cache_shardings(cache, mesh))


def replicate(tree, mesh: Mesh):
  """`device_put` of a pytree, replicated on every device of the mesh."""
  return jax.device_put(tree, NamedSharding(mesh, P()))
