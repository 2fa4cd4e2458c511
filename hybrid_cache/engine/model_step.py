"""The engine's model step: the jitted forward over a step's chunks, and what feeds it.

`run_model(eng, seqs, sched, copies, finished)` is the ordinary (non-speculative) half of
`Engine.step` after scheduling: it pads the step to a token / sequence bucket (`bucket`),
turns the plan's `StateCopy`s into copy arrays (recurrent state per family: `copy_arrays`; KV
pages of attention groups, a partial hit's copy-on-write), runs the jitted `forward_step`
(copies, forward, greedy sampling on each sequence's last row) and commits the sampled tokens
to the engine's requests. The verify step of speculative decoding (`spec_step`) reuses
`bucket`, `copy_arrays` and `apply_copies`.

`shared_model` keeps one built model per (ModelConfig, seed) so engines of one model share
parameters and the jitted step's trace.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hybrid_cache.core.groups import recurrent_slots
from hybrid_cache.engine import lifecycle
from hybrid_cache.engine import sharding as engine_sharding
from hybrid_cache.engine.records import RequestOutput
from hybrid_cache.engine.records import RequestState
from hybrid_cache.types import RecurrentSlots
from hybrid_cache.types import StateCopy
from kernels.pallas.state_copy import api as state_copy_api
from models import cache as cache_lib
from models import runner
from models.config import ModelConfig
from models.hybrid_lm import build_model

if TYPE_CHECKING:
  from hybrid_cache.engine.engine import Engine


def bucket(n: int, buckets: Sequence[int] | None, minimum: int) -> int:
  """The first of the ascending `buckets` >= n, else `minimum` doubled until >= n."""
  if buckets:
    for b in buckets:
      if b >= n:
        return b
  p = minimum
  while p < n:
    p *= 2
  return p


def token_bucket(n: int, buckets: Sequence[int] | None) -> int:
  """A step's padded token count: the first of the ascending `buckets` >= n, else the first of
  16, 24, 32, 48, 64, 96, ... (two sizes per octave) >= n.

  A step's forward time on CPU is its padded tokens' (~62 GFLOP/s on the mid-size model, the
  matmuls dominate): powers of two alone pad a 134-token step to 256 and waste up to half of
  it; two sizes per octave waste at most a third for one more compilation per octave
  (`BENCHMARKS.md`, "Serving").
  """
  if buckets:
    return bucket(n, buckets, 16)
  p = 16
  while True:
    if p >= n:
      return p
    if p + p // 2 >= n:
      return p + p // 2
    p *= 2


FAMILIES = (("G", "gdn_state", "gdn_conv"), ("M", "mamba_state", "mamba_conv"))
# the state slots of a model without recurrent layers (one unused row in `StepInputs`)
NO_STATE = (RecurrentSlots(-1, -1, -1),)


def chain_copies(pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
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


def apply_copies(cache: cache_lib.ModelCache, src, dst, implementation):
  """Recurrent state copies src[f, i] -> dst[f, i] (all layers of family f = 0 (GDN) or
  1 (Mamba2), state and conv); -1 = padding."""
  changes = {}
  for f, (_, s_name, c_name) in enumerate(FAMILIES):
    s, c = getattr(cache, s_name), getattr(cache, c_name)
    if s.shape[0] == 0:
      continue
    s, c = state_copy_api.copy_state_slots((s, c), src[f], dst[f], implementation=implementation)
    changes[s_name], changes[c_name] = s, c
  return cache.replace(**changes)


@functools.partial(
  jax.jit, static_argnames=("graphdef", "implementation", "mesh"), donate_argnames=("cache",)
)
def forward_step(
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
  cache = apply_copies(cache, copy_src, copy_dst, implementation)
  model = nnx.merge(graphdef, params)
  sel, cache = model(cache, inputs, implementation=implementation, logits_rows=sample_idx)
  if mesh is not None:
    cache = engine_sharding.constrain_cache(cache, mesh)
  return jnp.argmax(sel, axis=-1).astype(jnp.int32), sel, cache


# Built models by (ModelConfig, seed): parameters are never donated, so engines of one model
# share them, and sharing the graphdef object lets the jitted step skip re-tracing.
_MODELS: dict[tuple[ModelConfig, int], tuple[Any, Any]] = {}


def shared_model(cfg: ModelConfig, seed: int):
  """(graphdef, params) of `build_model(cfg, seed)`, built once per process."""
  key = (cfg, seed)
  if key not in _MODELS:
    _MODELS[key] = runner.split_model(build_model(cfg, seed=seed))
  return _MODELS[key]


def copy_arrays(
  copies: Sequence[StateCopy], family_group: dict[str, int], max_num_seqs: int
) -> tuple[np.ndarray, np.ndarray]:
  """The plan's recurrent copies as (src, dst) int32[families, bucket] (-1 = padding),
  chained per family (`chain_copies`: a batched copy reads every source first).
  `family_group`: the cache group of each recurrent family's layers ("G", "M")."""
  per_family = [
    chain_copies([(c.src_block, c.dst_block) for c in copies if family_group.get(kind) == c.group])
    for kind, _, _ in FAMILIES
  ]
  ncopy = max(bucket(max(map(len, per_family)), None, 4), bucket(max_num_seqs, None, 4))
  src = np.full((len(FAMILIES), ncopy), -1, np.int32)
  dst = np.full((len(FAMILIES), ncopy), -1, np.int32)
  for f, pairs in enumerate(per_family):
    for i, (a, b) in enumerate(pairs):
      src[f, i], dst[f, i] = a, b
  return src, dst


