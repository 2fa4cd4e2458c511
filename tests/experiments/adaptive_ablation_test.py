"""experiments.adaptive_ablation: every arm per (seed, capacity), step ratios that multiply to
the total, the arms replayed at the checkpoint unit equal to their own runs."""

import math
import os

import numpy as np
import pytest

from experiments import adaptive_ablation
from experiments.beyond_vllm import load
from hybrid_cache.sim import checkpoint_policies as cp
from hybrid_cache.sim.cost_model import get_model
from hybrid_cache.sim.metrics import flops_saved

PARAMS = {"num_sessions": 4, "sys_prompt_len": 300, "obs_mean": 60.0, "max_turns": 6}


def test_ablation_records(tmp_path):
  out = adaptive_ablation.run(
    str(tmp_path),
    trace="agentic",
    fmt="synthetic",
    capacities=(1.5e9, 3e9),
    seeds=(0, 1),
    block_size=128,
    checkpoint_unit=64,
    params=PARAMS,
    backend="reference",
  )
  recs = out["records"]
  assert out["arms"] == list(adaptive_ablation.ARMS)
  assert [(r["seed"], r["capacity_bytes"]) for r in recs] == [
    (0, 1.5e9),
    (0, 3e9),
    (1, 1.5e9),
    (1, 3e9),
  ]
  model = get_model("marconi_7b")
  for r in recs:
    f = r["flops"]
    assert set(f) == set(adaptive_ablation.ARMS) and all(v > 0 for v in f.values())
    assert math.isclose(math.prod(r["step"].values()), r["total"], rel_tol=1e-9)
    assert r["total"] == f["adaptive"] / f["vllm_best"]
    # the eviction arm is `run_checkpoint` with hits/1 fixed at the checkpoint unit
    tr = load("agentic", "synthetic", r["seed"], params=PARAMS)
    triples, _ = cp.run_checkpoint(tr, model, r["capacity_bytes"], "adaptive", 64, 128, 1.0)
    assert f["eviction"] == flops_saved(model, np.array([t[2] for t in triples], np.int64))
  assert os.path.isfile(os.path.join(tmp_path, "ablation.png"))


def test_ablation_rejects_bad_input(tmp_path):
  with pytest.raises(ValueError, match="capacities must hold at least one"):
    adaptive_ablation.ablate("agentic", "synthetic", (), params=PARAMS)
  with pytest.raises(ValueError, match="does not exist"):
    adaptive_ablation.run(str(tmp_path), trace="nope.jsonl", fmt="mooncake")
