"""Continuous-batching serving engine over the cache core and a real hybrid model.

Each `Engine.step()`:
  1. intake: waiting requests enter the cache manager while it has request slots;
  2. schedule: one `CacheManager.schedule` call over the running requests (in admission
     order) then the waiting ones (preempted first), under the token budget;
  3. one jitted model step over all scheduled tokens (ragged prefill chunks and decodes
     packed together, T and N padded to power-of-two buckets; a step of single tokens only
     runs the recurrent layers' decode kernels), which first applies the plan's
     `StateCopy`s (recurrent groups: `copy_state_slots`; attention groups: the KV pages, the
     copy-on-write of a partial hit, vLLM §2.5), then runs the model with the core's
     block ids (KV pages and state pools share the pool's block id space);
  4. greedy sampling on the last token of each sequence whose tokens are all computed;
  5. commit: sampled tokens are appended to the manager (extending the hash chain) or the
     request finishes and its blocks are freed; a running request the core could not give
     blocks to makes the newest running request preempted (recompute: blocks freed,
     computed tokens reset; it is re-admitted later, with a fresh prefix lookup).

Which recurrent state blocks a chunk reads, writes and checkpoints (vLLM §5.1-5.4) comes with
the step result (`EntryResult.recurrent`, computed by the core's
`hybrid_cache.core.groups.recurrent_slots.state_slots`), and the copies to make before the forward
pass with it (`StepResult.state_copies`); the engine holds no mode rule of its own. In mode
"all" our kernels checkpoint every B tokens from a chunk's start (B = the recurrent groups'
block size, which may differ from the attention groups' KV page, `engine_config`), so the
engine caps prefill chunks to end on a block boundary (`recurrent_slots.kernel_chunk_cap`).

Speculative decoding (`Engine(drafter=...)` with `CacheConfig.num_speculative_tokens` = k):
decoding requests run verify windows of their last token + up to k drafts through the
multi-token verify kernels, greedy acceptance, per-token state commits; the cache core sees
only verified tokens, one step behind (see `hybrid_cache.engine.spec`).

"Caching off" is `CacheConfig(enable_prefix_caching=False)`: the core then never looks up or
registers hashes and keeps one recurrent block per request (mode "none").

Example::

  eng = Engine("qwen35_tiny", cache_config_for("qwen35_tiny", num_blocks=128), seed=0)
  rid = eng.add_request(prompt_tokens, max_new_tokens=8)
  outs = eng.run()
  outs[rid].output_tokens, outs[rid].num_cached_tokens, eng.stats.prefill_tokens_computed
"""

from __future__ import annotations

import collections
import logging
import os
import time
import warnings
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import jax

from hybrid_cache import geometry
from hybrid_cache.config import CacheConfig
from hybrid_cache.core.groups import recurrent_slots
from hybrid_cache.core.layout import layout
from hybrid_cache.engine import config as engine_config
from hybrid_cache.engine import lifecycle
from hybrid_cache.engine import model_step
from hybrid_cache.engine import sharding as engine_sharding
from hybrid_cache.engine import spec as engine_spec
from hybrid_cache.engine import spec_step
from hybrid_cache.engine.drafter import Drafter
from hybrid_cache.engine.records import EngineStats
from hybrid_cache.engine.records import RequestOutput
from hybrid_cache.engine.records import RequestState
from hybrid_cache.engine.records import check_request
from hybrid_cache.factory import BACKENDS
from hybrid_cache.factory import make_manager
from hybrid_cache.hashing import RequestExtras
from hybrid_cache.types import CacheManager
from hybrid_cache.types import ScheduleEntry
from models import cache as cache_lib
from models import runner
from models.config import ModelConfig
from models.hybrid_lm import HybridLM
from models.pretrained import load_pretrained

__all__ = ["Engine", "EngineStats", "RequestOutput"]


def _make_manager(kind: str | Callable[[CacheConfig], CacheManager], cfg: CacheConfig):
  if callable(kind):
    return kind(cfg)
  if kind not in BACKENDS:
    raise ValueError(f"cache_manager must be one of {BACKENDS} or a factory, got {kind!r}")
  return make_manager(cfg, kind)


