"""The sequential replay of checkpoint policies: many capacities and settings in one walk.

Issue 15, items 3 and 5 (`checkpoint_policies.py`). `sweep_checkpoint` replays one trace for
many capacities at once (the trie walk, hashes and candidate points are capacity-independent and
done once per request, and so is the write of the units the request creates, which every cache
inserts: `CacheBank.insert_fresh`; each capacity keeps its own caches, rows of one `CacheBank`);
every point equals its own `run_checkpoint`. Two backends, the same decisions bit for bit:

- "compiled" (`_sweep_compiled`, the default): the capacity-independent walk of the whole trace
  first (`_walk_all`), then the caches' steps compiled with numba (`compiled_replay.py`), the
  caches dealt to the CPUs' threads between re-tunes;
- "python" (`_sweep_python`): `UnitCache`, the reference (and what the concurrent replay runs).

A new rule or weighting goes into `UnitCache` (and the checkpoint policies' modules) first and
runs with `backend="python"`; `tests/hybrid_cache/sim/compiled_replay_test.py` fails until
`compiled_replay` makes the same decisions.
"""

from __future__ import annotations

import functools
import os
import time

import numpy as np

from hybrid_cache.sim import compiled_replay
from hybrid_cache.sim import eviction_weightings
from hybrid_cache.sim.checkpoint_costs import flops_table
from hybrid_cache.sim.checkpoint_replay import _LiveCounts
from hybrid_cache.sim.checkpoint_replay import _Point
from hybrid_cache.sim.checkpoint_replay import _Replay
from hybrid_cache.sim.checkpoint_replay import _summary
from hybrid_cache.sim.compiled_kernels import CAND_DEPTH
from hybrid_cache.sim.compiled_kernels import CAND_KIND
from hybrid_cache.sim.compiled_kernels import REQ_CAP
from hybrid_cache.sim.compiled_kernels import REQ_COLS
from hybrid_cache.sim.compiled_kernels import REQ_DEEPEST
from hybrid_cache.sim.compiled_kernels import REQ_LEN
from hybrid_cache.sim.compiled_kernels import REQ_NCANDS
from hybrid_cache.sim.compiled_kernels import REQ_NCOMP
from hybrid_cache.sim.compiled_kernels import REQ_OLD
from hybrid_cache.sim.compiled_kernels import REQ_RETIRE
from hybrid_cache.sim.compiled_kernels import REQ_START
from hybrid_cache.sim.cost_model import CostModel
from hybrid_cache.sim.eviction_weightings import DEFAULT_WEIGHTING
from hybrid_cache.sim.eviction_weightings import RETUNE_HALF_LIFE
from hybrid_cache.sim.eviction_weightings import _retune
from hybrid_cache.sim.trace import Trace


