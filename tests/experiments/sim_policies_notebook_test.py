"""Runs experiments/notebooks/sim_policies.py (jupytext percent format) at tiny size: the
parameters cell is followed by overrides, as papermill would inject them."""

import os

import jupytext
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "experiments", "notebooks", "sim_policies.py")


def _run(overrides: dict) -> dict:
  nb = jupytext.read(NOTEBOOK)
  ns: dict = {}
  saw_params = False
  for cell in nb.cells:
    if cell.cell_type != "code":
      continue
    exec(compile(cell.source, NOTEBOOK, "exec"), ns)  # noqa: S102
    if "parameters" in cell.metadata.get("tags", []):
      saw_params = True
      ns.update(overrides)
  assert saw_params, "the notebook needs a cell tagged 'parameters'"
  return ns


@pytest.mark.notebook
def test_sim_policies_notebook_tiny(tmp_path):
  ns = _run(
    {
      "LIMIT": 30,
      "CHAT_SESSIONS": 3,
      "SHAREGPT_SESSIONS": 2,
      "CAPACITIES": {
        "conversation": (1e10, 4e10),
        "synthetic": (2e10,),
        "chat": (2e9,),
        "sharegpt": (1e9,),
      },
      "POLICIES": (
        "marconi_compat_sglang",
        "marconi_compat_static:1",
        "marconi_compat_vllm",
        "vllm_default",
      ),
      "BACKEND": "reference",  # the scan's compile per capacity is too slow for a unit test
      "OUT_DIR": str(tmp_path),
    }
  )
  for name in (
    "hit_rate_vs_capacity.png",
    "ttft_p95_vs_capacity.png",
    "fraction_of_oracle_vs_capacity.png",
  ):
    assert (tmp_path / name).stat().st_size > 0
  recs = ns["records"]
  names = set(ns["traces"])
  assert {"conversation", "synthetic", "chat"} <= names
  ncap = sum(len(ns["CAPACITIES"][t]) for t in names)
  # one oracle per trace + 4 policies x capacities
  assert len(recs) == len(names) + 4 * ncap
  done = [r for r in recs if "skipped" not in r and r["policy"] != "oracle"]
  assert done and all(0 <= r["fraction_of_oracle"] <= 1 for r in done)
  assert {r["trace"] for r in done} == names
  assert all(ratio > 0 for *_, ratio, _ in ns["flop_vs_lru"])
