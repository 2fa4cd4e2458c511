"""Runs a grid of gin bindings, one workdir per point, sequentially (one process each).

  python -m experiments.sweep --gin_file=configs/experiments/quickstart.gin \
      --sweep='quickstart.run.prefix_len=[128,250]' --sweep='run.run_experiment.seed=[0,1]' \
      --workdir=runs/qs_sweep

Each point gets `workdir/<name>=<value>,.../` with its config.gin and results.json (written
by `experiments.run` in a fresh `python -m experiments.run` process: JAX is never forked).
"""

from __future__ import annotations

import ast
import itertools
import os
import subprocess
import sys
from collections.abc import Sequence

from absl import app
from absl import flags

from experiments import run as run_lib

# --gin_file, --gin_bindings and --workdir are experiments.run's flags (one flag registry).
_SWEEP = flags.DEFINE_multi_string("sweep", [], "NAME=[v1,v2,...] (Python literals).")


def parse_axis(spec: str) -> tuple[str, list]:
  """'a.b=[1,2]' -> ('a.b', [1, 2]); ValueError naming the spec when malformed."""
  name, sep, values = spec.partition("=")
  if not sep or not name.strip():
    raise ValueError(f"sweep must look like NAME=[v1,v2], got {spec!r}")
  try:
    vals = ast.literal_eval(values.strip())
  except (ValueError, SyntaxError) as e:
    raise ValueError(f"sweep values of {name!r} must be a Python list literal: {e}") from None
  if not isinstance(vals, list) or not vals:
    raise ValueError(f"sweep values of {name!r} must be a non-empty list, got {values!r}")
  return name.strip(), vals


def points(specs: Sequence[str]) -> list[list[str]]:
  """The grid as lists of gin bindings (cartesian product, first axis slowest)."""
  axes = [parse_axis(s) for s in specs]
  out = []
  for combo in itertools.product(*[v for _, v in axes]):
    out.append([f"{n} = {v!r}" for (n, _), v in zip(axes, combo)])
  return out


def point_dir(parent: str, bindings: Sequence[str]) -> str:
  name = ",".join(b.replace(" ", "").rsplit(".", 1)[-1] for b in bindings) or "default"
  return os.path.join(parent, name.replace("/", "_"))


def main(argv: Sequence[str]) -> None:
  del argv
  parent = run_lib._WORKDIR.value or "runs/sweep"
  for binds in points(_SWEEP.value):
    wd = point_dir(parent, binds)
    cmd = [sys.executable, "-m", "experiments.run", f"--workdir={wd}"]
    cmd += [f"--gin_file={f}" for f in run_lib._GIN_FILE.value]
    cmd += [f"--gin_bindings={b}" for b in list(run_lib._GIN_BINDINGS.value) + binds]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


if __name__ == "__main__":
  app.run(main)
