"""Sweep grid expansion (no JAX)."""

from __future__ import annotations

import pytest

from experiments import sweep


def test_points_are_the_cartesian_product():
  pts = sweep.points(["a.x=[1, 2]", "b.y=['p', 'q']"])
  assert pts == [
    ["a.x = 1", "b.y = 'p'"],
    ["a.x = 1", "b.y = 'q'"],
    ["a.x = 2", "b.y = 'p'"],
    ["a.x = 2", "b.y = 'q'"],
  ]
  assert sweep.point_dir("runs", pts[0]) == "runs/x=1,y='p'"


@pytest.mark.parametrize("bad", ["novalue", "a.x=3", "a.x=[]", "a.x=[1,"])
def test_bad_axis_raises_naming_it(bad):
  with pytest.raises(ValueError, match="sweep"):
    sweep.parse_axis(bad)
