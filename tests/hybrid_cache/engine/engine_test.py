"""Engine tests: exactness of caching on vs off (SPEC D), preemption, sharding, bad input.

Most runs drive the plain-Python `PythonCacheManager` (same protocol and block ids as the jitted
core, no schedule compilations); one test runs the jitted `JaxCacheManager` against it. Every
engine pads T to one bucket so each model compiles once per shape.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from hybrid_cache.config import GroupSpec
from hybrid_cache.engine import sharding as engine_sharding
from hybrid_cache.engine.config import cache_config_for
from hybrid_cache.engine.engine import Engine
from models.config import ModelConfig
from models.config import get_preset

BUDGET = 32
_REPO = pathlib.Path(__file__).resolve().parents[3]


def _prompts(seed, n, prefix_len, suffix_len, vocab=256):
  rng = np.random.RandomState(seed)
  prefix = rng.randint(0, vocab, prefix_len).tolist()
  return [prefix + rng.randint(0, vocab, suffix_len).tolist() for _ in range(n)]


def _run(model, prompts, max_new, *, manager="reference", budget=BUDGET, engine_kw=None, **cc):
  cc.setdefault("block_size", 16)
  cc.setdefault("num_blocks", 96)
  cc.setdefault("max_model_len", 256)
  cc.setdefault("max_requests", 4)
  cfg = cache_config_for(model, max_num_batched_tokens=budget, **cc)
  kw = dict(cache_manager=manager, token_buckets=(budget,), seq_buckets=(8,))
  kw.update(engine_kw or {})
  eng = Engine(model, cfg, seed=0, **kw)
  outs = eng.generate(prompts, max_new, return_logits=True)
  return outs, eng


def _assert_exact(got, want):
  for g, w in zip(got, want, strict=True):
    assert g.finished and w.finished
    assert g.output_tokens == w.output_tokens, (g.request_id, g.output_tokens, w.output_tokens)
    rel = np.max(np.abs(g.logits - w.logits)) / np.max(np.abs(w.logits))
    assert rel <= 1e-5, (g.request_id, rel)


@pytest.mark.parametrize(
  "preset", ["qwen35_tiny", "nemotron_h_tiny", "gemma3_tiny", "hybrid3_tiny"]
)
def test_cached_equals_uncached_with_chunks_windows_and_junctions(preset):
  # Prefix of 72 tokens (not block-aligned), budget 32: chunked prefill, SWA window drops
  # (window 24), and the Marconi junction cut at 64 for the later prompts.
  prompts = _prompts(1, 4, 72, 21)
  off, e_off = _run(preset, prompts, 3, enable_prefix_caching=False)
  on, e_on = _run(preset, prompts, 3)
  _assert_exact(on, off)
  assert e_off.stats.cached_tokens == 0
  assert e_on.stats.cached_tokens > 0
  assert sum(o.num_cached_tokens for o in on[1:]) >= 3 * 48
  # Every prompt token is either a cache hit or computed (no preemption here).
  total = sum(len(p) for p in prompts)
  assert e_on.stats.prefill_tokens_computed + e_on.stats.cached_tokens == total
  assert e_off.stats.prefill_tokens_computed == total


def _two_recurrent_groups(grouping="per_kind"):
  # GDN, SWA, Mamba2, full: with "per_kind" the G and M layers are two recurrent cache groups.
  return get_preset("hybrid3_tiny", layer_pattern="GSMA", recurrent_grouping=grouping)


def test_two_recurrent_groups_cached_equals_uncached():
  model = _two_recurrent_groups()
  assert model.recurrent_groups == (0, 2)
  prompts = _prompts(11, 3, 72, 21)
  off, _ = _run(model, prompts, 3, enable_prefix_caching=False)
  on, eng = _run(model, prompts, 3)
  _assert_exact(on, off)
  assert sum(o.num_cached_tokens for o in on[1:]) >= 2 * 48
  # Each recurrent group gets its own state copies (group 0 -> GDN, group 2 -> Mamba2 pools).
  assert eng.stats.state_copies > 0
  # The same weights with one shared recurrent group give the same outputs.
  shared, _ = _run(_two_recurrent_groups("shared"), prompts, 3)
  _assert_exact(shared, off)


def test_marconi_junction_makes_recurrent_prefix_hit():
  # Prefix 80 = 5 blocks, prompts of 120: chunks end at 32, 64, 96, 112, so without the
  # junction cut the recurrent state at 80 never exists.
  prompts = _prompts(2, 3, 80, 40)
  off, _ = _run("qwen35_tiny", prompts, 2, enable_prefix_caching=False)
  plain, _ = _run("qwen35_tiny", prompts, 2, marconi_junction=False, engine_kw={"max_num_seqs": 1})
  cut, _ = _run("qwen35_tiny", prompts, 2, engine_kw={"max_num_seqs": 1})
  _assert_exact(plain, off)
  _assert_exact(cut, off)
  assert [o.num_cached_tokens for o in plain] == [0, 64, 64]
  assert [o.num_cached_tokens for o in cut] == [0, 64, 80]


def test_all_mode_equals_uncached():
  prompts = _prompts(3, 3, 140, 30)
  kw = dict(block_size=64, num_blocks=48, max_model_len=512)
  off, _ = _run("qwen35_tiny", prompts, 2, budget=128, enable_prefix_caching=False, **kw)
  on, eng = _run("qwen35_tiny", prompts, 2, budget=128, mode="all", **kw)
  _assert_exact(on, off)
  assert [o.num_cached_tokens for o in on] == [0, 128, 128]
  assert eng.stats.state_copies == 0


@pytest.mark.parametrize("preset, mode", [("qwen35_tiny", "all"), ("nemotron_h_tiny", "align")])
def test_mixed_steps_through_decode_kernels_equal_chunked(preset, mode):
  """A mixed step's one-token chunks run the decode kernels (`StepInputs.num_decodes`, the
  model-level equivalence: `tests/models/decode_split_test.py`): outputs equal caching off
  run without the split."""
  prompts = _prompts(4, 4, 128, 70)
  kw = dict(block_size=64, num_blocks=64, max_model_len=512, budget=128)
  off, eng_off = _run(
    preset, prompts, 6, enable_prefix_caching=False, engine_kw=dict(decode_kernels=False), **kw
  )
  on, eng = _run(preset, prompts, 6, mode=mode, **kw)
  _assert_exact(on, off)
  assert eng.stats.mixed_step_decodes > 0 and eng_off.stats.mixed_step_decodes == 0
  # the step records the serving benchmark's ideal TTFT reads
  st = eng.stats
  assert len(st.step_tokens) == st.steps
  assert sum(st.step_tokens) == st.prefill_tokens_computed + st.decode_tokens
  assert all(0 <= o.arrival_step <= o.first_token_step < st.steps for o in on)


@pytest.mark.parametrize("manager", ["reference", "jax"])
def test_state_pool_equals_uncached(manager):
  """Recurrent states in their own pool (`state_slots`): 6 slots for 4 requests of 93 tokens
  (align, block 16: a running state plus kept ones each), so states are evicted while pages
  are free; outputs stay exact, later prompts still hit, every block comes back at the end
  (the core's invariants check that each group holds only its own pool's ids)."""
  prompts = _prompts(12, 4, 72, 21)
  off, _ = _run("qwen35_tiny", prompts, 3, enable_prefix_caching=False)
  on, eng = _run("qwen35_tiny", prompts, 3, manager=manager, num_blocks=64, state_slots=6)
  _assert_exact(on, off)
  assert sum(o.num_cached_tokens for o in on[1:]) >= 48
  cfg = eng.cache_config
  assert eng.manager.pool_stats().num_free_blocks == cfg.pool_size - 1
  if manager == "jax":
    assert int(eng.manager.state.states_evicted) > 0


@pytest.mark.parametrize("manager", ["reference", "jax"])
def test_byte_budget_equals_uncached(manager):
  """Pages (1 unit) and state slots (2 units) drawing on one budget of 40 units, ids to spare
  (`CacheConfig.byte_budget`): the bytes bind first, cached blocks of either pool are evicted
  to fit; outputs stay exact, later prompts still hit, every block comes back at the end."""
  prompts = _prompts(12, 4, 72, 21)
  off, _ = _run("qwen35_tiny", prompts, 3, enable_prefix_caching=False)
  budget = dict(num_blocks=64, state_slots=32, byte_budget=40, page_bytes=1, slot_bytes=2)
  on, eng = _run("qwen35_tiny", prompts, 3, manager=manager, **budget)
  _assert_exact(on, off)
  assert sum(o.num_cached_tokens for o in on[1:]) >= 48
  stats = eng.manager.pool_stats()
  assert stats.num_free_blocks == eng.cache_config.pool_size - 1
  kinds = [g.kind for g in eng.cache_config.resolved_groups]
  used = [n * (2 if k == "mamba" else 1) for n, k in zip(stats.cached_blocks_per_group, kinds)]
  assert "mamba" in kinds and 0 < sum(used) <= 40


def test_pinning_equals_uncached_and_keeps_hits():
  prompts = _prompts(4, 3, 96, 10)
  off, _ = _run("gemma3_tiny", prompts, 2, enable_prefix_caching=False)
  on, eng = _run("gemma3_tiny", prompts, 2, pinning=True, engine_kw={"max_num_seqs": 1})
  _assert_exact(on, off)
  assert [o.num_cached_tokens for o in on][1:] == [96, 96]


def test_preemption_recompute_equals_uncached():
  # 24 usable blocks for 4 requests growing to ~100 tokens each: running requests run out of
  # blocks during decode and the newest is preempted (recompute).
  prompts = _prompts(5, 4, 40, 40)
  off, _ = _run("qwen35_tiny", prompts, 20, enable_prefix_caching=False, num_blocks=64)
  on, eng = _run("qwen35_tiny", prompts, 20, num_blocks=25)
  _assert_exact(on, off)
  assert eng.stats.preemptions > 0
  assert sum(o.num_preemptions for o in on) == eng.stats.preemptions


def test_jax_core_gives_the_reference_results():
  prompts = _prompts(6, 2, 48, 9)
  kw = dict(engine_kw={"max_num_seqs": 1})
  ref, e_ref = _run("qwen35_tiny", prompts, 2, **kw)
  jx, e_jx = _run("qwen35_tiny", prompts, 2, manager="jax", **kw)
  _assert_exact(jx, ref)
  assert [o.num_cached_tokens for o in jx] == [o.num_cached_tokens for o in ref] == [0, 48]
  assert e_jx.stats.prefill_tokens_computed == e_ref.stats.prefill_tokens_computed


def _wide(preset):
  # Heads divisible by 8 so that every family can be split over 8 devices.
  return get_preset(
    preset, num_heads=8, num_kv_heads=8, gdn_num_k_heads=8, gdn_num_v_heads=8, head_dim=8
  )


def _sharded_case(num_devices):
  """The sharded-run case: (outputs, engine) of `_wide("hybrid3_tiny")` on `num_devices`."""
  mesh = engine_sharding.heads_mesh(num_devices) if num_devices > 1 else None
  return _run(_wide("hybrid3_tiny"), _prompts(7, 3, 40, 9), 3, engine_kw={"mesh": mesh})


def _sharded_worker(num_devices, out_path):
  """Subprocess entry: runs `_sharded_case(num_devices)`, saves tokens, logits and layout."""
  outs, eng = _sharded_case(num_devices)
  np.savez(
    out_path,
    tokens=np.asarray([o.output_tokens for o in outs]),
    logits=np.stack([o.logits for o in outs]),
    devices=len(eng.cache.k.sharding.device_set),
    local_kv_heads=eng.cache.k.addressable_shards[0].data.shape[3],
  )


def _run_sharded_subprocess(num_devices, tmp_path):
  # Why a subprocess: XLA:CPU runs each device's program on the client's intra-op thread pool
  # (as many threads as devices on this host), and the GDN reference's triangular solve is a
  # LAPACK custom call that splits its batch onto that same pool and blocks waiting for it.
  # When every device reaches the solve at once, all pool threads wait for tasks no thread is
  # free to run: a deadlock (seen in gdb: 8 threads in lapack_strsm_ffi -> ParallelBatchMap ->
  # BlockingCounter::Wait). NPROC (read by the CPU client when it is created) sizes the pool;
  # with more threads than devices the solve always finds a free thread. It must be set before
  # the backend starts, hence a fresh process.
  out = tmp_path / "sharded.npz"
  env = dict(os.environ)
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={max(8, num_devices)}"
  env["NPROC"] = str(4 * num_devices)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO), env.get("PYTHONPATH")]))
  cmd = [sys.executable, __file__, "--sharded-worker", str(num_devices), str(out)]
  proc = subprocess.run(cmd, env=env, cwd=_REPO, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return np.load(out)


def test_sharded_2_devices_in_process_equals_one_device():
  assert len(jax.devices()) >= 2
  one, _ = _sharded_case(1)
  many, eng = _sharded_case(2)
  _assert_exact(many, one)
  assert len(eng.cache.k.sharding.device_set) == 2
  assert eng.cache.k.addressable_shards[0].data.shape[3] == 4


def test_cpu_deadlock_risk_is_flagged_for_gdn_meshes(monkeypatch):
  model, mesh = _wide("hybrid3_tiny"), engine_sharding.heads_mesh(8)
  monkeypatch.setenv("NPROC", "2")
  assert "NPROC" in engine_sharding.cpu_deadlock_risk(model, mesh)
  with pytest.warns(RuntimeWarning, match="deadlock"):
    Engine(model, cache_manager="reference", mesh=mesh)
  assert engine_sharding.cpu_deadlock_risk(model, engine_sharding.heads_mesh(2)) is None
  assert engine_sharding.cpu_deadlock_risk(_wide("gemma3_tiny"), mesh) is None  # no GDN
  monkeypatch.setenv("NPROC", "32")
  assert engine_sharding.cpu_deadlock_risk(model, mesh) is None


def test_sharded_8_devices_equals_one_device(tmp_path):
  one, _ = _sharded_case(1)
  got = _run_sharded_subprocess(8, tmp_path)
  assert int(got["devices"]) == 8
  assert int(got["local_kv_heads"]) == 1
  np.testing.assert_array_equal(got["tokens"], [o.output_tokens for o in one])
  want = np.stack([o.logits for o in one])
  rel = np.max(np.abs(got["logits"] - want)) / np.max(np.abs(want))
  assert rel <= 1e-5, rel


def test_bad_input_raises_and_engine_keeps_serving():
  with pytest.raises(ValueError, match="preset"):
    Engine("no_such_model")
  with pytest.raises(ValueError, match="layer_pattern"):
    ModelConfig(layer_pattern="GXA", num_layers=3)
  with pytest.raises(ValueError, match="does not divide num_heads=4"):
    Engine("qwen35_tiny", mesh=engine_sharding.heads_mesh(8))
  with pytest.raises(ValueError, match="window"):
    bad = (GroupSpec("swa", window=8), GroupSpec("full"))
    Engine("gemma3_tiny", cache_config_for("gemma3_tiny").replace(groups=bad))
  two = _two_recurrent_groups()
  mixed = cache_config_for(two).replace(
    groups=(
      GroupSpec("mamba"),
      GroupSpec("swa", window=24),
      GroupSpec("mamba", mode="all"),
      GroupSpec("full"),
    )
  )
  with pytest.raises(ValueError, match="mode must be the same"):
    Engine(two, mixed)
  with pytest.raises(ValueError, match="recurrent_grouping"):
    get_preset("hybrid3_tiny", recurrent_grouping="both")
  cfg = cache_config_for(
    "qwen35_tiny", num_blocks=96, max_model_len=256, max_num_batched_tokens=BUDGET, max_requests=4
  )
  eng = Engine(
    "qwen35_tiny", cfg, cache_manager="reference", token_buckets=(BUDGET,), seq_buckets=(8,)
  )
  good = eng.add_request(list(range(20)), 2)
  with pytest.raises(ValueError, match="max_model_len"):
    eng.add_request([1] * 257, 1)
  with pytest.raises(ValueError, match="max_new_tokens"):
    eng.add_request([1, 2, 3], 0)
  with pytest.raises(ValueError, match="max_new_tokens"):
    eng.add_request([1] * 250, 10)
  with pytest.raises(ValueError, match="vocab_size"):
    eng.add_request([1, 999], 1)
  with pytest.raises(ValueError, match="request_id"):
    eng.add_request([1, 2], 1, request_id=good)
  eng.step()
  other = eng.add_request(list(range(30, 60)), 3)
  outs = eng.run()
  assert outs[good].finished and len(outs[good].output_tokens) == 2
  assert outs[other].finished and len(outs[other].output_tokens) == 3
  assert outs[good].ttft_s is not None and outs[good].ttft_s <= outs[good].latency_s


if __name__ == "__main__" and sys.argv[1:2] == ["--sharded-worker"]:
  _dir = os.environ.get("HYBRID_CACHE_JAX_CACHE", os.path.expanduser("~/.cache/hybrid_cache_jax"))
  jax.config.update("jax_compilation_cache_dir", _dir)  # the same cache as tests/conftest.py
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  _sharded_worker(int(sys.argv[2]), sys.argv[3])


def test_token_buckets_follow_the_work():
  from hybrid_cache.engine import model_step

  sizes = [model_step.token_bucket(n, None) for n in (1, 16, 17, 25, 71, 134, 600, 1100, 2049)]
  assert sizes == [16, 16, 24, 32, 96, 192, 768, 1536, 3072]
  assert all(n <= model_step.token_bucket(n, None) <= 1.5 * n + 16 for n in range(1, 5000))
  assert model_step.token_bucket(40, (32, 64)) == 64
  assert model_step.token_bucket(70, (32, 64)) == 128  # past the given buckets: powers of two
