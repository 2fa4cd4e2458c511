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
import dataclasses
import functools
import logging
import os
import time
import warnings
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hybrid_cache.config import CacheConfig
from hybrid_cache.core.groups import recurrent_slots
from hybrid_cache.core.layout import layout
from hybrid_cache.engine import config as engine_config
from hybrid_cache.engine import sharding as engine_sharding
from hybrid_cache.engine import spec as engine_spec
from hybrid_cache.engine.drafter import Drafter
from hybrid_cache.factory import BACKENDS
from hybrid_cache.factory import make_manager
from hybrid_cache.hashing import RequestExtras
from hybrid_cache.types import CacheManager
from hybrid_cache.types import RecurrentSlots
from hybrid_cache.types import ScheduleEntry
from kernels.pallas.state_copy import api as state_copy_api
from models import cache as cache_lib
from models import runner
from models.config import ModelConfig
from models.hybrid_lm import HybridLM
from models.hybrid_lm import build_model
from models.pretrained import load_pretrained


@dataclasses.dataclass
class RequestOutput:
  """A request's result.

  Attributes:
    request_id: the id `add_request` returned.
    prompt_tokens: the prompt.
    output_tokens: greedy tokens generated (len == max_new_tokens when finished).
    logits: f32[len(output_tokens), vocab], the logits each token was sampled from (only
      when requested).
    num_cached_tokens: prefix-cache hit at the first admission (vLLM's num_cached_tokens).
    num_prefill_tokens_computed: prompt (and recompute) tokens the model computed for it.
    num_preemptions: times it was preempted (recompute).
    ttft_s: seconds from `add_request` to the first output token.
    latency_s: seconds from `add_request` to the last output token.
    finished: all max_new_tokens were generated.
    error: why the request was dropped (e.g. it can never fit in the pool), else None.
    num_draft_tokens / num_accepted_tokens: speculative drafts verified / accepted for it.
  """

  request_id: str
  prompt_tokens: list[int]
  output_tokens: list[int]
  logits: np.ndarray | None
  num_cached_tokens: int
  num_prefill_tokens_computed: int
  num_preemptions: int
  ttft_s: float | None
  latency_s: float | None
  finished: bool
  error: str | None = None
  num_draft_tokens: int = 0
  num_accepted_tokens: int = 0


@dataclasses.dataclass
class EngineStats:
  """Engine totals since construction (or the last `reset_stats`)."""

  steps: int = 0
  prefill_tokens_computed: int = 0
  decode_tokens: int = 0
  cached_tokens: int = 0  # sum of prefix hits over all admissions (re-admissions included)
  prompt_tokens: int = 0
  output_tokens: int = 0
  preemptions: int = 0
  state_copies: int = 0  # recurrent state copies and KV page copies executed
  kv_page_copies: int = 0  # of which KV page copies (partial hits' copy-on-write, vLLM §2.5)
  draft_tokens: int = 0  # drafts verified (speculative decoding)
  accepted_tokens: int = 0  # drafts accepted
  verify_windows: int = 0  # verify windows run (one per decoding request and step)
  # Where a step's time goes (host seconds; `forward_s` waits for the device's results):
  # schedule_s = intake + the cache core's schedule call; model_s = everything after it, of
  # which prepare_s = building the step's inputs and copy plans, forward_s = the jitted model
  # step until its tokens / logits are on the host, commit_s = appending tokens and finishing
  # requests. The engine's own (non-model) part of a step is wall_s - forward_s.
  schedule_s: float = 0.0
  model_s: float = 0.0
  prepare_s: float = 0.0
  forward_s: float = 0.0
  commit_s: float = 0.0
  wall_s: float = 0.0

  def as_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@dataclasses.dataclass
