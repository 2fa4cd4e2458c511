"""Core-backed simulator policies: hand-checked hits, sizing, backends agree, oracle bound,
and the state invariants after every simulated request (soak)."""

import dataclasses

import pytest

from hybrid_cache.core import invariants
from hybrid_cache.sim import core_groups
from hybrid_cache.sim import core_sim
from hybrid_cache.sim.oracle import oracle_reused
from hybrid_cache.sim.simulate import simulate
from hybrid_cache.sim.testing import M7B
from hybrid_cache.sim.testing import TINY
from hybrid_cache.sim.testing import small_chat
from hybrid_cache.sim.testing import trace_of

ATTN_ONLY = dataclasses.replace(TINY, name="tiny_attn", n_recurrent=0)


# R0 computes [1..16] (align: chunks end at 12 = floor(15/4)*4, then 16). R1 shares blocks
# [1-4] [5-8] then diverges; R2 shares the same 8 tokens (third occurrence).
SHARED = trace_of(
  (list(range(1, 17)), []),
  (list(range(1, 9)) + list(range(30, 38)), []),
  (list(range(1, 9)) + list(range(40, 48)), []),
)


@pytest.mark.parametrize(
  "policy, model, expected",
  [
    ("vllm_none", TINY, [0, 0, 0]),  # no recurrent state is ever cached
    ("align_dense_no_junction", TINY, [0, 0, 0]),  # states only at 12 and 16 (R0), 12 and 16 (R1)
    ("vllm_align_dense", TINY, [0, 0, 8]),  # R1 cuts a chunk at the junction 8
    ("vllm_default", TINY, [0, 0, 8]),  # vLLM 0.33 default: junction + sparse retention
    ("all_dense_no_junction", TINY, [0, 8, 8]),  # a state at every block boundary
    ("vllm_default", ATTN_ONLY, [0, 8, 8]),  # attention only: longest block prefix
  ],
)
def test_hand_checked_hits(policy, model, expected):
  tri, extra = simulate(SHARED, model, 34 * 100, policy, 4, core={"backend": "reference"})
  assert [r for _, _, r in tri] == expected
  assert extra["backend"] == "reference" and extra["block_size"] == 4


def test_sizing_pages_and_padding():
  cfg, sizing = core_sim.build_config(SHARED, TINY, 34 * 100 + 33, "vllm_default", 4)
  # page = max(KV 4 B x 4 tokens = 16, state 34) = 34 B -> 100 pages + the null block.
  assert cfg.num_blocks == 101 and sizing["page_bytes"] == 34
  assert sizing["groups"] == ["full", "mamba"]
  assert sizing["page_padding"] == pytest.approx([1 - 16 / 34, 0.0])
  assert cfg.retention_interval == 0 and cfg.marconi_junction
  cfg2, _ = core_sim.build_config(SHARED, TINY, 3400, "align_dense_no_junction", 4, retention=8)
  assert cfg2.retention_interval == 8 and not cfg2.marconi_junction
  with pytest.raises(ValueError, match="capacity_bytes must be >="):
    core_sim.build_config(SHARED, TINY, 34 * 5, "all_dense_no_junction", 4)
  with pytest.raises(ValueError, match="policy must be one of"):
    core_sim.build_config(SHARED, TINY, 3400, "magic", 4)
  with pytest.raises(ValueError, match="backend must be one of"):
    core_sim.make_manager(cfg, "gpu")


@pytest.mark.parametrize("policy", ["vllm_default", "vllm_align_dense"])
def test_jax_and_reference_backends_agree(policy):
  tr = small_chat(40)
  cap = 34 * 60  # forces evictions
  a, ea = simulate(tr, TINY, cap, policy, 4, core={"backend": "reference"})
  b, eb = simulate(tr, TINY, cap, policy, 4, core={"backend": "jax"})
  assert a == b
  assert ea["final_cached_blocks_per_group"] == eb["final_cached_blocks_per_group"]
  assert sum(r for _, _, r in a) > 0


@pytest.mark.parametrize(
  "policy", ["align_dense_no_junction", "vllm_default", "vllm_align_dense", "all_dense_no_junction"]
)
def test_bounded_by_oracle(policy):
  tr = small_chat(120, seed=3)
  o = oracle_reused(tr, 4).tolist()
  tri, _ = simulate(tr, TINY, 34 * 80, policy, 4, core={"backend": "reference"})
  assert all(r <= b for (_, _, r), b in zip(tri, o))


def test_flop_aware_reference_backend_bounded_by_oracle():
  tr = small_chat(120, seed=3)
  o = oracle_reused(tr, 4).tolist()
  tri, _ = simulate(tr, TINY, 34 * 80, "flop_aware", 4, core={"backend": "reference"})
  assert all(r <= b for (_, _, r), b in zip(tri, o))


def _soak(n):
  tr = small_chat(n, seed=7)
  cfg, _ = core_sim.build_config(tr, TINY, 34 * 70, "vllm_default", 4)
  bad = []

  def check(i, m):
    errs = invariants.check_invariants(m.config, m.state)
    if errs:
      bad.append((i, errs))

  tri, counters = core_sim.run_core(tr, cfg, "jax", on_request=check)
  assert bad == []
  assert len(tri) == n and sum(r for _, _, r in tri) > 0
  assert counters["final_cached_blocks_per_group"][1] > 0


def test_invariants_soak_1k():
  _soak(1000)


@pytest.mark.slow
def test_invariants_soak_10k():
  _soak(10_000)


def test_eviction_costs_follow_marconi_formulas():
  d, n = M7B.d_model, M7B.ssm_state_dim
  groups = core_groups.model_groups(M7B, "align")
  c = core_groups.eviction_costs(M7B, groups, 64)
  # full group: 4 attention layers (8 L D^2 + 4 L^2 D) + 28 MLP layers (16 L D^2)
  assert c["eviction_flops_linear"][0] == pytest.approx(4 * 8 * d**2 + 28 * 16 * d**2)
  assert c["eviction_flops_quadratic"][0] == pytest.approx(4 * 4 * d)
  # recurrent group: 24 SSM layers, linear only
  assert c["eviction_flops_linear"][1] == pytest.approx(24 * (12 * d**2 + 16 * d * n + 10 * d))
  assert c["eviction_flops_quadratic"][1] == pytest.approx(0.0, abs=1e-3)
  assert c["eviction_block_bytes"] == (26_787_840.0, 26_787_840.0)  # one page each
