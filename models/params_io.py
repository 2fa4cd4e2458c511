"""Save and restore model parameters with Orbax (StandardSave / StandardRestore).

The parameters are the `nnx.State` half of `nnx.split(model)`, saved as a pure nested dict
(`nnx.to_pure_dict`). Restoring needs an abstract target built from a model of the same
config (`nnx.eval_shape`, no weights materialised), so dtypes and shapes are checked.

  save_params(path, model)
  model2 = restore_params(path, cfg)          # a HybridLM with the saved weights
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp
from flax import nnx

from models.config import ModelConfig
from models.hybrid_lm import HybridLM


def save_params(path: str | os.PathLike, model: HybridLM) -> None:
  """Writes `model`'s parameters to the new directory `path` (absolute or relative)."""
  path = os.path.abspath(os.fspath(path))
  _, state = nnx.split(model)
  with ocp.Checkpointer(ocp.StandardCheckpointHandler()) as ckptr:
    ckptr.save(path, args=ocp.args.StandardSave(nnx.to_pure_dict(state)))


def restore_params(path: str | os.PathLike, cfg: ModelConfig) -> HybridLM:
  """Returns a `HybridLM(cfg)` whose parameters are read from `path`.

  Raises:
    ValueError: `path` does not exist, or the checkpoint does not match `cfg`'s shapes.
  """
  path = os.path.abspath(os.fspath(path))
  if not os.path.isdir(path):
    raise ValueError(f"path={path!r} is not a checkpoint directory")
  abstract = nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0)))
  graphdef, abs_state = nnx.split(abstract)
  target = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=_default_sharding()),
    nnx.to_pure_dict(abs_state),
  )
  with ocp.Checkpointer(ocp.StandardCheckpointHandler()) as ckptr:
    try:
      restored = ckptr.restore(path, args=ocp.args.StandardRestore(target))
    except (ValueError, KeyError) as e:
      raise ValueError(f"checkpoint at path={path!r} does not match the config: {e}") from e
  nnx.replace_by_pure_dict(abs_state, restored)
  return nnx.merge(graphdef, abs_state)


def _default_sharding() -> jax.sharding.Sharding:
  return jax.sharding.SingleDeviceSharding(jax.devices()[0])