class _Req:
  rid: str
  prompt: list[int]
  max_new_tokens: int
  return_logits: bool
  extras: RequestExtras | None
  arrival: float
  output: list[int] = dataclasses.field(default_factory=list)
  logits: list[np.ndarray] = dataclasses.field(default_factory=list)
  in_manager: bool = False
  running: bool = False
  num_computed: int = 0
  num_cached: int | None = None
  prefill_computed: int = 0
  preemptions: int = 0
  first_token_time: float | None = None
  last_token_time: float | None = None
  error: str | None = None
  # speculative decoding: private pool id (KV page + carried recurrent state), whether the
  # carry slot holds the state after num_computed tokens, the block column whose K/V sits in
  # the private page, drafts verified / accepted.
  private: int | None = None
  carry_valid: bool = False
  scratch_col: int | None = None
  drafted: int = 0
  accepted: int = 0

  @property
  def num_tokens(self) -> int:
    return len(self.prompt) + len(self.output)

  @property
  def done(self) -> bool:
    return len(self.output) >= self.max_new_tokens or self.error is not None


def _bucket(n: int, buckets: Sequence[int] | None, minimum: int) -> int:
  if buckets:
    for b in buckets:
      if b >= n:
        return b
  p = minimum
  while p < n:
    p *= 2
  return p


_FAMILIES = (("G", "gdn_state", "gdn_conv"), ("M", "mamba_state", "mamba_conv"))
# the state slots of a model without recurrent layers (one unused row in `StepInputs`)
_NO_STATE = (RecurrentSlots(-1, -1, -1),)


