"""offline_bound: bound >= brute-force optimum >= clairvoyant >= 0, bound >= every policy."""

import dataclasses
import itertools
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from hybrid_cache import profiles
from hybrid_cache.sim import offline_bound as ob
from hybrid_cache.sim.cli import main
from hybrid_cache.sim.cost_model import MODELS
from hybrid_cache.sim.cost_model import get_model
from hybrid_cache.sim.metrics import flops_saved
from hybrid_cache.sim.offline_bound import feasible
from hybrid_cache.sim.offline_bound import offline_bound
from hybrid_cache.sim.oracle import oracle_reused
from hybrid_cache.sim.policies import CORE_POLICIES
from hybrid_cache.sim.simulate import simulate
from hybrid_cache.sim.testing import TINY
from hybrid_cache.sim.testing import small_chat
from hybrid_cache.sim.testing import trace_of
from hybrid_cache.sim.trace import write_marconi

ATTN_ONLY = dataclasses.replace(TINY, name="tiny_attn", n_recurrent=0)
# generic FLOPs with a 3-token sliding window (gain not convex at 3), GDN state 22 B, KV 4 B/token
SWA_GDN = dataclasses.replace(
  get_model("gemma3_4b"),
  name="tiny_swa_gdn",
  d_model=1,
  n_attn=1,
  n_swa=1,
  swa_window=3,
  n_recurrent=1,
  recurrent="gdn",
  n_mlp=1,
  q_heads=1,
  kv_heads=1,
  head_dim=1,
  rec_heads=1,
  rec_dk=1,
  rec_dv=1,
  rec_groups=1,
  d_ff=1,
)
SHARED = trace_of(
  (list(range(1, 17)), []),
  (list(range(1, 9)) + list(range(30, 38)), []),
  (list(range(1, 9)) + list(range(40, 48)), []),
)
CHAT = trace_of(
  ([1, 2, 3, 4, 5, 6], [7, 8]),
  ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [11, 12]),
  ([1, 2, 3, 4, 20, 21], [22]),
  ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [15]),
  ([1, 2, 3, 4, 20, 21, 22, 23], [24, 25]),
)


def _passes(req, prefix):
  seq = req.seq.tolist()
  return len(seq) >= len(prefix) and tuple(seq[: len(prefix)]) == prefix


def _brute_force(trace, model, cap, unit, gain):
  """Best total gain over every hit vector whose held items fit `cap` at every arrival.

  Items are named by their prefix: a hit of h on r needs the state ("s", P_r(h)) and the KV
  ("k", P_r(l)) for l in 1..h, each held from the last earlier request that passed it.
  """
  reqs = trace.requests
  choices = []
  for r, req in enumerate(reqs):
    inp = tuple(req.seq[: req.num_input_symbols].tolist())
    hs = [0]
    for h in range(unit, len(inp) + 1, unit):
      if any(_passes(q, inp[:h]) for q in reqs[:r]):
        hs.append(h)
    choices.append(hs)
  best = 0
  for hv in itertools.product(*choices):
    ok = True
    for t in range(len(reqs)):
      items = set()
      for r in range(t, len(reqs)):
        h = hv[r]
        if not h:
          continue
        inp = tuple(reqs[r].seq[:h].tolist())
        between = reqs[t:r]
        if not any(_passes(q, inp) for q in between):
          items.add(("s", inp))
        for ln in range(1, h + 1):
          if not any(_passes(q, inp[:ln]) for q in between):
            items.add(("k", inp[:ln]))
      nbytes = sum(model.state_bytes if k == "s" else model.kv_bytes_per_token for k, _ in items)
      if nbytes > cap:
        ok = False
        break
    if ok:
      best = max(best, sum(gain(h) for h in hv))
  return best


def _check_chain(trace, model, cap, unit):
  res = offline_bound(trace, model, cap, unit, iterations=60)
  bf_flops = _brute_force(
    trace, model, cap, unit, lambda h: int(model.prefill_flops(h)) if h else 0
  )
  bf_tokens = _brute_force(trace, model, cap, unit, lambda h: h)
  assert res.bound_flops >= bf_flops >= res.clairvoyant_flops >= 0
  assert res.bound_tokens >= bf_tokens >= 0
  assert feasible(trace, model, cap, unit, res.clairvoyant_h)
  assert res.clairvoyant_flops == flops_saved(model, res.clairvoyant_h)
  oracle = oracle_reused(trace, unit)
  assert res.bound_tokens <= oracle.sum()
  assert res.bound_flops <= flops_saved(model, oracle)
  return res, bf_flops, bf_tokens


