"""Runs one experiment from a gin file: `python -m experiments.run --gin_file=F [--workdir=D]`.

The gin file binds `run.run_experiment.experiment` to an experiment function (any callable
`fn(workdir: str) -> dict`) and configures it. Library code stays gin-free: gin files use
`from __gin__ import dynamic_registration` to bind undecorated functions and classes.

Writes into `--workdir` (default `runs/<gin file stem>`):
  config.gin    the operative config (what the run actually used), written after the run
  results.json  the dict the experiment returned, plus `seed`, `gin_files`, `gin_bindings`
  *.png         plots the experiment saved into the workdir
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import gin
from absl import app
from absl import flags
from absl import logging

if __name__ == "__main__":
  # Under `python -m experiments.run`, gin files' `from experiments import run` must get this
  # very module (same flags, same `run_experiment`), not a second copy.
  import sys

  sys.modules.setdefault("experiments.run", sys.modules[__name__])

_CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"

_GIN_FILE = flags.DEFINE_multi_string("gin_file", [], "Gin config files (relative to configs/ ok).")
_GIN_BINDINGS = flags.DEFINE_multi_string("gin_bindings", [], "Extra gin bindings.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (default runs/<gin stem>).")


def run_experiment(
  experiment: Callable[..., dict[str, Any]] = gin.REQUIRED, seed: int = 0, workdir: str = ""
) -> dict[str, Any]:
  """Calls `experiment(workdir=..., seed=...)` and returns its results dict."""
  return experiment(workdir=workdir, seed=seed)


def _jsonable(x: Any) -> Any:
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, list | tuple):
    return [_jsonable(v) for v in x]
  if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
    return x.item()
  if hasattr(x, "tolist"):
    return x.tolist()
  return x


def execute(
  gin_files: Sequence[str], gin_bindings: Sequence[str], workdir: str | None
) -> dict[str, Any]:
  """Parses the config, runs the experiment, writes config.gin and results.json."""
  if not gin_files:
    raise ValueError("--gin_file is required (e.g. configs/experiments/quickstart.gin)")
  gin.add_config_file_search_path(str(_CONFIGS))
  gin.add_config_file_search_path(str(_CONFIGS.parent))
  gin.parse_config_files_and_bindings(list(gin_files), list(gin_bindings), finalize_config=True)
  if workdir is None:
    workdir = os.path.join("runs", pathlib.Path(gin_files[0]).stem)
  os.makedirs(workdir, exist_ok=True)
  logging.info("Config:\n%s", gin.config_str())
  start = time.perf_counter()
  configured = gin.get_configurable(run_experiment)
  results = configured(workdir=workdir)
  results = dict(_jsonable(results))
  results.setdefault("total_wall_s", time.perf_counter() - start)
  results["gin_files"] = list(gin_files)
  results["gin_bindings"] = list(gin_bindings)
  with open(os.path.join(workdir, "config.gin"), "w") as f:
    f.write(gin.operative_config_str())
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(results, f, indent=1, sort_keys=True)
  logging.info("Wrote %s", workdir)
  return results


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  execute(_GIN_FILE.value, _GIN_BINDINGS.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