def _chain_copies(pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
  """Copies in plan order -> one batch with the same effect (src -> dst, src != dst).

  A batched copy reads every source before writing, so a copy whose source an earlier copy
  of the same step wrote (a partial hit's copy-on-write block, then the align-mode copy out
  of it) reads that earlier copy's source instead.
  """
  written: dict[int, int] = {}
  out = []
  for s, d in pairs:
    s = written.get(s, s)
    written[d] = s
    if s != d:
      out.append((s, d))
  return out


def _copy_kv_pages(cache: cache_lib.ModelCache, src, dst) -> cache_lib.ModelCache:
  """KV pages src[i] -> dst[i] in every attention layer (-1 = padding; sources read first).

  A copied block belongs to one group, so writing it in the other groups' layers too only
  overwrites pages no request of those groups holds."""
  nb = cache.k.shape[1]
  ok = (src >= 0) & (dst >= 0)
  s, d = jnp.where(ok, src, 0), jnp.where(ok, dst, nb)
  k = cache.k.at[:, d].set(cache.k[:, s], mode="drop")
  v = cache.v.at[:, d].set(cache.v[:, s], mode="drop")
  return cache.replace(k=k, v=v)


def _apply_copies(cache: cache_lib.ModelCache, src, dst, implementation):
  """Recurrent state copies src[f, i] -> dst[f, i] (all layers of family f = 0 (GDN) or
  1 (Mamba2), state and conv); -1 = padding."""
  changes = {}
  for f, (_, s_name, c_name) in enumerate(_FAMILIES):
    s, c = getattr(cache, s_name), getattr(cache, c_name)
    if s.shape[0] == 0:
      continue
    s, c = state_copy_api.copy_state_slots((s, c), src[f], dst[f], implementation=implementation)
    changes[s_name], changes[c_name] = s, c
  return cache.replace(**changes)


@functools.partial(
  jax.jit, static_argnames=("graphdef", "implementation", "mesh"), donate_argnames=("cache",)
)
def _model_step(
  graphdef,
  params,
  cache,
  copy_src,
  copy_dst,
  inputs,
  sample_idx,
  implementation,
  mesh=None,
  kv_src=None,
  kv_dst=None,
):
  """Copies, forward, greedy sampling: (tokens int32[N], logits f32[N, V], cache).

  `copy_src/dst` are recurrent state copies per family, `kv_src/dst` KV page copies (None =
  none). With a `mesh`, the returned cache keeps the input cache's shardings (one compilation
  per step shape, not one per new output layout).
  """
  if kv_src is not None:
    cache = _copy_kv_pages(cache, kv_src, kv_dst)
  cache = _apply_copies(cache, copy_src, copy_dst, implementation)
  model = nnx.merge(graphdef, params)
  sel, cache = model(cache, inputs, implementation=implementation, logits_rows=sample_idx)
  if mesh is not None:
    cache = engine_sharding.constrain_cache(cache, mesh)
  return jnp.argmax(sel, axis=-1).astype(jnp.int32), sel, cache


# Built models by (ModelConfig, seed): parameters are never donated, so engines of one model
# share them, and sharing the graphdef object lets the jitted step skip re-tracing.
_MODELS: dict[tuple[ModelConfig, int], tuple[Any, Any]] = {}


def _split_model(cfg: ModelConfig, seed: int):
  key = (cfg, seed)
  if key not in _MODELS:
    _MODELS[key] = runner.split_model(build_model(cfg, seed=seed))
  return _MODELS[key]


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
    cache_manager: "jax" (the jitted core, default), "reference" (the plain-Python oracle,
      same protocol and block ids) or a factory `CacheConfig -> CacheManager`.
    max_num_seqs: most sequences per step (default: cache_config.max_requests).
    token_buckets / seq_buckets: ascending pad sizes for T (tokens) and N (sequences incl.
      one padding sequence); None = powers of two (T >= 16, N >= 2). Fewer buckets = fewer
      compilations.
    decode_kernels: run steps whose sequences all have one token (pure decode steps) through
      the recurrent decode kernels (`StepInputs.decode`, T = N padded to a seq bucket);
      False = every step through the chunked prefill kernels.
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
      self.graphdef, params = _split_model(self.model_config, seed)
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
    self.stats = EngineStats()
    self._reqs: dict[str, _Req] = {}
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
    **cache_kwargs: Any,
  ) -> Engine:
    """An engine serving the Hugging Face checkpoint in `model_dir` (`models.pretrained`).

    Args:
      model_dir: config.json + *.safetensors (one file or an index of shards) of a supported
        `model_type` (`models.hf_config.SUPPORTED_MODEL_TYPES`).
      dtype: "float32" | "bfloat16" (None = the checkpoint's, or the one `numerics` names).
      numerics: "exact" (fp32) or "serving" (bf16), as for `Engine`; sets `dtype`.
      mesh, implementation, cache_manager, max_num_seqs, token_buckets, seq_buckets,
        decode_kernels, drafter: as for `Engine`.
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
    engine = cls(
      loaded.model,
      engine_config.cache_config_for(loaded.config, **cache_kwargs),
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
    vocab = self.model_config.vocab_size
    try:
      toks = [int(t) for t in tokens]
      if any(int(t) != t for t in tokens):
        raise TypeError
    except (TypeError, ValueError):
      raise ValueError(f"tokens must be a sequence of integers, got {tokens!r:.80}") from None
    if not toks:
      raise ValueError("tokens must hold at least 1 token, got 0")
    bad = [t for t in toks if not 0 <= t < vocab]
    if bad:
      raise ValueError(f"tokens must be in [0, vocab_size={vocab}), got {bad[0]}")
    if len(toks) > cfg.max_model_len:
      raise ValueError(
        f"tokens has {len(toks)} tokens; the prompt must be <= max_model_len={cfg.max_model_len}"
      )
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int | np.integer):
      raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if len(toks) + max_new_tokens > cfg.max_model_len:
      raise ValueError(
        f"max_new_tokens={max_new_tokens} with a {len(toks)}-token prompt exceeds "
        f"max_model_len={cfg.max_model_len}; must be <= {cfg.max_model_len - len(toks)}"
      )
    if request_id is None:
      while f"req-{self._next_id}" in self._reqs:
        self._next_id += 1
      request_id = f"req-{self._next_id}"
      self._next_id += 1
    elif not isinstance(request_id, str) or not request_id:
      raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
    if request_id in self._reqs or request_id in self._finished:
      raise ValueError(f"request_id {request_id!r} is already used")
    r = _Req(
      request_id, toks, int(max_new_tokens), bool(return_logits), extras, time.perf_counter()
    )
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
      self._drop_stuck(finished)
      self.stats.wall_s += time.perf_counter() - t0
      return finished
    result = self.manager.schedule(entries)
    t1 = time.perf_counter()
    self.stats.schedule_s += t1 - t0
    seqs, sched, failed = [], [], []
    windows: list[engine_spec.Window] = []
    verifying: list[_Req] = []
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
        self._flush_scratch(r, tables)
        if start + n <= r.num_computed:
          continue  # catch-up: the core reaches tokens the engine verified already
        if start + n == r.num_tokens and r.num_computed == r.num_tokens - 1 >= len(r.prompt):
          windows.append(self._window(r, tables, e.recurrent))
          verifying.append(r)
          continue
      slots = e.recurrent or _NO_STATE
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
      self._flush_pending_kv()
    if seqs:
      self._run_model(seqs, sched, copies, finished)
    if windows:
      self._run_verify(windows, verifying, [] if seqs else copies, finished)
    self.stats.steps += 1
    for _ in failed:
      self._preempt_newest()
    if not seqs and not windows:
      self._drop_stuck(finished)
    self.stats.model_s += time.perf_counter() - t1
    self.stats.wall_s += time.perf_counter() - t0
    return finished

  def _copy_arrays(self, copies) -> tuple[np.ndarray, np.ndarray]:
    """The plan's recurrent copies as (src, dst) int32[families, bucket] (-1 = padding),
    chained per family (`_chain_copies`: a batched copy reads every source first)."""
    per_family = [
      _chain_copies(
        [(c.src_block, c.dst_block) for c in copies if self._family_group.get(kind) == c.group]
      )
      for kind, _, _ in _FAMILIES
    ]
    ncopy = max(_bucket(max(map(len, per_family)), None, 4), _bucket(self.max_num_seqs, None, 4))
    src = np.full((len(_FAMILIES), ncopy), -1, np.int32)
    dst = np.full((len(_FAMILIES), ncopy), -1, np.int32)
    for f, pairs in enumerate(per_family):
      for i, (a, b) in enumerate(pairs):
        src[f, i], dst[f, i] = a, b
    return src, dst

  # ---- speculative decoding (hybrid_cache.engine.spec) ----

  def _flush_scratch(self, r: _Req, tables: list[list[int]]) -> None:
    """Queues the copy of r's private K/V page once the core gave its column a block."""
    col = r.scratch_col
    if col is None:
      return
    attn = [g for g, k in enumerate(self.model_config.cache_groups) if k != "mamba"]
    if not all(len(tables[g]) > col and tables[g][col] > 0 for g in attn):
      return
    self._pending_kv.extend((g, r.private, tables[g][col]) for g in attn)
    r.scratch_col = None

  def _flush_pending_kv(self) -> None:
    cfg = self.model_config
    n_attn = cfg.count("AS")
    width = _bucket(len(self._pending_kv), None, 4)
    src = np.full((n_attn, width), -1, np.int32)
    dst = np.full((n_attn, width), -1, np.int32)
    fill = [0] * n_attn
    for kind, group, slot in zip(cfg.layer_kinds, cfg.layer_group, cfg.layer_slot, strict=True):
      if kind not in "AS":
        continue
      for g, s_id, d_id in self._pending_kv:
        if g == group:
          src[slot, fill[slot]], dst[slot, fill[slot]] = s_id, d_id
          fill[slot] += 1
    self.cache = engine_spec.copy_kv_pages(self.cache, jnp.asarray(src), jnp.asarray(dst))
    self._pending_kv = []

  def _release_private(self, r: _Req) -> None:
    if r.private is not None:
      self._pending_kv = [c for c in self._pending_kv if c[1] != r.private]
      self._free_private.append(r.private)
    r.private, r.carry_valid, r.scratch_col = None, False, None

  def _window(
    self, r: _Req, tables: list[list[int]], slots: Sequence[RecurrentSlots]
  ) -> engine_spec.Window:
    """r's verify window: last token + drafts from the drafter (see engine_spec). `slots`: the
    step result's state slots of r's one-token chunk (the window's first token)."""
    bs, c = self.block_size, r.num_computed
    tokens = r.prompt + r.output
    k = min(self.num_spec, r.max_new_tokens - len(r.output) - 1)
    draft = []
    if k > 0:
      draft = engine_spec.check_proposal(
        self.drafter.propose(tokens, k), k, self.model_config.vocab_size
      )
    if r.private is None:
      r.private = self._free_private.pop()
    col, off = engine_spec.boundary_commit(c, bs)
    spill = off < len(draft)  # drafts reach the next (unallocated) column
    tabs = []
    for g, kind in enumerate(self.model_config.cache_groups):
      row = list(tables[g])
      if kind != "mamba" and spill:
        row = row[: col + 1] + [r.private]
      tabs.append(row)
    if spill:
      r.scratch_col = col + 1
    if r.carry_valid:
      read = [r.private] * len(self.rgroups)
    else:
      read = [s.read for s in slots]
    spec = self._state_spec
    aligned = spec is not None and recurrent_slots.copies_after_verify(spec) and off <= len(draft)
    return engine_spec.Window(
      tokens=[tokens[c]] + draft,
      start=c,
      tables=tabs,
      state_read=read or [-1],
      carry=r.private,
      boundary_blocks=[tables[g][col] if aligned else -1 for g in self.rgroups] or [-1],
      boundary_offset=off if aligned else -1,
    )

  def _run_verify(self, windows, reqs, copies, finished) -> None:
    cfg = self.cache_config
    pad_n = _bucket(len(windows), self.seq_buckets, 2)
    inputs, arr = engine_spec.build_verify_inputs(
      self.model_config,
      windows,
      self.block_size,
      window=self.num_spec + 1,
      pad_seqs=pad_n,
      max_blocks=cfg.max_blocks_per_request,
    )
    src, dst = self._copy_arrays(copies)
    target, accepted, logits, self.cache = engine_spec.verify_step(
      self.graphdef,
      self.params,
      self.cache,
      jnp.asarray(src),
      jnp.asarray(dst),
      inputs,
      *(jnp.asarray(arr[k]) for k in ("drafts", "num_drafts", "carry", "boundary")),
      jnp.asarray(arr["boundary_offset"]),
      implementation=self.implementation,
      window=self.num_spec + 1,
    )
    target, accepted, logits = np.asarray(target), np.asarray(accepted), np.asarray(logits)
    now = time.perf_counter()
    for i, (r, w) in enumerate(zip(reqs, windows, strict=True)):
      a = int(accepted[i])
      nd = len(w.tokens) - 1
      r.drafted += nd
      r.accepted += a
      self.stats.draft_tokens += nd
      self.stats.accepted_tokens += a
      self.stats.verify_windows += 1
      r.num_computed = w.start + a + 1
      r.carry_valid = True
      emit = [int(t) for t in target[i, : a + 1]][: r.max_new_tokens - len(r.output)]
      for j, tok in enumerate(emit):
        r.output.append(tok)
        if r.return_logits:
          r.logits.append(logits[i, j].copy())
      self.stats.decode_tokens += len(emit)
      self.stats.output_tokens += len(emit)
      self._commit_tokens(r, emit, now, finished)

  def _commit_tokens(self, r: _Req, tokens: list[int], now: float, finished: list) -> None:
    """After r's sampled `tokens` are appended to r.output: token times, then the request
    finishes (blocks freed) or the manager extends its hash chain with the tokens."""
    if r.first_token_time is None:
      r.first_token_time = now
    r.last_token_time = now
    if r.done:
      self.manager.free(r.rid)
      self._running.remove(r.rid)
      finished.append(self._finish(r))
    else:
      self.manager.append_tokens(r.rid, tokens)

  def _run_model(self, seqs, sched, copies, finished) -> None:
    t_prepare = time.perf_counter()
    cfg = self.cache_config
    total = sum(n for _, _, n in sched)
    decode = self.decode_kernels and total == len(seqs)
    if decode:
      # One token per sequence: the recurrent layers run their decode kernels; every padding
      # sequence holds one token too (T == N).
      pad_n = pad_t = _bucket(len(seqs), self.seq_buckets, 2)
    else:
      pad_t = _bucket(total, self.token_buckets, 16)
      pad_n = _bucket(len(seqs) + 1, self.seq_buckets, 2)
    src, dst = self._copy_arrays(copies)
    kv_groups = {g for g, kind in enumerate(self.model_config.cache_groups) if kind != "mamba"}
    kv = _chain_copies([(c.src_block, c.dst_block) for c in copies if c.group in kv_groups])
    kv_args = {}
    if kv:  # partial hits only: a separate compilation for steps that copy KV pages
      kv_src = np.full((_bucket(len(kv), None, 4),), -1, np.int32)
      kv_dst = np.full_like(kv_src, -1)
      kv_src[: len(kv)], kv_dst[: len(kv)] = zip(*kv)
      kv_args = dict(kv_src=jnp.asarray(kv_src), kv_dst=jnp.asarray(kv_dst))
      if self.mesh is not None:
        kv_args = engine_sharding.replicate(kv_args, self.mesh)
    self.stats.kv_page_copies += len(kv)
    sbs = self.state_block_size
    spec = self._state_spec
    ckpt_cols = (
      pad_t // sbs if spec and recurrent_slots.kernel_checkpoints(spec) and not decode else 0
    )
    inputs = runner.build_step_inputs(
      self.model_config,
      seqs,
      self.block_size,
      ckpt_every=sbs if ckpt_cols else None,
      num_ckpt_cols=ckpt_cols,
      max_blocks=cfg.max_blocks_per_request,
      pad_tokens=pad_t,
      pad_seqs=pad_n,
      decode=decode,
    )
    qsl = np.asarray(inputs.query_start_loc)
    sample_idx = np.zeros((pad_n,), np.int32)
    sample_idx[: len(seqs)] = qsl[1 : len(seqs) + 1] - 1
    args = (jnp.asarray(src), jnp.asarray(dst), inputs, jnp.asarray(sample_idx))
    if self.mesh is not None:
      args = engine_sharding.replicate(args, self.mesh)
    t_forward = time.perf_counter()
    self.stats.prepare_s += t_forward - t_prepare
    toks, logits, self.cache = _model_step(
      self.graphdef,
      self.params,
      self.cache,
      *args,
      implementation=self.implementation,
      mesh=self.mesh,
      **kv_args,
    )
    # the logits leave the device only when a request asked for them (np.asarray rather than
    # jax.device_get: ~10x less host overhead on CPU, as in `JaxCacheManager.schedule`)
    toks = np.asarray(toks)
    logits = np.asarray(logits) if any(r.return_logits for r, _, _ in sched) else None
    now = time.perf_counter()
    self.stats.forward_s += now - t_forward
    for i, (r, start, n) in enumerate(sched):
      end = start + n
      decode = n == 1 and start == r.num_tokens - 1 and start >= len(r.prompt)
      if decode:
        self.stats.decode_tokens += 1
      else:
        self.stats.prefill_tokens_computed += n
        r.prefill_computed += n
      r.num_computed = end
      if end < r.num_tokens:
        continue
      tok = int(toks[i])
      r.output.append(tok)
      self.stats.output_tokens += 1
      if r.return_logits:
        r.logits.append(logits[i].copy())
      self._commit_tokens(r, [tok], now, finished)
    self.stats.commit_s += time.perf_counter() - now

  def _preempt_newest(self) -> None:
    if not self._running:
      return
    rid = self._running.pop()
    r = self._reqs[rid]
    self.manager.preempt(rid)
    r.running, r.num_computed = False, 0
    self._release_private(r)
    r.preemptions += 1
    self.stats.preemptions += 1
    self._waiting.appendleft(rid)

  def _drop_stuck(self, finished: list[RequestOutput]) -> None:
    """Nothing ran and nothing is running: the head waiting request can never be served."""
    if self._running or not self._waiting:
      return
    rid = self._waiting.popleft()
    r = self._reqs[rid]
    if r.in_manager:
      self.manager.free(rid)
    r.error = (
      f"request {rid!r} ({r.num_tokens} tokens) cannot be scheduled even alone: the pool "
      f"(num_blocks={self.cache_config.num_blocks}) or token budget is too small"
    )
    finished.append(self._finish(r))

  def _finish(self, r: _Req) -> RequestOutput:
    del self._reqs[r.rid]
    if self.drafter is not None:
      self._release_private(r)
      if r.error is None:
        self.drafter.record(r.prompt + r.output)
    out = RequestOutput(
      request_id=r.rid,
      prompt_tokens=r.prompt,
      output_tokens=list(r.output),
      logits=np.stack(r.logits) if r.return_logits and r.logits else None,
      num_cached_tokens=r.num_cached or 0,
      num_prefill_tokens_computed=r.prefill_computed,
      num_preemptions=r.preemptions,
      ttft_s=None if r.first_token_time is None else r.first_token_time - r.arrival,
      latency_s=None if r.last_token_time is None else r.last_token_time - r.arrival,
      finished=r.error is None and len(r.output) >= r.max_new_tokens,
      error=r.error,
      num_draft_tokens=r.drafted,
      num_accepted_tokens=r.accepted,
    )
    self._finished[r.rid] = out
    return out

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
