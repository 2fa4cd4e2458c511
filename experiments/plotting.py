"""PNG plots for experiment results (matplotlib, Agg backend; no display needed)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def bar_chart(
  path: str, title: str, values: Mapping[str, Mapping[str, float]], metrics: Sequence[str]
) -> str:
  """One panel per metric, one bar per arm: values[arm][metric]. Returns the file path."""
  fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.2), squeeze=False)
  arms = list(values)
  for ax, m in zip(axes[0], metrics):
    ys = [float(values[a][m]) for a in arms]
    ax.bar(arms, ys, color=["#888888", "#4c72b0", "#dd8452", "#55a868"][: len(arms)])
    ax.set_title(m)
    ax.tick_params(axis="x", rotation=20)
  fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def line_chart(
  path: str,
  title: str,
  xs: Sequence[float],
  series: Mapping[str, Mapping[str, Sequence[float]]],
  metrics: Sequence[str],
  xlabel: str,
  xscale: str = "linear",
) -> str:
  """One panel per metric, one line per series: series[name][metric][i] at xs[i] (`xscale`:
  matplotlib's axis scale, e.g. "log")."""
  fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 3.2), squeeze=False)
  for ax, m in zip(axes[0], metrics):
    for name, vals in series.items():
      ax.plot(xs, [float(v) for v in vals[m]], marker="o", label=name)
    ax.set_title(m)
    ax.set_xlabel(xlabel)
    ax.set_xscale(xscale)
    ax.legend()
  fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