class Engine:
  """Continuous-batching greedy engine (see module docstring).

  Args:
    model: a preset name (`models.config.PRESETS`) or a `ModelConfig` (random weights from
      `seed`), or a built `HybridLM` whose weights are served (`Engine.from_pretrained` loads
      one from a Hugging Face checkpoint).
    cache_config: a `CacheConfig` whose groups match the model (`cache_config_for`); None =
      `cache_config_for(model)`.
    seed: seed of the model's random weights (ignored for a `HybridLM`).
    mesh: a `jax.sharding.Mesh`; heads are split over its "model" axis (or its only axis).
      None = one device.
    implementation: kernel implementation (`engine_config.IMPLEMENTATIONS`: "xla", "pallas",
      "interpret" = the Pallas kernels in the Pallas interpreter; None = "pallas" on a GPU,
      else "xla").
    cache_manager: "jax" (the jitted core, default), "reference" (the plain-Python twin,
      same protocol and block ids) or a factory `CacheConfig -> CacheManager`.
    max_num_seqs: most sequences per step (default: cache_config.max_requests).
    token_buckets / seq_buckets: ascending pad sizes for T (tokens) and N (sequences incl.
      one padding sequence); None = T in 16, 24, 32, 48, 64, ... (two sizes per octave,
      `model_step.token_bucket`) and N in powers of two >= 2. Fewer buckets = fewer
      compilations.
    decode_kernels: run steps whose sequences all have one token (pure decode steps) through
      the recurrent decode kernels (`StepInputs.decode`, T = N padded to a seq bucket), and
      a mixed step's one-token sequences too, ordered first (`StepInputs.num_decodes`,
      `model_step.decodes_first`); False = every step through the chunked prefill kernels.
    drafter: speculative decoding with this drafter (`hybrid_cache.engine.drafter`) and
      k = cache_config.num_speculative_tokens drafts per step; None = off (k must be 0).
    numerics: the numerics contract (`engine_config.NUMERICS`): "exact" (fp32) or "serving"
      (bf16). A preset or `ModelConfig` is served in that dtype; a `HybridLM` must already
      have it (`from_pretrained(numerics=...)` loads it so). None = the model's own dtype.
  """

  def __init__(
    self,
    model: str | ModelConfig | HybridLM,
    cache_config: CacheConfig | None = None,
    *,
    seed: int = 0,
    mesh: jax.sharding.Mesh | None = None,
    implementation: str | None = None,
    cache_manager: str | Callable[[CacheConfig], CacheManager] = "jax",
    max_num_seqs: int | None = None,
    token_buckets: Sequence[int] | None = None,
    seq_buckets: Sequence[int] | None = None,
    decode_kernels: bool = True,
    drafter: Drafter | None = None,
    numerics: str | None = None,
  ):
    self.model_config = engine_config.resolve_model_config(model)
    if engine_config.check_numerics(numerics) is not None:
      dtype = engine_config.NUMERICS[numerics]
      if isinstance(model, HybridLM) and model.cfg.dtype != dtype:
        raise ValueError(
          f"numerics={numerics!r} needs a {dtype} model, got a {model.cfg.dtype} HybridLM "
          f"(load it with from_pretrained(..., numerics={numerics!r}))"
        )
      self.model_config = self.model_config.replace(dtype=dtype)
    self.numerics = engine_config.numerics_of(self.model_config)
    if cache_config is None:
      cache_config = engine_config.cache_config_for(self.model_config)
    if not isinstance(cache_config, CacheConfig):
      raise ValueError(f"cache_config must be a CacheConfig, got {type(cache_config).__name__}")
    engine_config.check_compatible(self.model_config, cache_config)
    if isinstance(seed, bool) or not isinstance(seed, int):
      raise ValueError(f"seed must be an integer, got {seed!r}")
    self.seed = seed
    self.cache_config = cache_config
    self.block_size = engine_config.kv_block_size(cache_config)  # KV page
    self.state_block_size = engine_config.state_block_size(cache_config)
    # block-table columns per group (`runner.build_step_inputs(max_blocks=...)`): each group's
    # own, not the widest (attention at 128-token pages beside 64-token states read half the
    # columns: qwen35_tiny decode 3.9 vs 7.7 ms a step, 2026-11-29)
    self.table_widths = tuple(
      cache_config.blocks_per_request(g.block_size) for g in cache_config.resolved_groups
    )
    self.mode = engine_config.effective_recurrent_mode(cache_config)
    self.num_spec = engine_spec.check_speculative(
      self.model_config, cache_config, drafter, self.mode
    )
    self.drafter = drafter if self.num_spec else None
    if self.drafter is not None and mesh is not None:
      raise ValueError("mesh must be None with a drafter (speculative decoding runs on one device)")
    self.rgroups = self.model_config.recurrent_groups
    # the recurrent groups' spec as the core runs it (mode "none" when caching is off), for the
    # engine's kernel rules (`recurrent_slots.kernel_chunk_cap`, ...); None without recurrent layers
    self._state_spec = layout(cache_config).groups[self.rgroups[0]] if self.rgroups else None
    # Cache group of each recurrent family's layers (copies of group g go to these families).
    self._family_group = {
      k: self.model_config.recurrent_groups[self.model_config.recurrent_index(k)]
      for k in "GM"
      if k in self.model_config.layer_kinds
    }
    self.implementation = engine_config.check_implementation(implementation)
    self.max_num_seqs = max_num_seqs or cache_config.max_requests
    if not 1 <= self.max_num_seqs <= cache_config.max_requests:
      raise ValueError(
        f"max_num_seqs must be in [1, max_requests={cache_config.max_requests}], got {max_num_seqs}"
      )
    self.token_buckets = tuple(sorted(token_buckets)) if token_buckets else None
    self.seq_buckets = tuple(sorted(seq_buckets)) if seq_buckets else None
    self.decode_kernels = bool(decode_kernels)
    self.mesh = None
    if mesh is not None:
      engine_sharding.check_mesh(self.model_config, mesh)
      risk = engine_sharding.cpu_deadlock_risk(self.model_config, mesh)
      if risk is not None:
        warnings.warn(risk, RuntimeWarning, stacklevel=2)
      self.mesh = engine_sharding.as_auto(mesh)
    self.manager = _make_manager(cache_manager, cache_config)
    if isinstance(model, HybridLM):
      self.graphdef, params = runner.split_model(model)
    else:
      self.graphdef, params = model_step.shared_model(self.model_config, seed)
    # Speculative decoding: one private pool id per request slot after the core's ids (pages,
    # then state slots: `CacheConfig.pool_size`). The model's cache arrays span that whole id
    # space, so with a state pool (`CacheConfig.state_slots`) the KV arrays have rows no page
    # id names and the state arrays rows no slot id names: correct, not memory-tight.
    num_private = cache_config.max_requests if self.drafter is not None else 0
    ids = cache_config.pool_size
    self._free_private = list(range(ids, ids + num_private))
    self._pending_kv: list[tuple[int, int, int]] = []  # (cache group, src page, dst block)
    cache = cache_lib.init_cache(self.model_config, ids + num_private, self.block_size)
    if self.mesh is not None:
      params = engine_sharding.shard_params(params, self.mesh)
      cache = engine_sharding.shard_cache(cache, self.mesh)
    self.params, self.cache = params, cache
    self.tokenizer = None  # a tokenizers.Tokenizer (`from_pretrained`), for `generate_text`
    self.vllm_geometry = None  # vLLM 0.33's geometry of the checkpoint (`from_pretrained`)
    self.stats = EngineStats()
    self._reqs: dict[str, RequestState] = {}
    self._waiting: collections.deque[str] = collections.deque()
    self._running: list[str] = []
    self._finished: dict[str, RequestOutput] = {}
    self._next_id = 0

  @classmethod
  def from_pretrained(
    cls,
    model_dir: str | os.PathLike,
    *,
    dtype: str | None = None,
    mesh: jax.sharding.Mesh | None = None,
    implementation: str | None = None,
    cache_manager: str | Callable[[CacheConfig], CacheManager] = "jax",
    max_num_seqs: int | None = None,
    token_buckets: Sequence[int] | None = None,
    seq_buckets: Sequence[int] | None = None,
    decode_kernels: bool = True,
    drafter: Drafter | None = None,
    numerics: str | None = None,
    target: str = geometry.DEFAULT_TARGET,
    vllm_flags: Mapping[str, Any] | None = None,
    **cache_kwargs: Any,
  ) -> Engine:
    """An engine serving the Hugging Face checkpoint in `model_dir` (`models.pretrained`).

    The cache is the one vLLM 0.33 builds for this checkpoint on `target` with `vllm_flags`
    (`hybrid_cache.geometry.derive` on its config.json: vLLM's attention and Mamba blocks,
    retention interval 0, the shared-prefix junction, vLLM's step budget), logged as one line
    and kept in `engine.vllm_geometry`; `cache_kwargs` override it field by field
    (`engine.config.cache_config_for`). The pool keeps its own size (`num_blocks`, default
    256): vLLM's block count assumes a GPU's memory.

    Args:
      model_dir: config.json + *.safetensors (one file or an index of shards) of a supported
        `model_type` (`models.hf_config.SUPPORTED_MODEL_TYPES`).
      dtype: "float32" | "bfloat16" (None = the checkpoint's, or the one `numerics` names).
      numerics: "exact" (fp32) or "serving" (bf16), as for `Engine`; sets `dtype`.
      mesh, implementation, cache_manager, max_num_seqs, token_buckets, seq_buckets,
        decode_kernels, drafter: as for `Engine`.
      target: the GPU whose geometry vLLM would build (`hybrid_cache.geometry.TARGETS`).
      vllm_flags: vLLM serving flags under vLLM's names (`hybrid_cache.geometry.VllmFlags`).
      **cache_kwargs: the keyword arguments of `cache_config_for` (enable_prefix_caching, mode,
        block_size, num_blocks, recurrent_block_size, max_model_len, max_num_batched_tokens,
        marconi_junction, retention_interval, ...); the cache groups come from the config's
        layer types.

    Example::

      eng = Engine.from_pretrained("ckpt/", mode="align", block_size=16, num_blocks=512)
      outs = eng.generate(prompts, 16, return_logits=True)
    """
    if engine_config.check_numerics(numerics) is not None:
      want = engine_config.NUMERICS[numerics]
      if dtype not in (None, want):
        raise ValueError(f"dtype={dtype!r} contradicts numerics={numerics!r} ({want})")
      dtype = want
    loaded = load_pretrained(model_dir, dtype=dtype)
    for note in loaded.arch.notes:
      logging.info("%s", note)
    vllm_geometry = geometry.derive(model_dir, target, vllm_flags)
    logging.info("%s", vllm_geometry.summary())
    engine = cls(
      loaded.model,
      engine_config.cache_config_for(loaded.config, vllm_geometry=vllm_geometry, **cache_kwargs),
      mesh=mesh,
      implementation=implementation,
      cache_manager=cache_manager,
      max_num_seqs=max_num_seqs,
      token_buckets=token_buckets,
      seq_buckets=seq_buckets,
      decode_kernels=decode_kernels,
      drafter=drafter,
    )
    engine.tokenizer = loaded.tokenizer
    engine.vllm_geometry = vllm_geometry
    return engine

  def generate_text(self, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
    """Text in, text out through `self.tokenizer` (the checkpoint's tokenizer.json): each
    prompt encoded as the tokenizer does (its special tokens included), greedy generation as
    `generate`, the new tokens decoded (special tokens skipped)."""
    if self.tokenizer is None:
      raise ValueError(
        "generate_text needs a tokenizer: Engine.from_pretrained(dir) with a tokenizer.json"
      )
    ids = [self.tokenizer.encode(p).ids for p in prompts]
    outs = self.generate(ids, max_new_tokens)
    return [self.tokenizer.decode(o.output_tokens, skip_special_tokens=True) for o in outs]

  # ------------------------------------------------------------------------------------------
  # intake
  # ------------------------------------------------------------------------------------------

  def add_request(
    self,
    tokens: Sequence[int],
    max_new_tokens: int,
    *,
    request_id: str | None = None,
    return_logits: bool = False,
    extras: RequestExtras | None = None,
  ) -> str:
    """Queues a request; returns its id. Bad input raises ValueError, the engine unchanged.

    Rules: tokens are ints in [0, vocab_size), 1 <= len(tokens); max_new_tokens >= 1;
    len(tokens) + max_new_tokens <= max_model_len (never truncated); request_id unused.
    """
    cfg = self.cache_config
    toks = check_request(tokens, max_new_tokens, self.model_config.vocab_size, cfg.max_model_len)
    if request_id is None:
      while f"req-{self._next_id}" in self._reqs:
        self._next_id += 1
      request_id = f"req-{self._next_id}"
      self._next_id += 1
    elif not isinstance(request_id, str) or not request_id:
      raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
    if request_id in self._reqs or request_id in self._finished:
      raise ValueError(f"request_id {request_id!r} is already used")
    r = RequestState(
      request_id, toks, int(max_new_tokens), bool(return_logits), extras, time.perf_counter()
    )
    r.arrival_step = self.stats.steps
    self._reqs[request_id] = r
    self._waiting.append(request_id)
    self.stats.prompt_tokens += len(toks)
    return request_id

  def has_unfinished(self) -> bool:
    return bool(self._reqs)

  @property
  def num_unfinished(self) -> int:
    return len(self._reqs)

  def reset_stats(self) -> None:
    self.stats = EngineStats()

  # ------------------------------------------------------------------------------------------
  # one step
  # ------------------------------------------------------------------------------------------

  def _intake(self) -> None:
    active = sum(1 for r in self._reqs.values() if r.in_manager)
    for rid in list(self._waiting):
      if active >= self.cache_config.max_requests:
        break
      r = self._reqs[rid]
      if r.in_manager:
        continue
      self.manager.add_request(rid, r.prompt + r.output, r.extras)
      r.in_manager = True
      active += 1

  def _entries(self) -> list[ScheduleEntry]:
    """Running requests first, then waiting ones in queue order (up to max_num_seqs).

    Where our kernels need it (`recurrent_slots.kernel_chunk_cap`: mode "all", prefill chunks end on
    a recurrent block boundary), each entry gets a `max_tokens` computed against the budget
    left, assuming every earlier entry takes its maximum (the core may give less, never more,
    so ends stay aligned); a running request whose chunk cannot end on a boundary is skipped,
    and a waiting one stops the waiting queue.
    """
    out: list[ScheduleEntry] = []
    budget = self.cache_config.max_num_batched_tokens
    spec = self._state_spec
    for waiting, queue in ((False, self._running), (True, self._waiting)):
      for rid in queue:
        r = self._reqs[rid]
        if len(out) >= self.max_num_seqs or (waiting and not r.in_manager):
          break
        cap = None
        if spec is not None:
          # a waiting request's chunk starts at its prefix hit, aligned to the scheduler block
          computed = 0 if waiting else r.num_computed
          cap = recurrent_slots.kernel_chunk_cap(spec, computed, r.num_tokens, budget)
        if cap is None:
          out.append(ScheduleEntry(rid))
          continue
        if cap <= 0:
          if waiting:
            break
          continue
        out.append(ScheduleEntry(rid, cap))
        budget -= cap
    return out

  def step(self) -> list[RequestOutput]:
    """Runs one engine step; returns the requests that finished in it."""
    t0 = time.perf_counter()
    self._intake()
    entries = self._entries()
    finished: list[RequestOutput] = []
    if not entries:
      lifecycle.drop_stuck(self, finished)
      self.stats.wall_s += time.perf_counter() - t0
      return finished
    result = self.manager.schedule(entries)
    t1 = time.perf_counter()
    self.stats.schedule_s += t1 - t0
    seqs, sched, failed = [], [], []
    windows: list[engine_spec.Window] = []
    verifying: list[RequestState] = []
    for e in result.entries:
      r = self._reqs[e.req]
      if e.admission and e.hit is not None and e.scheduled_tokens > 0:
        if r.num_cached is None:
          r.num_cached = e.hit.hit_tokens
        self.stats.cached_tokens += e.hit.hit_tokens
      if e.scheduled_tokens == 0:
        if r.running and e.reason == "allocate_slots_failed":
          failed.append(e.req)
        continue
      if not r.running:
        r.running = True
        self._waiting.remove(e.req)
        self._running.append(e.req)
      n = e.scheduled_tokens
      start = e.num_computed_tokens - n
      all_tokens = r.prompt + r.output
      view = self.manager.request_view(e.req)
      tables = [list(t) for t in view.block_ids]
      if self.drafter is not None:
        spec_step.flush_scratch(self, r, tables)
        if start + n <= r.num_computed:
          continue  # catch-up: the core reaches tokens the engine verified already
        if start + n == r.num_tokens and r.num_computed == r.num_tokens - 1 >= len(r.prompt):
          windows.append(spec_step.window(self, r, tables, e.recurrent))
          verifying.append(r)
          continue
      slots = e.recurrent or model_step.NO_STATE
      if self._state_spec is not None:
        recurrent_slots.check_kernel_chunk(self._state_spec, start, n)
      seqs.append(
        runner.SeqStep(
          all_tokens[start : start + n],
          start,
          tables,
          tuple(s.read for s in slots),
          tuple(s.write for s in slots),
          tuple(s.checkpoints for s in slots),
        )
      )
      sched.append((r, start, n))
    copies = [c for c in result.state_copies if c.src_block != c.dst_block]
    self.stats.state_copies += len(copies)
    if (seqs or windows) and self._pending_kv:
      spec_step.flush_pending_kv(self)
    if seqs:
      model_step.run_model(self, seqs, sched, copies, finished)
    if windows:
      spec_step.run_verify(self, windows, verifying, [] if seqs else copies, finished)
    self.stats.steps += 1
    self.stats.step_tokens.append(
      sum(len(s.token_ids) for s in seqs) + sum(len(w.tokens) for w in windows)
    )
    for _ in failed:
      lifecycle.preempt_newest(self)
    if not seqs and not windows:
      lifecycle.drop_stuck(self, finished)
    self.stats.model_s += time.perf_counter() - t1
    self.stats.wall_s += time.perf_counter() - t0
    return finished

  # ------------------------------------------------------------------------------------------
  # driving
  # ------------------------------------------------------------------------------------------

  def run(
    self, *, progress: bool = False, max_steps: int | None = None
  ) -> dict[str, RequestOutput]:
    """Steps until every queued request finished; returns all finished outputs by id.

    Args:
      progress: show a tqdm bar over requests.
      max_steps: safety cap; ValueError-free, simply stops (unfinished stay queued).
    """
    bar = None
    if progress:
      from tqdm import tqdm

      bar = tqdm(total=len(self._reqs), desc="requests", unit="req")
    steps = 0
    while self._reqs and (max_steps is None or steps < max_steps):
      done = self.step()
      steps += 1
      if bar is not None:
        bar.update(len(done))
    if bar is not None:
      bar.close()
    return dict(self._finished)

  def generate(
    self, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, return_logits: bool = False
  ) -> list[RequestOutput]:
    """Queues `prompts` (all at once), runs them, returns their outputs in order."""
    ids = [self.add_request(p, max_new_tokens, return_logits=return_logits) for p in prompts]
    outs = self.run()
    return [outs[i] for i in ids]

  @property
  def outputs(self) -> dict[str, RequestOutput]:
    return dict(self._finished)
