"""Replays a trace through the cache core (`types.CacheManager` protocol only).

Policies: the named profiles of `hybrid_cache.profiles` (one name per configuration, shared with
the engine's arms; `CORE_POLICY_CONFIGS`), and their old names as aliases. vLLM 0.33 serves
`align` with the shared-prefix junction always on (`KVCacheManager.get_computed_blocks` returns
it, the scheduler's split stops there, the retention masks keep it) and
`prefix_cache_retention_interval = 0` by default (`vllm/config/cache.py`): only the replay
boundary and junction states are kept.
  vllm_default             vLLM 0.33's serving default: align + junction + retention 0, LRU
                           (old names: vllm_align, vllm_align_marconi, lru).
  vllm_align_dense         align + junction, dense retention (vLLM with the retention interval
                           None).
  vllm_none                recurrent mode none (vLLM's mamba_cache_mode "none": no recurrent
                           state is cached).
  align_dense_no_junction  align, no junction, dense retention (vLLM before the junction; not a
                           vLLM 0.33 setting; old name align_dense).
  all_dense_no_junction    mode all (a state at every block boundary = vLLM+ in block terms; not
                           a vLLM 0.33 setting; old name vllm_all).
  flop_aware               vllm_default with `eviction="flop_aware"` (SPEC B2,
                           core/policies/flop_aware.py).
  <registered>             vllm_default with any other registered eviction policy
                           (`hybrid_cache.policies`).
`retention` overrides the retention interval (None = dense, 0, or k * block size); `pinning`
turns on the SWA/prefix pinned tier (SPEC B1).

Model -> groups and pages (`layout`: "model", vLLM's own grouping "vllm", or two pools "pools"),
and the FLOP-aware eviction costs: `core_groups.py`.

Each request (sequential, as Marconi): add_request(input) -> schedule until the prompt is
computed (one step if `token_budget` is None, else chunks of at most that many tokens) ->
append_tokens(output[:-1]) and schedule them in block-aligned chunks (each chunk ends on a
block boundary, as one-token decode steps would; the last sampled token is never computed) ->
free. Reused tokens = the first step's `hit.hit_tokens`.

Backends (`replay`): "jax" runs the same life in one jitted `lax.scan` per chunk of requests
(`core_scan.py`, the fast path); "jax_protocol" drives JaxCacheManager request by request
through the `types.CacheManager` protocol and "reference" the PythonCacheManager (cross-checks).

Tokens: the trace's token-level expansion (Mooncake: hash id * 512 + offset), so any
block size that divides 512 hashes Mooncake blocks exactly.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np

from hybrid_cache import factory
from hybrid_cache import policies
from hybrid_cache import pools
from hybrid_cache import profiles
from hybrid_cache.config import CacheConfig
from hybrid_cache.sim.core_groups import _eviction_costs
from hybrid_cache.sim.core_groups import group_block_bytes
from hybrid_cache.sim.core_groups import model_groups
from hybrid_cache.sim.core_groups import page_bytes
from hybrid_cache.sim.core_groups import unit_bytes
from hybrid_cache.sim.core_groups import vllm_group_size
from hybrid_cache.sim.cost_model import CostModel
from hybrid_cache.sim.trace import Trace
from hybrid_cache.sim.vllm_plus import request_tokens
from hybrid_cache.types import ScheduleEntry

BACKENDS = ("jax", "jax_protocol", "reference")


# policy name -> `profiles.Profile` (mode, marconi_junction, retention_interval, eviction)
CORE_POLICY_CONFIGS = profiles.PROFILES


def build_config(
  trace: Trace,
  model: CostModel,
  capacity_bytes: float,
  policy: str,
  block_size: int,
  *,
  retention: int | None | str = "policy",
  pinning: bool = False,
  token_budget: int | None = None,
  hash_block_size: int | None = None,
  layout: str | None = None,
  placement: str | None = None,
  admission: str = "all",
  retention_policy: str = "prefix",
  retirement: str | None = None,
  state_fraction: float | None = None,
  checkpoint_unit: int | None = None,
) -> tuple[CacheConfig, dict]:
  """The CacheConfig of a core policy for this trace and budget, and the sizing summary.

  `hash_block_size` (None = the block size): vLLM's hash block (`prefix_match_unit`); a divisor
  of `block_size` below it turns on vLLM's partial hits for `align` recurrent groups.
  `layout`: "model" (one group per kind), "vllm" (vLLM's groups of equal layer counts;
  `core_groups.py`) or "pools" (below); None = "pools" for a profile on pages of its unit
  (`Profile.unit_pages`: `adaptive`, whose pages are `block_size`) on a model with attention
  and recurrent layers, else "model".
  `placement`, `admission`: registered policies of those seams (`hybrid_cache.policies`);
  placement None = the profile's (vLLM's own rule but for `adaptive`), admission vLLM's by
  default; `retention_policy`: the registered retention policy (what a finished request pins
  with `pinning`); `retirement`: the registered retirement policy (which superseded recurrent
  states a finished request drops; None = the profile's, "none" = vLLM).
  `state_fraction` ("pools" layout only): None = pages and state slots share the whole byte
  budget (`CacheConfig.byte_budget`); a number in (0, 1) = that share of `capacity_bytes` is a
  fixed pool of state slots, the rest pages (`pools.split_byte_budget`).
  `checkpoint_unit` U (beyond vLLM, issue 15; None = vLLM's rules): recurrent state blocks of
  U tokens in the policy's mode, the hash block U and `CacheConfig.fine_keys` (full attention
  keyed at every U inside its full blocks): a state the policy keeps at any multiple of U (a
  junction, a prompt tail, a block-aligned chunk end) is a hit there, not at the KV block
  below it, for any KV block `block_size` (a larger multiple of U). Mode "all" then holds one
  state per U of every scheduled chunk while it runs (Mooncake, 1,500 requests at 2e11: 44x
  slower than align and fewer hits, 2026-11-27); align holds about three.
  """
  if policy not in CORE_POLICY_CONFIGS and policy not in profiles.ALIASES:
    raise ValueError(f"policy must be one of {tuple(CORE_POLICY_CONFIGS)}, got {policy!r}")
  policy = profiles.resolve(policy)
  if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
    raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
  if not capacity_bytes > 0:
    raise ValueError(f"capacity_bytes must be > 0, got {capacity_bytes!r}")
  if hash_block_size is not None and (
    isinstance(hash_block_size, bool)
    or not isinstance(hash_block_size, int)
    or hash_block_size < 1
    or block_size % hash_block_size
  ):
    raise ValueError(
      f"hash_block_size must be None or an integer >= 1 dividing block_size={block_size}, "
      f"got {hash_block_size!r}"
    )
  p = CORE_POLICY_CONFIGS[policy]
  if layout is None:  # pools for a profile on pages of its unit, where there are both kinds
    layout = "pools" if p.unit_pages and model.n_attn and model.n_recurrent else "model"
  placement = p.placement if placement is None else placement
  retirement = p.retirement if retirement is None else retirement
  if checkpoint_unit is not None:
    u = checkpoint_unit
    if isinstance(u, bool) or not isinstance(u, int) or u < 1 or block_size % u or u == block_size:
      raise ValueError(
        f"checkpoint_unit must be an integer >= 1 dividing block_size={block_size} and smaller,"
        f" got {u!r}"
      )
    if hash_block_size not in (None, u):
      raise ValueError(
        f"hash_block_size must be unset or equal checkpoint_unit={u}, got {hash_block_size!r}"
      )
    if layout == "vllm":
      raise ValueError("checkpoint_unit needs page_layout 'model' or 'pools', got 'vllm'")
    if not (model.n_attn and model.n_recurrent) or p.mode == "none":
      raise ValueError(
        f"checkpoint_unit needs a model with full-attention and recurrent layers and a policy"
        f" that caches states, got model {model.name!r}, policy {policy!r}"
      )
    hash_block_size = u
  groups = model_groups(model, p.mode, layout)
  if checkpoint_unit is not None:
    groups = tuple(
      dataclasses.replace(g, block_size=checkpoint_unit) if g.kind == "mamba" else g for g in groups
    )
  gb = group_block_bytes(model, groups, block_size, layout)
  page = page_bytes(model, groups, block_size, layout)
  units = unit_bytes(model, groups, block_size, layout)
  longest = max((r.num_tokens for r in trace.requests), default=1)
  mml = (-(-longest // block_size) + 1) * block_size
  budget = mml if token_budget is None else token_budget
  if isinstance(budget, bool) or not isinstance(budget, int) or budget < block_size:
    raise ValueError(f"token_budget must be None or an integer >= {block_size}, got {budget!r}")
  # blocks a group holds for the longest request: every block of an attention group; about
  # three states in a recurrent group outside mode all; in mode all a state per block (its
  # own, U with `checkpoint_unit`) of one chunk (the superseded ones are released as the
  # chunk's end moves past them)
  held = [
    (
      (-(-min(longest, budget) // (g.block_size or block_size)) + 1 if g.mode == "all" else 3)
      if g.kind == "mamba"
      else -(-longest // block_size) + 1
    )
    for g in groups
  ]
  state_slots = 0
  pool_fields: dict = {}
  if layout == "pools":
    kinds = {g.kind for g in groups}
    if "mamba" not in kinds or kinds == {"mamba"}:
      raise ValueError(
        f"page_layout 'pools' needs a model with attention and recurrent layers, got {model.name!r}"
      )
    slot = model.state_bytes
    need_pages = 1 + sum(h for g, h in zip(groups, held) if g.kind != "mamba")
    need_slots = sum(h for g, h in zip(groups, held) if g.kind == "mamba")
    if state_fraction is None:  # one budget for both (`CacheConfig.byte_budget`)
      shared = pools.shared_byte_budget(capacity_bytes, page, slot)
      num_blocks, state_slots = shared["num_blocks"], shared["state_slots"]
      pool_fields = {k: shared[k] for k in ("byte_budget", "page_bytes", "slot_bytes")}
      if (need_pages - 1) * page + need_slots * slot > capacity_bytes:
        raise ValueError(
          f"capacity_bytes must be >= {(need_pages - 1) * page + need_slots * slot} (the pages"
          f" and state slots the longest request holds, {longest} tokens), got {capacity_bytes:g}"
        )
    else:
      num_blocks, state_slots = pools.split_byte_budget(capacity_bytes, page, slot, state_fraction)
      for name, have, need, unit in (
        ("pages", num_blocks, need_pages, page),
        ("state slots", state_slots + 1, need_slots + 1, slot),
      ):
        if have < need:
          raise ValueError(
            f"capacity_bytes is too small for the {name}: the longest request ({longest} tokens)"
            f" holds {need - 1} of {unit} B, the split leaves {have - 1}"
            f" (state_fraction={state_fraction}), got {capacity_bytes:g}"
          )
  else:
    num_blocks = int(capacity_bytes // page) + 1
    need = 1 + sum(held)
    if num_blocks < need:
      raise ValueError(
        f"capacity_bytes must be >= {(need - 1) * page} ({need - 1} pages of {page} B: the "
        f"blocks every group holds for the longest request, {longest} tokens), "
        f"got {capacity_bytes:g}"
      )
  ret = p.retention_interval if retention == "policy" else retention
  if retention == "policy" and not any(g.kind in ("swa", "mamba") for g in groups):
    ret = None  # a policy's retention only concerns window and recurrent groups (vLLM)
  cfg = CacheConfig(
    groups=groups,
    num_blocks=num_blocks,
    state_slots=state_slots,
    **pool_fields,
    block_size=block_size,
    retention_interval=ret,
    max_num_batched_tokens=budget,
    max_model_len=mml,
    marconi_junction=p.marconi_junction,
    eviction=p.eviction,
    pinning=pinning,
    max_requests=1,
    hash_block_size=hash_block_size,
    fine_keys=checkpoint_unit is not None,
    placement=placement,
    admission=admission,
    retention=retention_policy,
    retirement=retirement,
    **_eviction_costs(model, groups, block_size, p.eviction, layout),
  )
  sizing = {
    "num_blocks": num_blocks,
    "page_bytes": page,
    "groups": [g.kind for g in groups],
    "page_padding": [1 - b / u for b, u in zip(gb, units)],
    "retention_interval": ret,
    "marconi_junction": p.marconi_junction,
    "recurrent_mode": p.mode,
    "eviction": p.eviction,
    "placement": placement,
    "admission": admission,
    "retention_policy": retention_policy,
    "pinning": pinning,
  }
  if retirement != "none":  # (the summaries of the other runs stay as they were)
    sizing["retirement"] = retirement
  if layout == "vllm":
    sizing["page_layout"] = layout
    sizing["layers_per_group"] = vllm_group_size(model)
  if layout == "pools":
    sizing["page_layout"] = layout
    sizing.update(state_slots=state_slots, slot_bytes=model.state_bytes)
    sizing["state_fraction"] = state_fraction  # None: one shared byte budget
  if hash_block_size is not None:
    sizing["hash_block_size"] = hash_block_size
    sizing["partial_hits"] = cfg.partial_hits
  if checkpoint_unit is not None:
    sizing["checkpoint_unit"] = checkpoint_unit
    sizing["fine_keys"] = True
  return cfg, sizing


def make_manager(config: CacheConfig, backend: str):
  """A protocol manager: JaxCacheManager ("jax", "jax_protocol") or PythonCacheManager."""
  if backend not in BACKENDS:
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
  return factory.make_manager(config, "jax" if backend == "jax_protocol" else backend)


def output_in_one_chunk(config: CacheConfig) -> bool:
  """Whether a replay computes a request's appended output as one chunk: yes when the
  placement policy cuts align-mode chunks at its own points (`chunk_cuts`, e.g. `adaptive`:
  its only output state is the continuation point, where the core cuts). Otherwise the output
  runs in chunks ending at every block boundary, as one-token decode steps would pass them
  (vLLM's align mode keeps a state at each)."""
  return hasattr(policies.core_policy("placement", config.placement), "chunk_cuts")


def _run_to(m, name: str, start: int, target: int, step_tokens: Callable[[int], int | None]):
  """Schedules `name` from `start` computed tokens until `target`; returns the first entry."""
  first = None
  computed = start
  while True:
    e = m.schedule([ScheduleEntry(name, step_tokens(computed))]).entries[0]
    if first is None:
      first = e
    if e.scheduled_tokens == 0:
      raise ValueError(f"request {name!r} made no progress ({e.reason}); capacity too small for it")
    computed = e.num_computed_tokens
    if computed >= target:
      return first


def run_core(
  trace: Trace,
  config: CacheConfig,
  backend: str = "jax",
  on_request: Callable[[int, object], None] | None = None,
  alpha: float | None = None,
  weighting: str | None = None,
  progress: Callable[[int], None] | None = None,
) -> tuple[list[tuple[int, int, int]], dict]:
  """Replays `trace` on a fresh manager; returns (triples, counters).

  `on_request(i, manager)` runs after every request is freed (e.g. the invariant checker);
  `progress(i + 1)` right after it (the requests replayed so far, e.g. a tqdm bar's position).
  `alpha`, `weighting`: set on the manager first (`set_eviction_alpha`,
  `set_eviction_weighting`).
  """
  m = make_manager(config, backend)
  if alpha is not None:
    m.set_eviction_alpha(alpha)
  if weighting is not None:
    m.set_eviction_weighting(weighting)
  B = config.block_size
  mamba = [i for i, g in enumerate(config.groups) if g.kind == "mamba"]
  triples = []
  mamba_allocated = 0
  whole = output_in_one_chunk(config)

  def output_chunk(computed: int) -> int | None:
    return None if whole else B - computed % B

  t0 = time.perf_counter()
  for i, r in enumerate(trace.requests):
    toks = request_tokens(r)
    n_in = r.num_input_tokens
    name = f"r{i}"
    m.add_request(name, toks[:n_in])
    first = _run_to(m, name, 0, n_in, lambda c: None)
    reused = first.hit.hit_tokens if first.hit is not None else 0
    triples.append((int(reused > 0), n_in, int(reused)))
    out = toks[n_in : len(toks) - 1]
    if len(out):
      m.append_tokens(name, out)
      _run_to(m, name, n_in, len(toks) - 1, output_chunk)
    if mamba:
      v = m.request_view(name)
      mamba_allocated += sum(v.num_real_blocks[g] for g in mamba)
    m.free(name)
    if on_request is not None:
      on_request(i, m)
    if progress is not None:
      progress(i + 1)
  wall = time.perf_counter() - t0
  st = m.pool_stats()
  counters = {
    "backend": backend,
    "replay_s": wall,
    "final_cached_blocks_per_group": list(st.cached_blocks_per_group),
    "final_pinned_blocks": st.num_pinned_blocks,
    "recurrent_blocks_held_at_finish": mamba_allocated,
  }
  state = getattr(m, "state", None)
  if state is not None:  # JaxCacheManager: the core's recurrent-state counters
    counters["states_admitted"] = int(state.states_admitted)
    counters["states_evicted"] = int(state.states_evicted)
  return triples, counters


def token_ids_fit(trace: Trace) -> None:
  """ValueError if a token id does not fit the core's int32 token range."""
  mx = max((int(np.max(request_tokens(r))) for r in trace.requests if r.num_tokens), default=0)
  if mx >= 2**31:
    raise ValueError(f"trace token ids must be < 2**31 for the core, got {mx}")


def replay(
  trace: Trace,
  config: CacheConfig,
  backend: str = "jax",
  alpha: float | str | None = None,
  model: CostModel | None = None,
  weighting: str | None = None,
  progress: Callable[[int], None] | None = None,
) -> tuple[list[tuple[int, int, int]], dict]:
  """Replays `trace`: backend "jax" = the scan (`core_scan.run_scan`), "jax_protocol" =
  JaxCacheManager through the protocol, "reference" = PythonCacheManager. `alpha`: FLOP-aware
  eviction's static alpha (jax backends), or "tuned" (scan only: Marconi's online tuner,
  scored with `model`'s FLOPs). Eviction `tuned` runs its shadow tuner, scored with `model`'s
  FLOPs (scan only), unless `weighting` (`policies.TUNED_WEIGHTINGS`) fixes its weighting for
  the whole replay (any backend; what the engine serves, which has no shadows).
  `progress(k)`: called as the replay advances with k = the requests replayed so far (each
  backend's granularity: `run_scan`, `run_core`)."""
  if alpha == "tuned" and backend != "jax":
    raise ValueError(f"alpha 'tuned' needs backend 'jax', got {backend!r}")
  # (a weighting itself is checked where it is set: `run_scan`, `set_eviction_weighting`)
  if config.eviction == "tuned" and weighting is None and backend != "jax":
    raise ValueError(f"eviction 'tuned' (its shadow tuner) needs backend 'jax', got {backend!r}")
  if backend == "jax":
    from hybrid_cache.sim import core_scan

    return core_scan.run_scan(
      trace, config, alpha=alpha, tune_model=model, weighting=weighting, progress=progress
    )
  if backend == "jax_protocol":
    return run_core(trace, config, "jax", alpha=alpha, weighting=weighting, progress=progress)
  if backend == "reference":
    return run_core(trace, config, "reference", alpha=alpha, weighting=weighting, progress=progress)
  raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
