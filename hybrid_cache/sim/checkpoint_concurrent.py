"""The concurrent replay of a checkpoint policy: arrivals, a token budget per step, many running.

Issue 15 (`checkpoint_policies.py`, replay "concurrent"). `concurrent.replay_concurrent` drives
one capacity's caches: arrivals at the trace's timestamps, a token budget per step, several
running requests; the lookup at admission (every cache of the bank in one gather, as the sweep),
the insertion when the request finishes; the live cache refuses an admission it cannot hold
(`UnitCache.can_admit`), and the shadows follow the live cache's schedule. Concurrent TTFTs
include queueing and the copies (restores in the admission step, checkpoint writes after the
finishing step, at `checkpoint_replay.STATE_COPY_GB_PER_S`). The concurrent schedule depends on
the capacity (refused admissions), so it replays one capacity (`run_checkpoint`);
`sweep_checkpoint` is sequential.
"""

from __future__ import annotations

import time

from hybrid_cache.sim import concurrent
from hybrid_cache.sim import eviction_weightings
from hybrid_cache.sim.checkpoint_replay import STATE_COPY_GB_PER_S
from hybrid_cache.sim.checkpoint_replay import _Replay
from hybrid_cache.sim.checkpoint_replay import _summary
from hybrid_cache.sim.eviction_weightings import RETUNE_HALF_LIFE
from hybrid_cache.sim.eviction_weightings import _retune
from hybrid_cache.sim.eviction_weightings import _setting_of


def _run_concurrent(
  trace,
  model,
  capacity_bytes,
  policy,
  unit,
  block_size,
  alpha,
  prior,
  frequency,
  length_classes,
  step_tokens,
  max_running,
  arrival_scale,
  penultimate=False,
):
  """`run_checkpoint` with replay "concurrent" (module docstring): one capacity's caches driven
  by `concurrent.replay_concurrent`, the lookup at admission (every cache of the bank in one
  gather, as the sweep), the insertion at finish."""
  setting = _setting_of(policy, alpha, prior, frequency, penultimate)
  rep = _Replay(trace, model, [capacity_bytes], policy, unit, block_size, [setting], length_classes)
  trie, stats, weightings, bank = rep.trie, rep.stats, rep.weightings, rep.bank
  pt = rep.points[0]
  tuned = pt.tuned
  live, shadows, score, sizes, u = pt.live, pt.shadows, pt.score, pt.sizes, rep.unit
  decay = 0.5 ** (1.0 / RETUNE_HALF_LIFE)
  n_req = len(trace.requests)
  hits = [0] * n_req
  copy_bytes = [0] * n_req
  placers = {}
  admitted = 0

  def admit(r: int):
    nonlocal admitted
    req = trace.requests[r]
    n_comp = req.num_input_tokens + max(req.num_output_tokens - 1, 0)
    if not live.can_admit(n_comp):
      return None
    path, seen, cap, place, _, retire = rep.prepare(req, r)
    placers[r] = place, retire
    found = bank.lookup(trie.path_array(path), cap, trie.last_old)
    hits[r] = live.admit(r, path, cap, n_comp, found[live.row])
    for i, sh in enumerate(shadows):
      hs = sh.admit(r, path, cap, n_comp, found[sh.row])
      score[i] = score[i] * decay + (sh.flops(hs // u) if hs else 0)
    admitted += 1
    if tuned:
      lab = weightings[pt.current].name
      pt.alphas_used[lab] = pt.alphas_used.get(lab, 0) + 1
      if admitted % eviction_weightings.RETUNE_EVERY == 0:
        pt.current = _retune(pt.current, score, weightings, retire, live.retune)
    if 0 < seen < cap:
      stats.observe(seen, trie.out[path[seen - 1]])
    restore = sizes.ckpt_bytes if hits[r] else 0
    copy_bytes[r] = restore
    return hits[r], restore

  def finish(r: int) -> int:
    place, retire = placers.pop(r)
    written = live.finish(r, place, retire=retire) * sizes.ckpt_bytes
    for sh in shadows:
      sh.finish(r, place, retire=retire)
    copy_bytes[r] += written
    return written

  t0 = time.perf_counter()
  conc = concurrent.replay_concurrent(
    trace,
    model,
    admit,
    finish,
    lambda b: b / (STATE_COPY_GB_PER_S * 1e6),
    step_tokens=step_tokens,
    max_running=max_running,
    arrival_scale=arrival_scale,
  )
  pt.triples = [(int(h > 0), q.num_input_tokens, h) for q, h in zip(trace.requests, hits)]
  pt.copy_bytes = copy_bytes
  fields = conc.summary() | {
    "step_tokens": step_tokens,
    "max_running": max_running,
    "arrival_scale": arrival_scale,
  }
  return _summary(pt, model, rep, time.perf_counter() - t0, fields)
