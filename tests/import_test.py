"""Our top-level packages must resolve to this repository, not PyPI's `kernels`/`models`."""

import pathlib

import experiments
import hybrid_cache
import kernels
import models

_ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_packages_resolve_to_repo():
  for mod in (hybrid_cache, kernels, models, experiments):
    path = pathlib.Path(mod.__file__).resolve()
    assert _ROOT in path.parents, f"{mod.__name__} imported from {path}"
