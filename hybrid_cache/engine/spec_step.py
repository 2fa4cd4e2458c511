"""The engine's speculative step: verify windows over the engine's requests (`spec` has the rules).

With a drafter, `Engine.step` turns a decoding request's one-token chunk into a verify window
(`window`: last token + drafts, the private page for drafts past the core's blocks, which
recurrent state to read), runs all windows in one `run_verify` (the jitted `spec.verify_step`)
and commits the accepted tokens. Each request holds one private pool id while it runs
(`Engine._free_private`); a private K/V page whose column the core has since given a block is
queued (`flush_scratch`) and copied before the step's forward (`flush_pending_kv`);
`lifecycle.release_private` returns the id. Functions of the engine's state: each takes the
`Engine`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax.numpy as jnp
import numpy as np

from hybrid_cache.core.groups import recurrent_slots
from hybrid_cache.engine import lifecycle
from hybrid_cache.engine import model_step
from hybrid_cache.engine import spec as engine_spec
from hybrid_cache.engine.records import RequestOutput
from hybrid_cache.engine.records import RequestState
from hybrid_cache.types import RecurrentSlots
from hybrid_cache.types import StateCopy

if TYPE_CHECKING:
  from hybrid_cache.engine.engine import Engine


def flush_scratch(eng: Engine, r: RequestState, tables: list[list[int]]) -> None:
  """Queues the copy of r's private K/V page once the core gave its column a block."""
  col = r.scratch_col
  if col is None:
    return
  attn = [g for g, k in enumerate(eng.model_config.cache_groups) if k != "mamba"]
  if not all(len(tables[g]) > col and tables[g][col] > 0 for g in attn):
    return
  eng._pending_kv.extend((g, r.private, tables[g][col]) for g in attn)
  r.scratch_col = None


def flush_pending_kv(eng: Engine) -> None:
  """Runs the queued private-page K/V copies on `eng.cache` (before any forward of the step)."""
  cfg = eng.model_config
  n_attn = cfg.count("AS")
  width = model_step.bucket(len(eng._pending_kv), None, 4)
  src = np.full((n_attn, width), -1, np.int32)
  dst = np.full((n_attn, width), -1, np.int32)
  fill = [0] * n_attn
  for kind, group, slot in zip(cfg.layer_kinds, cfg.layer_group, cfg.layer_slot, strict=True):
    if kind not in "AS":
      continue
    for g, s_id, d_id in eng._pending_kv:
      if g == group:
        src[slot, fill[slot]], dst[slot, fill[slot]] = s_id, d_id
        fill[slot] += 1
  eng.cache = engine_spec.copy_kv_pages(eng.cache, jnp.asarray(src), jnp.asarray(dst))
  eng._pending_kv = []


def window(
  eng: Engine, r: RequestState, tables: list[list[int]], slots: Sequence[RecurrentSlots]
) -> engine_spec.Window:
  """r's verify window: last token + drafts from the drafter (see engine_spec). `slots`: the
  step result's state slots of r's one-token chunk (the window's first token)."""
  bs, c = eng.block_size, r.num_computed
  tokens = r.prompt + r.output
  k = min(eng.num_spec, r.max_new_tokens - len(r.output) - 1)
  draft = []
  if k > 0:
    draft = engine_spec.check_proposal(
      eng.drafter.propose(tokens, k), k, eng.model_config.vocab_size
    )
  if r.private is None:
    r.private = eng._free_private.pop()
  col, off = engine_spec.boundary_commit(c, bs)
  spill = off < len(draft)  # drafts reach the next (unallocated) column
  tabs = []
  for g, kind in enumerate(eng.model_config.cache_groups):
    row = list(tables[g])
    if kind != "mamba" and spill:
      row = row[: col + 1] + [r.private]
    tabs.append(row)
  if spill:
    r.scratch_col = col + 1
  if r.carry_valid:
    read = [r.private] * len(eng.rgroups)
  else:
    read = [s.read for s in slots]
  spec = eng._state_spec
  aligned = spec is not None and recurrent_slots.copies_after_verify(spec) and off <= len(draft)
  return engine_spec.Window(
    tokens=[tokens[c]] + draft,
    start=c,
    tables=tabs,
    state_read=read or [-1],
    carry=r.private,
    boundary_blocks=[tables[g][col] if aligned else -1 for g in eng.rgroups] or [-1],
    boundary_offset=off if aligned else -1,
  )


def run_verify(
  eng: Engine,
  windows: list[engine_spec.Window],
  reqs: list[RequestState],
  copies: Sequence[StateCopy],
  finished: list[RequestOutput],
) -> None:
  """Runs the verify step over `windows` (one per request of `reqs`) after the plan's
  `copies`; emits each request's accepted drafts and the target's next token and commits
  them (`lifecycle.commit_tokens`), appending the requests that finish to `finished`; updates
  `eng.cache` and `eng.stats`."""
  cfg = eng.cache_config
  pad_n = model_step.bucket(len(windows), eng.seq_buckets, 2)
  inputs, arr = engine_spec.build_verify_inputs(
    eng.model_config,
    windows,
    eng.block_size,
    window=eng.num_spec + 1,
    pad_seqs=pad_n,
    max_blocks=cfg.max_blocks_per_request,
  )
  src, dst = model_step.copy_arrays(copies, eng._family_group, eng.max_num_seqs)
  target, accepted, logits, eng.cache = engine_spec.verify_step(
    eng.graphdef,
    eng.params,
    eng.cache,
    jnp.asarray(src),
    jnp.asarray(dst),
    inputs,
    *(jnp.asarray(arr[k]) for k in ("drafts", "num_drafts", "carry", "boundary")),
    jnp.asarray(arr["boundary_offset"]),
    implementation=eng.implementation,
    window=eng.num_spec + 1,
  )
  target, accepted, logits = np.asarray(target), np.asarray(accepted), np.asarray(logits)
  now = time.perf_counter()
  for i, (r, w) in enumerate(zip(reqs, windows, strict=True)):
    a = int(accepted[i])
    nd = len(w.tokens) - 1
    r.drafted += nd
    r.accepted += a
    eng.stats.draft_tokens += nd
    eng.stats.accepted_tokens += a
    eng.stats.verify_windows += 1
    r.num_computed = w.start + a + 1
    r.carry_valid = True
    emit = [int(t) for t in target[i, : a + 1]][: r.max_new_tokens - len(r.output)]
    for j, tok in enumerate(emit):
      r.output.append(tok)
      if r.return_logits:
        r.logits.append(logits[i, j].copy())
    eng.stats.decode_tokens += len(emit)
    eng.stats.output_tokens += len(emit)
    lifecycle.commit_tokens(eng, r, emit, now, finished)