@pytest.mark.parametrize("cap", [34, 34 + 4 * 4, 34 + 4 * 8, 2 * 34 + 4 * 8, 3 * 34 + 4 * 16])
@pytest.mark.parametrize("unit", [1, 4])
def test_bound_brute_force_clairvoyant_chain_shared(cap, unit):
  _check_chain(SHARED, TINY, cap, unit)


@pytest.mark.parametrize("cap", [40, 60, 80, 120, 200])
@pytest.mark.parametrize("unit", [2, 4])
def test_bound_brute_force_clairvoyant_chain_chat(cap, unit):
  _check_chain(CHAT, TINY, cap, unit)


@pytest.mark.parametrize("cap", [30, 40, 50, 70, 100])
@pytest.mark.parametrize("unit", [1, 2])
def test_bound_brute_force_clairvoyant_chain_sliding_window(cap, unit):
  _check_chain(CHAT, SWA_GDN, cap, unit)


def test_loose_capacity_is_the_oracle():
  res = offline_bound(CHAT, TINY, 10**6, 2)
  oracle = oracle_reused(CHAT, 2)
  assert res.bound_tokens == res.clairvoyant_tokens == oracle.sum()
  assert res.bound_flops == res.clairvoyant_flops == flops_saved(TINY, oracle)
  assert res.best_iteration_flops == 0


def test_tight_capacity_cuts_the_bound():
  tight = offline_bound(CHAT, TINY, 40, 2)
  assert tight.bound_tokens < oracle_reused(CHAT, 2).sum()
  assert offline_bound(CHAT, TINY, 33, 2).bound_flops == 0  # not even one state fits


@st.composite
def _tiny_traces(draw):
  n = draw(st.integers(3, 5))
  reqs = []
  for _ in range(n):
    base = []
    if reqs and draw(st.booleans()):
      i, o = draw(st.sampled_from(reqs))
      base = i + o
    keep = draw(st.integers(0, len(base)))
    inp = base[:keep] + draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    out = draw(st.lists(st.integers(1, 3), max_size=2))
    reqs.append((inp[:7], out))
  return (
    trace_of(*reqs),
    draw(st.sampled_from([34, 40, 50, 80, 120])),
    draw(st.sampled_from([1, 2])),
  )


@settings(max_examples=40, deadline=None)
@given(_tiny_traces())
def test_chain_on_random_tiny_traces(case):
  trace, cap, unit = case
  _check_chain(trace, TINY, cap, unit)


@pytest.mark.parametrize(
  "model, n, cap",
  [(TINY, 120, 34 * 50), (TINY, 40, 34 * 90), (ATTN_ONLY, 80, 400), (ATTN_ONLY, 80, 800)],
)
def test_bound_above_every_core_policy(model, n, cap):
  tr = small_chat(n, seed=3)
  res = offline_bound(tr, model, cap, 4)
  assert res.bound_tokens < res.oracle_tokens or n == 40  # the capacity binds
  for policy in CORE_POLICIES:
    # eviction `tuned` (`tuned`, `adaptive`) runs its shadow tuner on the scan only: checked
    # at the first point
    shadowed = profiles.get(policy).eviction == "tuned"
    if shadowed and (n, cap) != (120, 34 * 50):
      continue
    backend = "jax" if shadowed else "reference"
    tri, _ = simulate(tr, model, cap, policy, 4, core={"backend": backend})
    reused = np.asarray([t[2] for t in tri])
    assert res.bound_tokens >= reused.sum(), policy
    assert res.bound_flops >= flops_saved(model, reused), policy


@pytest.mark.parametrize("policy", ["marconi_compat", "marconi_compat_sglang"])
def test_bound_above_marconi_policies(policy):
  tr = small_chat(40, seed=3)
  cap = 34 * 20
  res = offline_bound(tr, TINY, cap, 1)
  tri, _ = simulate(tr, TINY, cap, policy, 1)
  reused = np.asarray([t[2] for t in tri])
  assert res.bound_tokens >= reused.sum()
  assert res.bound_flops >= flops_saved(TINY, reused)