def _sweep_python(rep: _Replay, trace: Trace, model: CostModel, progress):
  """The sequential replay on `UnitCache`s (the reference backend): every point's result."""
  trie, stats, bank, points = rep.trie, rep.stats, rep.bank, rep.points
  weightings = rep.weightings
  decay = 0.5 ** (1.0 / RETUNE_HALF_LIFE)
  u = rep.unit
  fl = flops_table(model, u).values  # extended by each serve to the request's depth
  t0 = time.perf_counter()
  for r, req in enumerate(trace.requests):
    path, seen, cap, place, deepest, retire = rep.prepare(req, r)
    n_in = req.num_input_tokens
    n_comp = n_in + max(req.num_output_tokens - 1, 0)
    pa, old = trie.path_array(path), trie.last_old
    found = bank.lookup(pa, cap, old)
    fresh = None
    if deepest > old:  # every cache adds r's new units up to `deepest`: one write for all
      bank.insert_fresh(pa, old, deepest)
      fresh = (old, deepest)
    for pt in points:
      live = pt.live
      before = live.admitted_ckpts
      h = live.serve(r, path, cap, n_comp, place, found[live.row], fresh, retire)
      pt.triples.append((int(h > 0), n_in, h))
      pt.copy_bytes.append((live.admitted_ckpts - before + (1 if h else 0)) * pt.sizes.ckpt_bytes)
      score = pt.score
      for i, sh in enumerate(pt.shadows):
        hs = sh.serve(r, path, cap, n_comp, place, found[sh.row], fresh, retire)
        score[i] = score[i] * decay + (fl[hs // u] if hs else 0)  # = sh.flops(hs // u)
      if pt.tuned:
        lab = weightings[pt.current].name
        pt.alphas_used[lab] = pt.alphas_used.get(lab, 0) + 1
        if (r + 1) % eviction_weightings.RETUNE_EVERY == 0:
          pt.current = _retune(pt.current, score, weightings, retire, live.retune)
    if 0 < seen < cap:
      stats.observe(seen, trie.out[path[seen - 1]])
    if progress is not None:
      progress(r + 1)
  wall = time.perf_counter() - t0
  return [_summary(pt, model, rep, wall) for pt in points]


def _cpus() -> int:
  """The CPUs this process may run on (the compiled backend's threads)."""
  if hasattr(os, "sched_getaffinity"):
    return max(1, len(os.sched_getaffinity(0)))
  return max(1, os.cpu_count() or 1)


def _walk_all(rep: _Replay, trace: Trace):
  """The capacity-independent half of a sequential replay, for the whole trace at once (it
  reads no cache): each request's trie walk, candidate points and deepest placement, the
  reach prior of each kind as of it, the divergence statistics after it (as the sweep's
  loop). Returns `compiled_replay.CompiledBank`'s (trie, reach, req, cands) arrays, or None
  when a FLOPs value does not fit int64."""
  trie, stats, u = rep.trie, rep.stats, rep.unit
  n_req = len(trace.requests)
  req = np.zeros((n_req, REQ_COLS), np.int64)
  cands = np.zeros((n_req, 2, compiled_replay.MAX_CANDS), np.int64)
  reach = np.full((n_req, compiled_replay.NUM_KINDS), 0.5)  # (0 + 1) / (0 + 2)
  longest = 0
  for r, q in enumerate(trace.requests):
    start = trie.flat_len
    path, seen, cap, cs, deepest, retire = rep.walk(q, r)
    n_in = q.num_input_tokens
    n_comp = n_in + max(q.num_output_tokens - 1, 0)
    row = req[r]
    row[REQ_START], row[REQ_LEN], row[REQ_OLD] = start, len(path), trie.last_old
    row[REQ_CAP], row[REQ_NCOMP], row[REQ_DEEPEST] = cap, n_comp, deepest
    row[REQ_NCANDS], row[REQ_RETIRE] = len(cs), retire
    for i, (depth, kind) in enumerate(cs):
      cands[r, CAND_DEPTH, i], cands[r, CAND_KIND, i] = depth, kind
    for kind, placed in trie.placed.items():
      reach[r, kind] = (trie.reached.get(kind, 0.0) + 1.0) / (placed + 2.0)
    longest = max(longest, len(path))
    if 0 < seen < cap:
      stats.observe(seen, trie.out[path[seen - 1]])
  fl = flops_table(rep.model, u).extend(max(longest, 1))  # depth 1: the flat-weight test
  if fl[-1] >= 2**63:
    return None
  tables = (
    np.asarray(trie.depth, np.int64),
    np.asarray(trie.home, np.int64),
    trie.flat[: trie.flat_len].copy(),
    np.asarray(fl, np.int64),
    trie.reused_from[: len(trie)].copy(),
  )
  return tables, reach, req, cands


def _sweep_compiled(rep: _Replay, trace: Trace, model: CostModel, progress):
  """`sweep_checkpoint` on `compiled_replay.CompiledBank` (None: FLOPs overflow int64, use
  the Python backend). The same caches as `_Replay` builds, the same re-tuning."""
  t0 = time.perf_counter()
  walked = _walk_all(rep, trace)
  if walked is None:
    return None
  tables, reach, req, cands = walked
  u, weightings = rep.unit, rep.weightings
  _, sizes0 = rep.specs[0]
  bank = compiled_replay.CompiledBank(
    len(rep.trie),
    (u, sizes0.block_size, sizes0.kv_page_bytes, sizes0.ckpt_bytes),
    tables,
    reach,
    req,
    cands,
    compiled_replay.RULE_CODES[rep.rule],
    rep.k,
  )
  rows = []  # per point: (setting, sizes, live row, shadow rows)
  for st, sizes in rep.specs:
    if st is None:
      live = bank.add(sizes.capacity, weightings[DEFAULT_WEIGHTING], retuned=True)
      shadows = [bank.add(sizes.capacity, w) for w in weightings]
    else:
      live = bank.add(sizes.capacity, st)
      shadows = []
    rows.append((st, sizes, live, shadows))
  bank.start()
  decay = 0.5 ** (1.0 / RETUNE_HALF_LIFE)
  n_req = len(trace.requests)
  current = [DEFAULT_WEIGHTING] * len(rows)
  scores = [[0.0] * len(sh) for *_, sh in rows]
  used: list[dict[str, int]] = [{} for _ in rows]
  every = np.arange(bank.ints.shape[0])
  threads = _cpus()
  for r0 in range(0, n_req, eviction_weightings.RETUNE_EVERY):
    r1 = min(r0 + eviction_weightings.RETUNE_EVERY, n_req)
    bank.serve(every, r0, r1, threads)
    for i, (st, _, live, shadows) in enumerate(rows):
      if st is not None:
        continue
      scores[i] = bank.score(shadows, r0, r1, u, decay, scores[i])
      lab = weightings[current[i]].name
      used[i][lab] = used[i].get(lab, 0) + (r1 - r0)
      if r1 % eviction_weightings.RETUNE_EVERY == 0:
        switch = functools.partial(bank.retune, live, r1)
        current[i] = _retune(current[i], scores[i], weightings, bank.retires(r1 - 1), switch)
    if progress is not None:
      progress(r1)
  bank.close()
  wall = time.perf_counter() - t0
  out = []
  n_in = [q.num_input_tokens for q in trace.requests]
  for i, (st, sizes, live, _) in enumerate(rows):
    hits = (bank.hits_out[live] * u).tolist()
    restores = bank.added_out[live] + (bank.hits_out[live] > 0)
    live_alpha = (weightings[current[i]] if st is None else st).alpha
    pt = _Point(
      sizes,
      _LiveCounts(
        bank.admitted(live), bank.evicted(live), bank.retired(live), bank.used(live), live_alpha
      ),
      [],
      [],
      current[i],
      dict(used[i]),
      [(int(h > 0), n, h) for h, n in zip(hits, n_in)],
      (restores * sizes.ckpt_bytes).tolist(),
      tuned=st is None,
    )
    out.append(_summary(pt, model, rep, wall))
  return out
