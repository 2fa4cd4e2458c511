"""Integer helpers of vLLM's block rules: ceil division, and flooring to a multiple."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
  return -(-a // b)


def floor_to(x: int, m: int) -> int:
  return (x // m) * m