def decodes_first(cfg, seqs: list[runner.SeqStep]) -> tuple[list[runner.SeqStep], list[int], int]:
  """A mixed step's chunks with the one-token ones first (`models.decode_split`): (the step's
  sequences, the position of each of `seqs` in it, num_decodes D).

  D is bucketed to a power of two (one compilation per bucket, not per count) by padding
  one-token sequences (`runner.padding_decode`, ~ one decode's cost each); D = 0 when no chunk
  has one token. A one-token prefill chunk counts as a decode: the same recurrence step.
  """
  ones = [i for i, s in enumerate(seqs) if len(s.token_ids) == 1]
  if not ones:
    return seqs, list(range(len(seqs))), 0
  rest = [i for i, s in enumerate(seqs) if len(s.token_ids) != 1]
  d = bucket(len(ones), None, 1)
  padding = [runner.padding_decode(cfg)] * (d - len(ones))
  out = [seqs[i] for i in ones] + padding + [seqs[i] for i in rest]
  position = [0] * len(seqs)
  for p, i in enumerate(ones):
    position[i] = p
  for p, i in enumerate(rest):
    position[i] = d + p
  return out, position, d


def run_model(
  eng: Engine,
  seqs: list[runner.SeqStep],
  sched: list[tuple[RequestState, int, int]],
  copies: Sequence[StateCopy],
  finished: list[RequestOutput],
) -> None:
  """Runs `eng`'s model step over the scheduled chunks `seqs` (`sched`: (request, start,
  tokens) of each), after the plan's `copies`; samples the last token of every chunk that
  completes its request's tokens and commits it (`lifecycle.commit_tokens`), appending the
  requests that finish to `finished`; updates `eng.cache` and `eng.stats`."""
  t_prepare = time.perf_counter()
  total = sum(n for _, _, n in sched)
  decode = eng.decode_kernels and total == len(seqs)
  # where each scheduled chunk sits in the model's step (a mixed step reorders them)
  position = list(range(len(seqs)))
  num_decodes = 0
  if decode:
    # One token per sequence: the recurrent layers run their decode kernels; every padding
    # sequence holds one token too (T == N).
    pad_n = pad_t = bucket(len(seqs), eng.seq_buckets, 2)
  else:
    if eng.decode_kernels:
      eng.stats.mixed_step_decodes += sum(len(s.token_ids) == 1 for s in seqs)
      seqs, position, num_decodes = decodes_first(eng.model_config, seqs)
    pad_t = token_bucket(sum(len(s.token_ids) for s in seqs), eng.token_buckets)
    # the chunked kernels give every sequence after the decodes a chunk slot, padding ones
    # included (`kernels.pallas.packing`): the seq bucket counts those sequences only
    pad_n = num_decodes + bucket(len(seqs) - num_decodes + 1, eng.seq_buckets, 2)
  src, dst = copy_arrays(copies, eng._family_group, eng.max_num_seqs)
  kv_groups = {g for g, kind in enumerate(eng.model_config.cache_groups) if kind != "mamba"}
  kv = chain_copies([(c.src_block, c.dst_block) for c in copies if c.group in kv_groups])
  kv_args = {}
  if kv:  # partial hits only: a separate compilation for steps that copy KV pages
    kv_src = np.full((bucket(len(kv), None, 4),), -1, np.int32)
    kv_dst = np.full_like(kv_src, -1)
    kv_src[: len(kv)], kv_dst[: len(kv)] = zip(*kv)
    kv_args = dict(kv_src=jnp.asarray(kv_src), kv_dst=jnp.asarray(kv_dst))
    if eng.mesh is not None:
      kv_args = engine_sharding.replicate(kv_args, eng.mesh)
  eng.stats.kv_page_copies += len(kv)
  sbs = eng.state_block_size
  spec = eng._state_spec
  ckpt_cols = (
    pad_t // sbs if spec and recurrent_slots.kernel_checkpoints(spec) and not decode else 0
  )
  inputs = runner.build_step_inputs(
    eng.model_config,
    seqs,
    eng.block_size,
    ckpt_every=sbs if ckpt_cols else None,
    num_ckpt_cols=ckpt_cols,
    # one table width per group (its own block size): attention reads every column
    max_blocks=eng.table_widths,
    pad_tokens=pad_t,
    pad_seqs=pad_n,
    decode=decode,
    num_decodes=num_decodes,
  )
  # the chunks' offsets on the host (reading `inputs.query_start_loc` back would wait for the
  # device copy just made)
  qsl = runner.query_start_loc(seqs)
  sample_idx = np.zeros((pad_n,), np.int32)
  sample_idx[: len(position)] = qsl[np.asarray(position) + 1] - 1  # in `sched` order
  args = (jnp.asarray(src), jnp.asarray(dst), inputs, jnp.asarray(sample_idx))
  if eng.mesh is not None:
    args = engine_sharding.replicate(args, eng.mesh)
  t_forward = time.perf_counter()
  eng.stats.prepare_s += t_forward - t_prepare
  toks, logits, eng.cache = forward_step(
    eng.graphdef,
    eng.params,
    eng.cache,
    *args,
    implementation=eng.implementation,
    mesh=eng.mesh,
    **kv_args,
  )
  # the logits leave the device only when a request asked for them (np.asarray rather than
  # jax.device_get: ~10x less host overhead on CPU, as in `JaxCacheManager.schedule`)
  toks = np.asarray(toks)
  logits = np.asarray(logits) if any(r.return_logits for r, _, _ in sched) else None
  now = time.perf_counter()
  eng.stats.forward_s += now - t_forward
  for i, (r, start, n) in enumerate(sched):
    end = start + n
    decode = n == 1 and start == r.num_tokens - 1 and start >= len(r.prompt)
    if decode:
      eng.stats.decode_tokens += 1
    else:
      eng.stats.prefill_tokens_computed += n
      r.prefill_computed += n
    r.num_computed = end
    if end < r.num_tokens:
      continue
    tok = int(toks[i])
    r.output.append(tok)
    eng.stats.output_tokens += 1
    if r.return_logits:
      r.logits.append(logits[i].copy())
    lifecycle.commit_tokens(eng, r, [tok], now, finished)
  eng.stats.commit_s += time.perf_counter() - now
