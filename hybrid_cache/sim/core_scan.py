"""Replays a trace through the pure cache core in one jitted `lax.scan` per chunk of requests.

Same per-request life as the protocol path (`core_sim.run_core`), with no host round trip:

  register(input)                      # scheduler.write_request's update, tokens = prompt
  step until the prompt is computed    # scheduler.admit_one, max_tokens unbounded
  register(input + output[:-1])        # appended tokens (the last sampled one is never computed)
  step in block-aligned chunks         # admit_one with max_tokens = B - computed % B (one
                                       # chunk: `core_sim.output_in_one_chunk`)
  release                              # release.release(preempt=False)

Reused tokens = the first step's hit. A step that schedules nothing marks the request failed
(capacity too small) and ends its loop; the host raises after the chunk.

Host preparation is vectorised (`prepare`): chained prefix hashes of every hash block of every
request come from a position-weighted sum over the prefix (mod 2^64, `_prefix_hashes`), so a
Mooncake symbol (a run of consecutive token ids) costs O(1) and no per-token Python runs. The
values differ from `hashing.block_hashes` (blake2b) but identify the same prefixes (collision
probability ~2^-64 per pair), which is all the core compares (`hashing.py` on the simulator's
hashing schemes and why they differ).

Per-request outputs (`_OUT_COLS`, read back by name): reused tokens, failed flag, steps, the
recurrent blocks the request held at finish, recurrent keys admitted / recurrent keyed blocks
evicted (deltas of `CacheState.states_admitted` / `states_evicted`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_cache.config import CacheConfig
from hybrid_cache.core import block_pool
from hybrid_cache.core import compile_cache
from hybrid_cache.core import outputs
from hybrid_cache.core import release as release_lib
from hybrid_cache.core import scheduler
from hybrid_cache.core.fresh_state import init_state
from hybrid_cache.core.layout import layout
from hybrid_cache.core.policies import flop_aware
from hybrid_cache.core.policies import tuned as tuned_policy
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import ReqInfo
from hybrid_cache.hashing import mix64
from hybrid_cache.sim import core_sim
from hybrid_cache.sim.trace import Trace

DEFAULT_CHUNK = 1024
_SEED = 0x5EED_CAFE
# a request's outputs, the columns of `replay_chunk`'s i32[C, 6] (`_col`: a column by name)
_OUT_COLS = ("reused", "failed", "steps", "rec_held", "rec_admitted", "rec_evicted")


def _col(out: np.ndarray, name: str) -> np.ndarray:
  """Column `name` (`_OUT_COLS`) of the per-request outputs `out` (i32[n, 6])."""
  return out[:, _OUT_COLS.index(name)]


# ---------------------------------------------------------------------------------------------
# host side: vectorised prefix hashes


@dataclasses.dataclass(frozen=True)
class Prepared:
  """Per-request arrays of a trace for the scan (host NumPy).

  n_in, n_total: i32[n] prompt tokens and tokens computed in all (prompt + output - 1, or the
  prompt when there is no output). hash_off: i32[n] first row of the request's hashes in
  `hashes`; hashes: u32[P, 2] chained hashes of every full hash block of the first `n_total`
  tokens, request after request, then zero rows (at least max_hashes; P a power of two).
  """

  n_in: np.ndarray
  n_total: np.ndarray
  hash_off: np.ndarray
  hashes: np.ndarray


def _prefix_hashes(trace: Trace, hbs: int, ends_tokens: np.ndarray) -> tuple[np.ndarray, list]:
  """u32[sum_i ends_i // hbs, 2]: hash of each request's prefix at every full hash block.

  H(e) = mix(sum_{t<e} tok[t] * R[t]) mod 2^64 with fixed random R; a symbol (width w, first
  token s) contributes s' * (SR[c1] - SR[c0]) + (TR[c1] - TR[c0]) with s' = s - c0,
  SR/TR the prefix sums of R and t * R[t].
  """
  reqs = trace.requests
  nblk = ends_tokens // hbs
  maxlen = max((int(q.cum[-1]) for q in reqs), default=0)
  if len(reqs) and np.any(ends_tokens > [int(q.cum[-1]) for q in reqs]):
    raise ValueError("ends_tokens must be <= each request's token count")
  rng = np.random.default_rng(_SEED)
  r = rng.integers(0, 2**63, size=maxlen + 1, dtype=np.int64).astype(np.uint64) | np.uint64(1)
  t = np.arange(maxlen + 1, dtype=np.uint64)
  sr = np.zeros(maxlen + 2, np.uint64)
  tr = np.zeros(maxlen + 2, np.uint64)
  np.cumsum(r, out=sr[1:])
  np.cumsum(r * t, out=tr[1:])
  seqs = [q.seq for q in reqs]
  cums = [q.cum for q in reqs]
  nsym = np.array([len(s) for s in seqs], np.int64)
  if len(reqs) == 0 or nblk.sum() == 0:
    return np.zeros((0, 2), np.uint32), nblk
  seq = np.concatenate(seqs)
  c0 = np.concatenate([c[:-1] for c in cums])
  c1 = np.concatenate([c[1:] for c in cums])
  a = (seq - c0).astype(np.uint64)  # token(t) = a + t inside the symbol (wraps mod 2^64)
  contrib = a * (sr[c1] - sr[c0]) + (tr[c1] - tr[c0])
  incl = np.cumsum(contrib)  # wraps mod 2^64
  sym_start = np.concatenate([[0], np.cumsum(nsym)[:-1]])
  # exclusive prefix sum inside each request
  base = np.where(sym_start > 0, incl[np.maximum(sym_start - 1, 0)], np.uint64(0))
  before = incl - contrib - np.repeat(base, nsym)
  # global token coordinates: request i's tokens start at tok_off[i]
  lens = np.array([int(c[-1]) for c in cums], np.int64)
  tok_off = np.concatenate([[0], np.cumsum(lens)[:-1]])
  g_c0 = c0 + np.repeat(tok_off, nsym)
  req_of_block = np.repeat(np.arange(len(reqs)), nblk)
  blk_start = np.concatenate([[0], np.cumsum(nblk)[:-1]])
  j = np.arange(int(nblk.sum()), dtype=np.int64) - np.repeat(blk_start, nblk)
  e = (j + 1) * hbs  # local end of each hash block
  s = np.searchsorted(g_c0, e - 1 + tok_off[req_of_block], side="right") - 1
  h = before[s] + a[s] * (sr[e] - sr[c0[s]]) + (tr[e] - tr[c0[s]])
  h = mix64(h)
  out = np.stack(
    [(h & np.uint64(0xFFFFFFFF)).astype(np.uint32), (h >> np.uint64(32)).astype(np.uint32)], 1
  )
  return out, nblk


def prepare(trace: Trace, config: CacheConfig) -> Prepared:
  """Per-request scan inputs (see `Prepared`); ValueError if a request exceeds max_model_len."""
  lay = layout(config)
  n_in = np.array([q.num_input_tokens for q in trace.requests], np.int64)
  n_out = np.array([q.num_output_tokens for q in trace.requests], np.int64)
  n_total = n_in + np.maximum(n_out - 1, 0)
  if len(n_total) and int(n_total.max()) > config.max_model_len:
    i = int(np.argmax(n_total))
    raise ValueError(
      f"request {i} needs {int(n_total[i])} tokens; must be <= max_model_len={config.max_model_len}"
    )
  if len(n_in) and int(n_in.min()) < 1:
    raise ValueError(f"request {int(np.argmin(n_in))} has no input tokens; must have >= 1")
  hashes, nblk = _prefix_hashes(trace, lay.hash_block_size, n_total)
  off = np.concatenate([[0], np.cumsum(nblk)[:-1]]).astype(np.int64)
  if len(hashes) + lay.max_hashes >= 2**31:
    raise ValueError(f"trace has {len(hashes)} hash blocks; must be < 2**31 - max_hashes")
  # pad to a power of two (>= max_hashes zero rows) so traces of similar size share a compile
  size = 1 << int(np.ceil(np.log2(len(hashes) + lay.max_hashes)))
  pad = np.zeros((size - len(hashes), 2), np.uint32)
  return Prepared(
    n_in=n_in.astype(np.int32),
    n_total=n_total.astype(np.int32),
    hash_off=off.astype(np.int32),
    hashes=np.concatenate([hashes, pad]),
  )


# ---------------------------------------------------------------------------------------------
# device side: one request's life, scanned


def _request(config: CacheConfig, hashes, state: CacheState, x):
  """Runs one request (x = n_in, n_total, hash_off, valid); returns (state, i32[6] outputs)."""
  lay = layout(config)
  n_in, n_total, off, valid = x
  slot = jnp.int32(0)
  hbs = lay.hash_block_size
  bs = config.block_size
  rows = jax.lax.dynamic_slice(hashes, (off, 0), (lay.max_hashes, 2))
  pos = jnp.arange(lay.max_hashes)[:, None]
  row_in = jnp.where(pos < n_in // hbs, rows, 0)
  row_all = jnp.where(pos < n_total // hbs, rows, 0)
  whole_output = core_sim.output_in_one_chunk(config)

  def live(state):
    adm0, ev0 = state.states_admitted, state.states_evicted
    state = block_pool.maybe_renormalise(state)
    state = scheduler.register_request(state, slot, row_in, n_in, n_in)

    def cond(c):
      state, _, _, failed = c
      return ~failed & (ReqInfo(state.req_info)[slot].computed < n_total)

    def body(c):
      state, hit, steps, _ = c
      computed = ReqInfo(state.req_info)[slot].computed
      grow = (computed >= n_in) & (ReqInfo(state.req_info)[slot].tokens < n_total)
      # masked write, not lax.cond: on XLA:CPU a cond over the state copies its leaves
      grown = scheduler.register_request(state, slot, row_all, n_total, n_in)
      state = state.replace(
        req_info=jnp.where(grow, grown.req_info, state.req_info),
        req_hashes=jnp.where(grow, grown.req_hashes, state.req_hashes),
      )
      if whole_output:  # static: other configs keep their program
        max_tok = jnp.int32(-1)
      else:
        max_tok = jnp.where(computed < n_in, -1, bs - computed % bs)
      state, out = scheduler.admit_one(config, state, slot, max_tok)
      hit = jnp.where(steps == 0, out["hit"], hit)
      return state, hit, steps + 1, out["scheduled"] == 0

    state, hit, steps, failed = jax.lax.while_loop(
      cond, body, (state, jnp.int32(0), jnp.int32(0), jnp.bool_(False))
    )
    held = jnp.int32(0)
    for g in lay.recurrent_groups:
      held = held + jnp.sum(state.tables[slot, g] > 0).astype(jnp.int32)
    state = release_lib.release(lay, state, slot, False)
    adm = state.states_admitted - adm0
    ev = state.states_evicted - ev0
    out = dict(
      reused=hit,
      failed=failed.astype(jnp.int32),
      steps=steps,
      rec_held=held,
      rec_admitted=adm,
      rec_evicted=ev,
    )
    return state, jnp.stack([out[k] for k in _OUT_COLS])

  def skip(state):
    return state, jnp.zeros((len(_OUT_COLS),), jnp.int32)

  return jax.lax.cond(valid, live, skip, state)


@compile_cache.entry_point(donate_argnums=(0,))
def replay_chunk(config: CacheConfig, state: CacheState, hashes, n_in, n_total, hash_off, valid):
  """Scans one chunk of requests (i32[C] each, bool[C] valid); returns (state, i32[C, 6])."""
  return jax.lax.scan(
    functools.partial(_request, config, hashes), state, (n_in, n_total, hash_off, valid)
  )


def _replay_range(
  config, p: Prepared, hashes, state, start: int, end: int, chunk, on_chunk, progress=None
):
  """Scans requests [start, end) from `state`; returns (state, [i32[k, 6] per chunk]).
  `progress(e)` (optional) runs after each chunk with e = the requests replayed so far."""
  outs = []
  for s in range(start, end, chunk):
    e = min(s + chunk, end)
    pad = chunk - (e - s)

    def col(a, s=s, e=e, pad=pad):
      return np.concatenate([a[s:e], np.zeros(pad, a.dtype)])

    valid = np.arange(chunk) < (e - s)
    state, out = replay_chunk(
      config, state, hashes, col(p.n_in), col(p.n_total), col(p.hash_off), valid
    )
    out = np.asarray(jax.device_get(out))[: e - s]
    outs.append(out)
    bad = np.nonzero(_col(out, "failed"))[0]
    if len(bad):
      i = s + int(bad[0])
      raise ValueError(
        f"request {i} made no progress (allocation failed); capacity too small for it"
      )
    if on_chunk is not None:
      on_chunk(e - 1, state)
    if progress is not None:
      progress(e)
  return state, outs


LAST_SCORED = 500  # Marconi's tuner scores FLOPs saved over the last 500 replayed requests


def _replay_tuned(config, p: Prepared, hashes, chunk, on_chunk, model, opts, progress=None):
  """Marconi's V2 alpha schedule on the scan (`hybrid_cache.core.alpha_tuning.OnlineAlphaTuner`).

  alpha = 0 until the first request that evicts a recurrent state (request e; the core's
  `states_evicted` counter, Marconi's "first eviction" where every node holds a state); window
  W = multiplier * (e + 1); after request W - 1 the first W requests are replayed from an empty
  cache once per grid alpha (one compile serves them all: alpha lives in the state), scored by
  the FLOPs saved (`model.prefill_flops`) over their last 500 requests; the best alpha applies
  from request W on. Returns (state, outs, tuning summary).
  """
  try:
    from hybrid_cache.core import alpha_tuning
  except ImportError as e:
    raise ValueError(f"alpha 'tuned' needs the core's alpha tuner ({e})") from None
  if model is None:
    raise ValueError("alpha 'tuned' needs tune_model (the sim cost model)")
  from hybrid_cache.sim.metrics import flops_saved

  opts = dict(opts or {})
  n = len(p.n_in)
  runs: dict[float, tuple] = {}

  def replay(a: float, k: int) -> float:
    st = flop_aware.set_alpha(init_state(config), a)
    st, o = _replay_range(config, p, hashes, st, 0, k, chunk, None)
    runs[a] = (st, o)
    reused = _col(np.concatenate(o), "reused") if o else np.zeros(0, np.int32)
    return float(flops_saved(model, reused[-LAST_SCORED:]))

  tuner = alpha_tuning.OnlineAlphaTuner(replay, **opts)
  # alpha 0, chunk by chunk, until the first recurrent eviction
  state, outs, s, e = init_state(config), [], 0, None
  while s < n and e is None:
    state, o = _replay_range(config, p, hashes, state, s, min(s + chunk, n), chunk, None, progress)
    outs += o
    ev = np.nonzero(_col(o[0], "rec_evicted") > 0)[0]
    e = s + int(ev[0]) if len(ev) else None
    s = min(s + chunk, n)
  info = {"alpha": 0.0, "first_eviction": e, "window": None, "scores": None}
  if e is None:
    return state, outs, info
  got = tuner.observe(requests_seen=e + 1, evicted=True)
  w = tuner.window
  info["window"] = w
  if got is None:
    if w > n:  # the window never closes: alpha stays 0 (as Marconi)
      state, rest = _replay_range(config, p, hashes, state, s, n, chunk, None, progress)
      return state, outs + rest, info
    got = tuner.observe(requests_seen=w, evicted=True)
  info["alpha"] = float(got)
  info["scores"] = [list(x) for x in tuner.history[-1].scores]
  # the live state after request W - 1 at alpha 0 is the alpha-0 grid replay's state
  if 0.0 not in runs:
    replay(0.0, w)
  st0, o0 = runs[0.0]
  st = flop_aware.set_alpha(st0, got)
  st, rest = _replay_range(config, p, hashes, st, w, n, chunk, None, progress)
  if on_chunk is not None:
    on_chunk(n - 1, st)
  return st, list(o0) + rest, info


# eviction `tuned`'s re-tuning (`_replay_shadowed`): requests between re-tunes and the score's
# half-life in requests. The unit cache's are 256 and 2,048 (`eviction_weightings`); with those
# a ~1,300-request ShareGPT replay re-tunes 4-5 times on a nearly cumulative score and
# switched to LRU-2 late (GreedyDual 512 requests, then LRU-2: 7.05e15 at seed 2, 3e9, below
# both fixed weightings, 7.69 and 7.60; forcing the switch at request 0, 64, 256, 512 gives
# 7.60, 7.60, 7.45, 7.11). 64 and 256 follow the recent requests: real ShareGPT 1.24-1.48x
# vLLM best on all 6 points (was 1.08-1.48x), agentic unchanged (GreedyDual throughout).
# Chosen on those points (BENCHMARKS.md section 3, "eviction `tuned`").
RETUNE_EVERY = 64
RETUNE_HALF_LIFE = 256.0


def _replay_shadowed(config, p: Prepared, hashes, model, on_chunk, progress=None):
  """Eviction `tuned`'s online re-tuning (`core/policies/tuned.py`), the unit cache's rule
  (`sim/eviction_weightings.py`, `checkpoint_sweep`) with its own constants (`RETUNE_EVERY`,
  `RETUNE_HALF_LIFE` above): one shadow state per weighting (`tuned.WEIGHTINGS`, fixed)
  replays the same requests beside the live state; each shadow's score decays by
  2^(-1 / `RETUNE_HALF_LIFE`) per request and adds the FLOPs its hit saved
  (`model.prefill_flops`); after every `RETUNE_EVERY` requests the live state takes the
  weighting of the best-scoring shadow (ties: the first; LRU-2 only with a retirement policy,
  as the unit cache's LRU-2 shadow is eligible only while superseded checkpoints are retired).
  The live state starts as GreedyDual (the unit cache's default, hits/1) and is that shadow's
  state until its first switch (no separate replay until then). Every scan runs chunks of
  `RETUNE_EVERY` requests (one compile serves the live state and the shadows: the weighting
  lives in the state). Returns (live state, outs, tuning summary)."""
  if model is None:
    raise ValueError("eviction 'tuned' needs tune_model (the sim cost model that scores shadows)")
  n = len(p.n_in)
  every = RETUNE_EVERY
  decay = 0.5 ** (1.0 / RETUNE_HALF_LIFE)
  names = tuned_policy.WEIGHTINGS
  eligible = [w != "lru2" or config.retirement != "none" for w in names]
  shadows = [tuned_policy.set_weighting(init_state(config), w) for w in names]
  score = [0.0] * len(names)
  current, live, outs = 0, None, []  # live None: it is still shadow `current`'s state
  used = dict.fromkeys(names, 0)
  switches = []
  for s in range(0, n, every):
    e = min(s + every, n)
    for i in range(len(names)):
      shadows[i], o = _replay_range(config, p, hashes, shadows[i], s, e, every, None)
      if live is None and i == current:
        outs += o
      for r in _col(np.concatenate(o), "reused").tolist():
        score[i] = score[i] * decay + (model.prefill_flops(int(r)) if r else 0)
    if live is not None:
      live, o = _replay_range(config, p, hashes, live, s, e, every, None)
      outs += o
    used[names[current]] += e - s
    if progress is not None:
      progress(e)
    if e - s == every:
      best = max((i for i in range(len(names)) if eligible[i]), key=lambda i: (score[i], -i))
      if best != current:
        # the live state leaves the shadow it was: its own buffers (the scans donate theirs)
        src = jax.tree.map(jnp.copy, shadows[current]) if live is None else live
        live = tuned_policy.set_weighting(src, names[best])
        current = best
        switches.append((e, names[best]))
  state = shadows[current] if live is None else live
  if on_chunk is not None:
    on_chunk(n - 1, state)
  info = {"weighting": names[current], "requests_per_weighting": used, "switches": switches}
  return state, outs, info


def run_scan(
  trace: Trace,
  config: CacheConfig,
  *,
  chunk: int | None = None,
  on_chunk: Callable[[int, CacheState], None] | None = None,
  prepared: Prepared | None = None,
  details: dict | None = None,
  alpha: float | str | None = None,
  tune_model=None,
  tune_opts: dict | None = None,
  weighting: str | None = None,
  progress: Callable[[int], None] | None = None,
) -> tuple[list[tuple[int, int, int]], dict]:
  """Replays `trace` from a fresh state; returns (triples, counters) like `run_core`.

  `chunk` requests per jitted call (None: DEFAULT_CHUNK; the last chunk is padded; shapes stay
  fixed so one compile serves all chunks). `on_chunk(last_request_index, state)` runs after
  each chunk (chunk=1 gives a check after every request). ValueError if a request cannot make
  progress (capacity).
  `alpha` (FLOP-aware eviction) is written into the initial state (`flop_aware.set_alpha`);
  "tuned" runs Marconi's online tuner instead (`_replay_tuned`; needs `tune_model`, the sim
  cost model that scores FLOPs saved, and the core's `hybrid_cache.core.alpha_tuning`).
  Eviction `tuned` runs its shadow tuner (`_replay_shadowed`; needs `tune_model`) unless
  `weighting` ("greedy_dual" or "lru2") fixes its weighting.
  `details`, if given, receives the per-request output columns ("per_request") and the final
  state ("final_state"). `progress(k)`, if given, runs as the live replay advances, with k =
  the requests replayed so far (after each chunk; under the shadow tuner after each re-tuning
  interval; Marconi's tuner's grid replays do not advance it), e.g. a tqdm bar's position.
  """
  chunk = DEFAULT_CHUNK if chunk is None else chunk
  if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
    raise ValueError(f"chunk must be an integer >= 1, got {chunk!r}")
  if config.max_requests < 1:
    raise ValueError(f"config.max_requests must be >= 1, got {config.max_requests}")
  t0 = time.perf_counter()
  c0 = time.process_time()
  p = prepared if prepared is not None else prepare(trace, config)
  t_prep = time.perf_counter() - t0
  n = len(p.n_in)
  hashes = jnp.asarray(p.hashes)
  tuning = None
  shadowed = config.eviction == "tuned" and weighting is None  # the shadow tuner sets it
  if shadowed:
    state, outs, tuning = _replay_shadowed(config, p, hashes, tune_model, on_chunk, progress)
  elif alpha == "tuned":
    state, outs, tuning = _replay_tuned(
      config, p, hashes, chunk, on_chunk, tune_model, tune_opts, progress
    )
    alpha = tuning["alpha"]
  else:
    state = init_state(config)
    if alpha is not None:
      state = flop_aware.set_alpha(state, alpha)
    if weighting is not None:
      if config.eviction != "tuned":
        raise ValueError(f"a weighting needs eviction 'tuned', got {config.eviction!r}")
      state = tuned_policy.set_weighting(state, weighting)
    state, outs = _replay_range(config, p, hashes, state, 0, n, chunk, on_chunk, progress)
  res = np.concatenate(outs) if outs else np.zeros((0, len(_OUT_COLS)), np.int32)
  wall = time.perf_counter() - t0
  reused = _col(res, "reused").tolist()
  triples = [(int(r > 0), int(i), int(r)) for i, r in zip(p.n_in.tolist(), reused)]
  st = outputs.unpack_stats(jax.device_get(scheduler.pool_stats(config, state)))
  counters = {
    "backend": "jax_scan",
    "alpha": alpha,
    "replay_s": wall,
    "replay_cpu_s": time.process_time() - c0,
    "prepare_s": t_prep,
    "steps": int(_col(res, "steps").sum()),
    "final_cached_blocks_per_group": [int(x) for x in st["cached_per_group"]],
    "final_pinned_blocks": int(st["num_pinned"]),
    "recurrent_blocks_held_at_finish": int(_col(res, "rec_held").sum()),
    # keys a full index bucket dropped (later misses, never wrong hits; `block_index`)
    "index_overflows": int(jax.device_get(state.index_overflows)),
  }
  if tuning is not None:
    counters["weighting_tuning" if shadowed else "alpha_tuning"] = tuning
  counters["states_admitted"] = int(_col(res, "rec_admitted").sum())
  counters["states_evicted"] = int(_col(res, "rec_evicted").sum())
  if config.retirement != "none":
    counters["states_retired"] = int(jax.device_get(state.states_retired))
  if details is not None:
    details["per_request"] = {k: _col(res, k) for k in _OUT_COLS}
    details["final_state"] = state
  return triples, counters
