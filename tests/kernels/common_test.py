"""Tests for kernels.pallas.common.resolve_implementation."""

import jax
import pytest

from kernels.pallas import common


def test_default_follows_backend():
  expected = "pallas" if jax.default_backend() in ("gpu", "cuda") else "xla"
  assert common.resolve_implementation(None) == expected


@pytest.mark.parametrize("name", ["xla", "pallas", "interpret"])
def test_explicit_names_pass_through(name):
  assert common.resolve_implementation(name) == name


@pytest.mark.parametrize("bad", ["triton", "XLA", ""])
def test_unknown_name_raises(bad):
  with pytest.raises(ValueError, match="implementation"):
    common.resolve_implementation(bad)
