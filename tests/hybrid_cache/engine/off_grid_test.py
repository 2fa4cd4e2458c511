"""The off-grid workload (issue 28): `adaptive` hits where vLLM 0.33's default hits nothing.

`engine.workload.off_grid_sessions`: six sessions share a 90-token system prompt, four turns
each, every turn extending the session's previous prompt by 20-49 tokens (prompts of 110-249
tokens), turns interleaved. Served one request at a time by the engine (`qwen35_tiny`, jitted
core) with attention blocks of 256 (a vLLM-sized hybrid block scaled to the tiny model), under
caching off, `vllm_default` (recurrent blocks of 256 too, as vLLM sizes them) and `adaptive`
(every group on pages of U = 64, align mode, retirement `superseded`).

What the rules give, request by request (the learned alignment A stays 1 unit: the depths
where these prompts leave what the cache holds are not >= 90% multiples of 2 units):
- `vllm_default`: every state it keeps (the prompt end, the junction) floors to the 256-token
  block, i.e. to 0: no hit at all.
- `adaptive`: session 0's turn 1 misses; session 1's turn 1 misses too (session 0 kept only its
  prompt end, 128) but leaves its branch point at the system prompt floored to U, 64, which
  every later session's turn 1 hits; turn k >= 2 hits the continuation point the session's
  turn k - 1 kept, its prompt length floored to U.
Outputs equal the uncached run: greedy tokens, logits within fp32 1e-5 relative.
"""

from hybrid_cache.engine import workload

U = workload.CHECKPOINT_UNIT  # 64
SESSIONS = 6
COMMON = dict(  # `adaptive`'s arm sets its own block, U (`workload.arm`)
  block_size=256,
  num_blocks=64,
  max_model_len=512,
  max_requests=1,
  max_num_batched_tokens=256,
)


def _expected_adaptive_hits(prompts):
  hits = []
  for i in range(len(prompts)):
    session, turn = i % SESSIONS, i // SESSIONS
    if turn > 0:
      hits.append(len(prompts[i - SESSIONS]) // U * U)
    else:
      hits.append(0 if session < 2 else U)
  return hits


def test_adaptive_hits_off_the_block_grid_where_vllm_default_hits_nothing():
  prompts = workload.off_grid_sessions(seed=0, num_sessions=SESSIONS)
  assert max(len(p) for p in prompts) < COMMON["block_size"]
  arms = {name: workload.arm(name) for name in ("off", "vllm_default", "adaptive")}
  res = workload.compare_arms(
    "qwen35_tiny",
    arms,
    prompts,
    max_new_tokens=3,
    common=COMMON,
    engine_kwargs=dict(cache_manager="jax", token_buckets=(256,), max_num_seqs=1),
  )
  assert res["vllm_default"]["cached_tokens"] == 0
  assert res["adaptive"]["per_request_cached_tokens"] == _expected_adaptive_hits(prompts)
  total = sum(len(p) for p in prompts)
  assert res["adaptive"]["prefill_tokens_computed"] == total - res["adaptive"]["cached_tokens"]
  for name in ("vllm_default", "adaptive"):
    assert res[name]["outputs_equal_to_off"], name
    assert res[name]["max_logit_rel_diff_vs_off"] <= 1e-5, name


def test_adaptive_retires_superseded_states_and_stays_exact(monkeypatch):
  """Longer sessions (3 x 8 turns, each turn 64-95 tokens longer than the last, prompts up to
  686 tokens): each turn keeps a new continuation state and supersedes its previous one, so
  the retirement `superseded` turns on once 16 supersessions are counted and drops the
  superseded states while the engine serves (21 retired). Outputs still equal the uncached
  run: a retired state is free and no running request reads it (`release.retire`)."""
  prompts = workload.off_grid_sessions(
    seed=1, num_sessions=3, turns=8, system_len=40, turn_len=(64, 96)
  )
  made = []
  make = workload._engine

  def spy(*args):  # keeps the engines `compare_arms` builds, to read the cache's counters
    made.append(make(*args))
    return made[-1]

  monkeypatch.setattr(workload, "_engine", spy)
  arms = {name: workload.arm(name) for name in ("off", "adaptive")}
  res = workload.compare_arms(
    "qwen35_tiny",
    arms,
    prompts,
    max_new_tokens=3,
    common={**COMMON, "max_model_len": 1024},
    engine_kwargs=dict(cache_manager="jax", token_buckets=(256,), max_num_seqs=1),
  )
  (served,) = [e for e in made if e.manager.config.retirement == "superseded"]
  assert int(served.manager.state.states_retired) > 0
  assert res["adaptive"]["cached_tokens"] > 0
  assert res["adaptive"]["outputs_equal_to_off"]
  assert res["adaptive"]["max_logit_rel_diff_vs_off"] <= 1e-5