def test_bad_arguments():
  for kw, msg in (
    (dict(unit=0), "unit"),
    (dict(capacity_bytes=0), "capacity_bytes"),
    (dict(capacity_bytes=float("inf")), "capacity_bytes"),
    (dict(iterations=-1), "iterations"),
    (dict(objective="x"), "objective"),
  ):
    args = dict(capacity_bytes=100, unit=2) | kw
    cap, unit = args.pop("capacity_bytes"), args.pop("unit")
    with pytest.raises(ValueError, match=msg):
      offline_bound(CHAT, TINY, cap, unit, **args)


def _cli(tmp_path, capsys, *extra):
  path = tmp_path / "t.jsonl"
  write_marconi(small_chat(30, seed=1), path)
  base = ["--trace", str(path), "--format", "marconi", "--model", "tiny_cli", "--policy"]
  rc = main(base + ["offline_bound", *extra])
  out = capsys.readouterr()
  return rc, out.out, out.err


@pytest.fixture
def tiny_registered(monkeypatch):
  monkeypatch.setitem(MODELS, "tiny_cli", dataclasses.replace(TINY, name="tiny_cli"))


def test_cli_offline_bound(tmp_path, capsys, tiny_registered):
  rc, out, err = _cli(tmp_path, capsys, "--capacity-bytes", "700", "--block-size", "2")
  assert rc == 0, err
  s = json.loads(out)
  for key in ("token_hit_rate", "flops_saved", "bound_flops_saved", "bound_tokens_reused"):
    assert key in s
  assert s["bound_flops_saved"] >= s["clairvoyant_flops_saved"] == s["flops_saved"] > 0
  assert s["bound_tokens_reused"] >= s["tokens_reused"]
  assert s["bound_tokens_reused"] <= s["oracle_tokens_reused"]
  assert s["block_size"] == 2


@pytest.mark.parametrize(
  "extra, needle",
  [
    (["--capacity-bytes", "700", "--block-size", "0"], "--block-size"),
    (["--capacity-bytes", "700", "--bound-iterations", "-3"], "--bound-iterations"),
    (["--capacity-bytes", "-1"], "--capacity-bytes"),
    (["--capacity-bytes", "10"], "capacity_bytes must be >="),
  ],
)
def test_cli_offline_bound_bad_input(tmp_path, capsys, tiny_registered, extra, needle):
  rc, out, err = _cli(tmp_path, capsys, *extra)
  assert rc == 2 and not out
  assert err.count("\n") == 1 and err.startswith("error:") and needle in err


@pytest.mark.parametrize("model", [TINY, SWA_GDN])
@pytest.mark.parametrize("unit", [1, 3])
def test_inner_max_over_piece_ends_is_the_max_over_every_hit(model, unit):
  """L(lam) from the evaluated candidates == L(lam) with every multiple of u (random lam)."""
  tr = small_chat(25, seed=5)
  cap = 300
  p = ob._build(tr, model, cap, unit, True)
  gain = ob._gains(p, model, "flops")
  dual = ob._Dual(p, gain)
  rng = np.random.default_rng(0)
  for scale in (0.003, 0.01, 0.03, 0.1, 0.3):
    lam = rng.exponential(scale, p.n) * (rng.random(p.n) < 0.5)
    got = dual.evaluate(lam)[0]
    want = lam.sum()
    for r in range(p.n):
      best = 0.0
      for h in range(unit, int(p.oracle_h[r]) + 1, unit):
        hv = np.zeros(p.n, np.int64)
        hv[r] = h
        price = lam @ ob.load_of(p, hv) / cap
        best = max(best, float(model.prefill_flops(h)) / dual.scale - price)
      want += best
    assert got == pytest.approx(want, rel=1e-12)


def test_candidates_are_piece_ends_split_at_the_window():
  # request 1 of CHAT shares 8 tokens (one piece (0, 8]); request 3 shares 4 then 12 tokens
  def cands(model):
    p = ob._build(CHAT, model, 1000, 1, True)
    return {r: [int(h) for rr, h in zip(p.cand_r, p.cand_h) if rr == r] for r in (1, 3)}

  assert cands(TINY) == {1: [1, 8], 3: [1, 4, 5, 12]}
  assert cands(SWA_GDN) == {1: [1, 3, 4, 8], 3: [1, 3, 4, 5, 12]}  # window 3 splits (0, 4]
