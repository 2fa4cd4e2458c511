"""The sequential replay of `checkpoint_cache.UnitCache`, compiled with numba.

Issue 15 asks a 16-point capacity sweep of the full Mooncake conversation trace in <= 3x the
wall time of one point. In Python every `UnitCache.serve` call is ~30 us of CPython bytecode
spread thin (evictions, insertion, the GreedyDual heap; BENCHMARKS.md, "Capacity sweep under
`adaptive`"), and a sweep makes 96 caches x 12,031 requests of them, so the sweep cost 6.6-7.2x
one point in one process. Here the same per-cache step runs as compiled loops over arrays
(BENCHMARKS.md, "Compiled sequential replay", for what it bought).

Same decisions as `UnitCache.serve` bit for bit: the lookup (`checkpoint_cache.lookup`), the
write of the units a request creates (`CacheBank.insert_fresh`), the hit's pin and re-weighting,
the chain-aware GreedyDual eviction (`_evict_one`, `_drop`, `fit`), the insertion (`_insert`)
and `reweigh`, with the same float operations in the same order (a pop takes the least
(priority, seq), a total order, so any binary heap pops what `heapq` pops; numba's typed dicts
iterate in insertion order as Python's do, which `reweigh`'s seq order needs).
`tests/hybrid_cache/sim/compiled_replay_test.py` compares triples and summaries with the
plain-Python path (`sweep_checkpoint(..., backend="python")`) over every rule and weighting.
`UnitCache` stays the readable reference and serves the concurrent replay.

Layout: `CompiledBank` holds K caches over one trie. Per node, rows of [K, nodes] arrays
(`present`, `flag`, `nchild`, as `CacheBank`); per cache, int64 and float64 scalars (rows of
`ints`, `flts`), the eviction weighting (`cfg`, `alpha`), the per-kind placed / hit counts, the
GreedyDual heap as three arrays (priority, seq, node) in typed lists (they grow), and the
per-checkpoint `entry` / `hits` / `kind` / `stamp` as typed dicts (held checkpoints only, as in
`UnitCache`). The requests are arrays too: the capacity-independent walk (`SeenTrie`, the
candidate points) is done for the whole trace first (`checkpoint_policies._walk_all`), then
`serve_chunk` replays requests r0..r1 for each cache in turn (caches are independent between
re-tunes, and one cache's rows stay in the CPU cache).
"""

from __future__ import annotations

import concurrent.futures

import numba as nb
import numpy as np
from numba import types
from numba.typed import Dict
from numba.typed import List

from hybrid_cache.sim.checkpoint_cache import _BRANCH
from hybrid_cache.sim.checkpoint_cache import _CKPT
from hybrid_cache.sim.checkpoint_cache import _COMPACT_MIN
from hybrid_cache.sim.checkpoint_cache import NO_HISTORY

# rows of `CompiledBank.ints` (per-cache int64 scalars)
_PAGES, _NCKPT, _SEQ, _EFF_N, _ROOTC, _COMPACT_AT, _ABSENT, _EVICTED, _ADMITTED, _HSIZE = range(10)
_NOW = 10  # lookups so far (`UnitCache._now`)
_RETIRED = 11  # superseded checkpoints dropped at insertion (`UnitCache.retired_ckpts`)
_NINTS = 12
# rows of `CompiledBank.flts`: GreedyDual's clock, the FLOPs ratio's running sum, the
# penultimate access new checkpoints of the current request get (`UnitCache._inherit`)
_CLOCK, _EFF_SUM, _INHERIT = range(3)
_NFLTS = 3
# rows of `CompiledBank.cfg`: capacity bytes, prior code, frequency, plain LRU (alpha None),
# flat weight (`UnitCache._flat_weight`), LRU-2 (`UnitCache.penultimate`), access history kept
# (`UnitCache._history`)
_CAP, _PRIOR, _FREQ, _LRU, _FLAT, _PEN, _HIST = range(7)
_NCFG = 7
PRIOR_CODES = {"hits": 0, "reach": 1, "none": 2}
RULE_CODES = {"ckpt_dense": 0, "ckpt_sparse": 1, "ckpt_branch": 2, "adaptive": 3}
NUM_KINDS = 32  # kind * 8 + length class, kind < 4 (`checkpoint_policies.candidates`)
MAX_CANDS = 2  # branch point + leaf / continuation
_JIT = {"cache": True, "nogil": True}


@nb.njit(**_JIT)
def _less(p1, s1, p2, s2):
  return p1 < p2 or (p1 == p2 and s1 < s2)


@nb.njit(**_JIT)
def _sift_down(hp, hs, hn, size, pos):
  p, s, n = hp[pos], hs[pos], hn[pos]
  while True:
    c = 2 * pos + 1
    if c >= size:
      break
    if c + 1 < size and _less(hp[c + 1], hs[c + 1], hp[c], hs[c]):
      c += 1
    if _less(hp[c], hs[c], p, s):
      hp[pos], hs[pos], hn[pos] = hp[c], hs[c], hn[c]
      pos = c
    else:
      break
  hp[pos], hs[pos], hn[pos] = p, s, n


@nb.njit(**_JIT)
def _heap_push(HP, HS, HN, k, ints, prio, seq, node):
  """Pushes (prio, seq, node) on cache k's heap (arrays double when full)."""
  size = ints[_HSIZE]
  hp, hs, hn = HP[k], HS[k], HN[k]
  if size == hp.shape[0]:
    hp2 = np.empty(2 * size, np.float64)
    hs2 = np.empty(2 * size, np.int64)
    hn2 = np.empty(2 * size, np.int64)
    hp2[:size], hs2[:size], hn2[:size] = hp, hs, hn
    HP[k], HS[k], HN[k] = hp2, hs2, hn2
    hp, hs, hn = hp2, hs2, hn2
  pos = size
  while pos > 0:
    par = (pos - 1) >> 1
    if _less(hp[par], hs[par], prio, seq):
      break
    hp[pos], hs[pos], hn[pos] = hp[par], hs[par], hn[par]
    pos = par
  hp[pos], hs[pos], hn[pos] = prio, seq, node
  ints[_HSIZE] = size + 1


@nb.njit(**_JIT)
def _compact(HP, HS, HN, k, ints, entry):
  """`UnitCache._compact`: keeps the valid entries, re-heapifies."""
  hp, hs, hn = HP[k], HS[k], HN[k]
  j = 0
  for i in range(ints[_HSIZE]):
    if entry.get(hn[i], -1) == hs[i]:
      hp[j], hs[j], hn[j] = hp[i], hs[i], hn[i]
      j += 1
  for i in range(j // 2 - 1, -1, -1):
    _sift_down(hp, hs, hn, j, i)
  ints[_HSIZE] = j
  ints[_COMPACT_AT] = 2 * j + _COMPACT_MIN


@nb.njit(**_JIT)
def _marks_above(flag, flat, s0, count):
  """(depth of the deepest checkpoint, of the deepest checkpoint or branch) among the nodes
  flat[s0 : s0 + count] of a root path (`checkpoint_cache._marks_above`; `flat` is the walked
  paths end to end or one path); 0 = none."""
  ck, top = 0, 0
  for i in range(count - 1, -1, -1):
    f = flag[flat[s0 + i]]
    if f:
      if top == 0:
        top = i + 1
      if f & _CKPT:
        ck = i + 1
        break
  return ck, top


@nb.njit(**_JIT)
def _push(C, HP, HS, HN, k, T, S, reach, n, touch, prev, a):
  """`UnitCache._push` (with `_flops_term`)."""
  present, flag, nchild, ints, flts, cfg, alpha, kp, kh = C[:9]
  entry, hits, kind, stamp, lastref, penult = C[9:]
  depth, home, flat, fl, reused_from = T
  unit, bs, page, state = S
  seq = ints[_SEQ] + 1
  ints[_SEQ] = seq
  entry[n] = seq
  if touch:
    st = flts[_CLOCK]
    stamp[n] = st
  else:
    st = stamp[n]
  if cfg[_PEN]:
    _heap_push(HP, HS, HN, k, ints, penult[n], seq, n)
    if ints[_HSIZE] > ints[_COMPACT_AT]:
      _compact(HP, HS, HN, k, ints, entry)
    return
  if cfg[_LRU]:
    w = 1.0
  else:
    if cfg[_FLAT]:
      w = 1.0
    else:
      dn = depth[n]
      leaf = nchild[n] == 0
      if prev < 0 or (leaf and a < 0):
        prev, a = _marks_above(flag, flat, home[n], dn - 1)
      nbytes = state
      if leaf:
        end = dn * unit
        pages = end // bs - (a * unit) // bs + (1 if end % bs else 0)
        nbytes += pages * page
      eff = float(fl[dn] - fl[prev]) / max(nbytes, 1)
      flts[_EFF_SUM] += eff
      ints[_EFF_N] += 1
      ref = flts[_EFF_SUM] / ints[_EFF_N]
      rel = eff / ref if ref > 0 else 1.0
      w = rel ** alpha[0] if rel > 0 else 0.0
    if cfg[_FREQ]:
      w *= 1 + hits[n]
    if cfg[_PRIOR] == 1:
      w *= reach[kind[n]]
    elif cfg[_PRIOR] == 0:
      kd = kind[n]
      w *= (kh[kd] + 1.0) / (kp[kd] + 2.0)
  _heap_push(HP, HS, HN, k, ints, st + w, seq, n)
  if ints[_HSIZE] > ints[_COMPACT_AT]:
    _compact(HP, HS, HN, k, ints, entry)


@nb.njit(**_JIT)
def _drop_state(C, n):
  """`UnitCache._drop_state`: checkpoint n's state and entries (not its KV)."""
  flag, ints, cfg = C[1], C[3], C[5]
  entry, hits, kind, stamp, lastref, penult = C[9:]
  flag[n] = flag[n] & _BRANCH
  ints[_NCKPT] -= 1
  del entry[n]
  del hits[n]
  del kind[n]
  del stamp[n]
  if cfg[_HIST]:
    del penult[n]  # its last access stays (a ghost, `UnitCache._drop`)


@nb.njit(**_JIT)
def _drop(C, HP, HS, HN, k, T, S, reach, n, pa, pin_d):
  """`UnitCache._drop`: evicts checkpoint n; a leaf also drops its KV chain up to the nearest
  ancestor that is a checkpoint, a branch or pinned (pa[:pin_d], the one running request)."""
  present, flag, nchild, ints, flts, cfg, alpha, kp, kh = C[:9]
  depth, home, flat, fl, reused_from = T
  unit, bs, page, state = S
  _drop_state(C, n)
  ints[_EVICTED] += 1
  if nchild[n]:
    return
  dn = depth[n]
  s0 = home[n]
  a = _marks_above(flag, flat, s0, dn - 1)[1]
  if pin_d > 0:
    kk = min(pin_d, dn - 1)
    if a < kk and flat[s0 + a] == pa[a]:
      lo, hi = a, kk
      if flat[s0 + kk - 1] == pa[kk - 1]:
        lo = kk - 1
      while hi - lo > 1:
        mid = (lo + hi) // 2
        if flat[s0 + mid] == pa[mid]:
          lo = mid
        else:
          hi = mid
      a = lo + 1
  for i in range(s0 + a, s0 + dn):
    present[flat[i]] = False
    nchild[flat[i]] = 0
  end = dn * unit
  ints[_PAGES] -= end // bs - (a * unit) // bs + (1 if end % bs else 0)
  if a < ints[_ABSENT] and flat[s0 + a] == pa[a]:
    ints[_ABSENT] = a
  if a == 0:
    ints[_ROOTC] -= 1
    return
  p = flat[s0 + a - 1]
  c = nchild[p] - 1
  nchild[p] = c
  if c == 1:
    flag[p] = flag[p] & _CKPT
  elif c == 0:
    ints[_PAGES] += 1 if (a * unit) % bs else 0
    if flag[p] & _CKPT:
      _push(C, HP, HS, HN, k, T, S, reach, p, False, -1, -1)


@nb.njit(**_JIT)
def _evict_one(C, HP, HS, HN, k, T, S, reach, pa, pin_d):
  """`UnitCache._evict_one`; False when no unpinned unit is left."""
  present, flag, nchild, ints, flts, cfg, alpha, kp, kh = C[:9]
  entry, hits, kind, stamp, lastref, penult = C[9:]
  depth = T[0]
  held = np.empty(0, np.int64)
  nheld = 0
  ok = False
  zero_state = S[3] == 0
  while ints[_HSIZE] > 0:
    hp, hs, hn = HP[k], HS[k], HN[k]
    prio, seq, n = hp[0], hs[0], hn[0]
    size = ints[_HSIZE] - 1
    ints[_HSIZE] = size
    if size > 0:
      hp[0], hs[0], hn[0] = hp[size], hs[size], hn[size]
      _sift_down(hp, hs, hn, size, 0)
    if entry.get(n, -1) != seq:
      continue
    if pin_d > 0:
      dn = depth[n]
      if dn <= pin_d and pa[dn - 1] == n:
        if nheld == held.shape[0]:
          grown = np.empty(max(8, 2 * nheld), np.int64)
          grown[:nheld] = held[:nheld]
          held = grown
        held[nheld] = n
        nheld += 1
        continue
    if zero_state and nchild[n]:
      continue
    if not cfg[_PEN]:  # GreedyDual's clock (LRU-2's priorities are access times)
      flts[_CLOCK] = max(flts[_CLOCK], prio)
    _drop(C, HP, HS, HN, k, T, S, reach, n, pa, pin_d)
    ok = True
    break
  for i in range(nheld):
    _push(C, HP, HS, HN, k, T, S, reach, held[i], False, -1, -1)
  return ok


@nb.njit(**_JIT)
def _fit(C, HP, HS, HN, k, T, S, reach, limit, pa, pin_d):
  """`UnitCache.fit`: evicts until the bytes used <= limit; False if the pins alone exceed it."""
  ints = C[3]
  page, state = S[2], S[3]
  while ints[_PAGES] * page + ints[_NCKPT] * state > limit:
    if not _evict_one(C, HP, HS, HN, k, T, S, reach, pa, pin_d):
      return False
  return True


@nb.njit(**_JIT)
def _push_marked(C, HP, HS, HN, k, T, S, reach, pa, q, touch):
  """A push from `_insert`: the previous checkpoint and the nearest mark above depth q, read
  along the request's path (what `UnitCache._insert` reads from one gather)."""
  prev, a = _marks_above(C[1], pa, 0, q - 1)
  _push(C, HP, HS, HN, k, T, S, reach, pa[q - 1], touch, prev, a)


@nb.njit(**_JIT)
def _retire(C, HP, HS, HN, k, T, S, reach, pa, e, r):
  """`UnitCache._retire`: drops the checkpoints request r's new one at depth e supersedes."""
  flag, nchild, ints, cfg = C[1], C[2], C[3], C[5]
  penult = C[14]
  reused_from = T[4]
  ne = pa[e - 1]
  latest = 0.0
  gone = 0
  for i in range(e - 1):
    n = pa[i]
    if flag[n] & _CKPT and nchild[n] == 1 and reused_from[n] > r:
      if cfg[_HIST] and (gone == 0 or penult[n] > latest):
        latest = penult[n]
      gone += 1
  if gone == 0:
    return
  if cfg[_HIST] and latest > penult[ne]:
    penult[ne] = latest
    if cfg[_PEN]:
      _push(C, HP, HS, HN, k, T, S, reach, ne, False, -1, -1)
  for i in range(e - 1):
    n = pa[i]
    if flag[n] & _CKPT and nchild[n] == 1 and reused_from[n] > r:
      _drop_state(C, n)
  ints[_RETIRED] += gone


@nb.njit(**_JIT)
def _serve(
  C, HP, HS, HN, k, T, S, reach, pa, old, cap, n_comp, rdeep, rule, kspars, cq, ckd, nc, retire, r
):  # fmt: skip
  """`UnitCache.serve` of one request (lookup, fresh write, hit, fit, insertion, retirement,
  fit); returns (hit depth in units, checkpoints added)."""
  present, flag, nchild, ints, flts, cfg, alpha, kp, kh = C[:9]
  entry, hits, kind, stamp, lastref, penult = C[9:]
  unit, bs, page, state = S
  recurrent = state > 0
  n_path = pa.shape[0]
  # `checkpoint_cache.lookup`, one row
  f = last = prev = top = first = 0
  if old > 0:
    first = old
    for i in range(old):
      if not present[pa[i]]:
        first = i
        break
    m = max(min(cap, old), 0)
    f = min(first, m)
    for i in range(f):
      if flag[pa[i]] & _CKPT:
        prev = last
        last = i + 1
    for i in range(last - 1):
      if flag[pa[i]] != 0:
        top = i + 1
  # `CacheBank.insert_fresh`, this row
  if rdeep > old:
    lo = pa[old]
    present[lo : lo + rdeep - old] = True
    nchild[lo : lo + rdeep - old - 1] = 1
  # `_take_hit`
  ints[_ABSENT] = first
  d = last if recurrent else f
  pin_d = d
  hist = cfg[_HIST]
  now = ints[_NOW]
  if hist:
    now += 1
    ints[_NOW] = now
    flts[_INHERIT] = now - NO_HISTORY
  if last:
    n = pa[last - 1]
    if hist:
      before = lastref[n]
      penult[n] = before
      flts[_INHERIT] = before
      lastref[n] = now
    hits[n] += 1
    kd = kind[n]
    kh[kd] += 1.0
    _push(C, HP, HS, HN, k, T, S, reach, n, True, prev, top)
  room = cfg[_CAP]
  npages = -(-n_comp // bs)
  work = (npages - (d * unit) // bs) * page + state
  if ints[_PAGES] * page + ints[_NCKPT] * state > room - work:
    if not _fit(C, HP, HS, HN, k, T, S, reach, room - work, pa, pin_d):
      pin_d = 0
      d = 0
      _fit(C, HP, HS, HN, k, T, S, reach, room - npages * page - state, pa, 0)
  # `_insert`: the places deeper than the hit, ascending
  if not recurrent or rule == 0:
    q0, step, qn = d + 1, 1, n_path
  elif rule == 1:
    q0, step, qn = (d // kspars + 1) * kspars, kspars, n_path
  else:
    q0, step, qn = 0, 0, 0
  deepest = 0
  if step:
    if qn >= q0:
      deepest = q0 + ((qn - q0) // step) * step
  else:
    for i in range(nc):
      if cq[i] > d:
        deepest = cq[i]
  refresh = 0
  if deepest:
    j = min(ints[_ABSENT], deepest)
    if j < deepest:
      if j == 0:
        ints[_ROOTC] += 1
      else:
        p = pa[j - 1]
        c = nchild[p]
        if c == 0:
          ints[_PAGES] -= 1 if (j * unit) % bs else 0
          if flag[p] & _CKPT:
            refresh = j
        elif c == 1:
          flag[p] = flag[p] | _BRANCH
        nchild[p] = c + 1
      hi = old if rdeep > old else deepest  # the fresh units are written above
      for i in range(j, hi):
        present[pa[i]] = True
      for i in range(j, min(hi, deepest - 1)):
        nchild[pa[i]] = 1
      end = deepest * unit
      ints[_PAGES] += end // bs - (j * unit) // bs + (1 if end % bs else 0)
  # new checkpoints: flags first, then the pushes (refresh, then the new ones, ascending)
  new = np.empty(0, np.int64)
  nnew = 0
  if deepest:
    if step:
      new = np.empty((deepest - q0) // step + 1, np.int64)
      for q in range(q0, deepest + 1, step):
        n = pa[q - 1]
        if flag[n] & _CKPT:
          continue
        flag[n] = flag[n] | _CKPT
        kind[n] = 0
        hits[n] = 0
        if hist:
          before = lastref.get(n, -1)
          penult[n] = flts[_INHERIT] if before < 0 else before
          lastref[n] = now
        kp[0] += 1.0
        new[nnew] = q
        nnew += 1
    else:
      new = np.empty(nc, np.int64)
      for i in range(nc):
        q = cq[i]
        if q <= d:
          continue
        n = pa[q - 1]
        if flag[n] & _CKPT:
          continue
        flag[n] = flag[n] | _CKPT
        kd = ckd[i]
        kind[n] = kd
        hits[n] = 0
        if hist:
          before = lastref.get(n, -1)
          penult[n] = flts[_INHERIT] if before < 0 else before
          lastref[n] = now
        kp[kd] += 1.0
        new[nnew] = q
        nnew += 1
  ints[_NCKPT] += nnew
  ints[_ADMITTED] += nnew
  if refresh:
    for i in range(nnew):
      if new[i] == refresh:
        refresh = 0
        break
  if cfg[_FLAT]:
    if refresh:
      _push(C, HP, HS, HN, k, T, S, reach, pa[refresh - 1], False, -1, -1)
    for i in range(nnew):
      _push(C, HP, HS, HN, k, T, S, reach, pa[new[i] - 1], True, -1, -1)
  else:
    if refresh:
      _push_marked(C, HP, HS, HN, k, T, S, reach, pa, refresh, False)
    for i in range(nnew):
      _push_marked(C, HP, HS, HN, k, T, S, reach, pa, new[i], True)
  if retire and nnew:
    _retire(C, HP, HS, HN, k, T, S, reach, pa, new[nnew - 1], r)
  if ints[_PAGES] * page + ints[_NCKPT] * state > room:
    _fit(C, HP, HS, HN, k, T, S, reach, room, pa, 0)
  return d, nnew


@nb.njit(**_JIT)
def _serve_chunk(
  ks, r0, r1, present, flag, nchild, ints, flts, cfg, alpha, kplaced, khit,
  ENTRY, HITS, KIND, STAMP, LAST, PEN, HP, HS, HN, T, S, reach, req, cands, rule, kspars,
  hit_out, add_out,
):  # fmt: skip
  depth, home, flat, fl, reused_from = T
  for k in ks:
    C = (
      present[k], flag[k], nchild[k], ints[k], flts[k], cfg[k], alpha[k : k + 1], kplaced[k],
      khit[k], ENTRY[k], HITS[k], KIND[k], STAMP[k], LAST[k], PEN[k],
    )  # fmt: skip
    for r in range(r0, r1):
      s0, n, old, cap, n_comp, rdeep, nc, retire = (
        req[r, 0], req[r, 1], req[r, 2], req[r, 3], req[r, 4], req[r, 5], req[r, 6], req[r, 7],
      )  # fmt: skip
      d, added = _serve(
        C, HP, HS, HN, k, T, S, reach[r], flat[s0 : s0 + n], old, cap, n_comp, rdeep,
        rule, kspars, cands[r, 0], cands[r, 1], nc, retire != 0, r,
      )  # fmt: skip
      hit_out[k, r] = d
      add_out[k, r] = added


@nb.njit(**_JIT)
def _reweigh(k, present, flag, nchild, ints, flts, cfg, alpha, kplaced, khit,
             ENTRY, HITS, KIND, STAMP, LAST, PEN, HP, HS, HN, T, S, reach):  # fmt: skip
  """`UnitCache.reweigh` of cache k (every held checkpoint re-pushed at its stamp, in the
  order the checkpoints were first inserted)."""
  C = (
    present[k], flag[k], nchild[k], ints[k], flts[k], cfg[k], alpha[k : k + 1], kplaced[k],
    khit[k], ENTRY[k], HITS[k], KIND[k], STAMP[k], LAST[k], PEN[k],
  )  # fmt: skip
  entry = ENTRY[k]
  nodes = np.empty(len(entry), np.int64)
  for i, n in enumerate(entry):
    nodes[i] = n
  for n in nodes:
    _push(C, HP, HS, HN, k, T, S, reach, n, False, -1, -1)


@nb.njit(**_JIT)
def _score(hit_out, rows, r0, r1, fl, unit, decay, score):
  """`adaptive`'s decayed FLOPs-saved score of each row over requests r0..r1 (in place)."""
  for i in range(rows.shape[0]):
    s = score[i]
    for r in range(r0, r1):
      d = hit_out[rows[i], r]
      s = s * decay + (float(fl[d]) if d else 0.0)
    score[i] = s


class CompiledBank:
  """K caches over one walked trace (see the module docstring).

  Args:
    trie_nodes: nodes of the trie after the whole walk.
    sizes: (unit, block_size, kv_page_bytes, ckpt_bytes), shared by every cache.
    trie: (depth, home, flat, flops, reused_from) int64 arrays: per node its depth and the
      offset of its creating path in flat (every walked path end to end); flops[d] = F(d U),
      d >= 0 up to the longest path and at least 1; per node `SeenTrie.reused_from`.
    reach: float64[R, NUM_KINDS], the reach prior of each kind as of each request.
    req: int64[R, 8] per request: (offset of its path in flat, path length, units that existed
      before it, hit cap in units, computed tokens, deepest placement, candidate count,
      retire: 1 = drop the checkpoints it supersedes, `UnitCache._retire`).
    cands: int64[R, 2, MAX_CANDS]: candidate depths and kinds (ascending depth).
    rule, kspars: the placement rule (`RULE_CODES`) and ckpt_sparse's K.
  """

  def __init__(self, trie_nodes, sizes, trie, reach, req, cands, rule, kspars):
    self.nodes = int(trie_nodes)
    self.S = tuple(int(x) for x in sizes)
    self.T = trie
    self.reach, self.req, self.cands = reach, req, cands
    self.rule, self.kspars = int(rule), int(kspars)
    self.configs: list[tuple[int, float | None, str, bool, bool, bool, bool]] = []
    self._pool: concurrent.futures.ThreadPoolExecutor | None = None

  def add(
    self,
    capacity: int,
    alpha: float | None,
    prior: str,
    frequency: bool,
    penultimate: bool,
    retuned: bool = False,
  ) -> int:
    """Adds a cache (its weighting and `retuned` as `UnitCache`'s arguments); returns its row."""
    hist = bool(penultimate or retuned)  # `UnitCache._history`
    fl = self.T[3]  # `UnitCache._flat_weight` (the table holds depth 1)
    flat = alpha == 0 and not retuned and bool(fl[1] > fl[0])
    cfg = (int(capacity), alpha, prior, bool(frequency), bool(penultimate), bool(flat), hist)
    self.configs.append(cfg)
    return len(self.configs) - 1

  def start(self) -> None:
    """Allocates the state of the caches added so far (call once, before `serve`)."""
    k, nodes = len(self.configs), self.nodes
    self.present = np.zeros((k, nodes), np.bool_)
    self.flag = np.zeros((k, nodes), np.uint8)
    self.nchild = np.zeros((k, nodes), np.int32)
    self.ints = np.zeros((k, _NINTS), np.int64)
    self.ints[:, _COMPACT_AT] = _COMPACT_MIN
    self.flts = np.zeros((k, _NFLTS), np.float64)
    self.cfg = np.zeros((k, _NCFG), np.int64)
    self.alpha = np.zeros(k, np.float64)
    for i, (cap, alpha, prior, freq, pen, flat, hist) in enumerate(self.configs):
      self.set_weighting(i, alpha, prior, freq, pen)
      self.cfg[i, _CAP], self.cfg[i, _FLAT], self.cfg[i, _HIST] = cap, int(flat), int(hist)
    self.kplaced = np.zeros((k, NUM_KINDS), np.float64)
    self.khit = np.zeros((k, NUM_KINDS), np.float64)
    i64, f64 = types.int64, types.float64
    self.ENTRY, self.HITS, self.KIND, self.STAMP = List(), List(), List(), List()
    self.LAST, self.PEN = List(), List()
    self.HP, self.HS, self.HN = List(), List(), List()
    for _ in range(k):
      self.ENTRY.append(Dict.empty(i64, i64))
      self.HITS.append(Dict.empty(i64, i64))
      self.KIND.append(Dict.empty(i64, i64))
      self.STAMP.append(Dict.empty(i64, f64))
      self.LAST.append(Dict.empty(i64, i64))
      self.PEN.append(Dict.empty(i64, f64))
      self.HP.append(np.empty(1024, np.float64))
      self.HS.append(np.empty(1024, np.int64))
      self.HN.append(np.empty(1024, np.int64))
    r = self.req.shape[0]
    self.hits_out = np.zeros((k, r), np.int64)
    self.added_out = np.zeros((k, r), np.int64)

  def set_weighting(
    self, row: int, alpha: float | None, prior: str, frequency: bool, penultimate: bool
  ) -> None:
    """`UnitCache`'s alpha / prior / frequency / penultimate of one cache (None alpha: plain
    LRU)."""
    self.cfg[row, _LRU] = int(alpha is None)
    self.alpha[row] = 0.0 if alpha is None else float(alpha)
    self.cfg[row, _PRIOR] = PRIOR_CODES[prior]
    self.cfg[row, _FREQ] = int(frequency)
    self.cfg[row, _PEN] = int(penultimate)

  def _state(self):
    return (
      self.present, self.flag, self.nchild, self.ints, self.flts, self.cfg, self.alpha,
      self.kplaced, self.khit, self.ENTRY, self.HITS, self.KIND, self.STAMP, self.LAST,
      self.PEN, self.HP, self.HS, self.HN,
    )  # fmt: skip

  def serve(self, rows: np.ndarray, r0: int, r1: int, threads: int = 1) -> None:
    """Replays requests r0..r1 - 1 on each cache of `rows` (hits in `hits_out[row, r]`, in
    units; checkpoints added in `added_out[row, r]`).

    `threads` > 1 deals the rows round-robin to that many threads: the caches share nothing
    they write (each its own rows, dicts and heap arrays) and the compiled loop releases the
    GIL, so they run in parallel with the same results."""
    rows = np.asarray(rows, np.int64)
    parts = [rows[i::threads] for i in range(min(threads, len(rows)))]
    if len(parts) <= 1:
      self._serve_rows(rows, r0, r1)
      return
    if self._pool is None or self._pool._max_workers < len(parts):
      self._pool = concurrent.futures.ThreadPoolExecutor(len(parts))
    for f in [self._pool.submit(self._serve_rows, p, r0, r1) for p in parts]:
      f.result()

  def _serve_rows(self, rows: np.ndarray, r0: int, r1: int) -> None:
    _serve_chunk(
      rows, r0, r1, *self._state(), self.T, self.S, self.reach, self.req, self.cands,
      self.rule, self.kspars, self.hits_out, self.added_out,
    )  # fmt: skip

  def close(self) -> None:
    """Stops the worker threads of `serve` (if any)."""
    if self._pool is not None:
      self._pool.shutdown()
      self._pool = None

  def reweigh(self, row: int, r: int) -> None:
    """`UnitCache.reweigh` of one cache after request r - 1 (the reach prior as of it)."""
    _reweigh(row, *self._state(), self.T, self.S, self.reach[max(r - 1, 0)])

  def score(self, rows, r0: int, r1: int, unit: int, decay: float, score: list[float]):
    """`adaptive`'s decayed score of `rows` over requests r0..r1 - 1; returns the new list."""
    out = np.asarray(score, np.float64)
    _score(self.hits_out, np.asarray(rows, np.int64), r0, r1, self.T[3], unit, decay, out)
    return out.tolist()

  def used(self, row: int) -> int:
    return int(self.ints[row, _PAGES] * self.S[2] + self.ints[row, _NCKPT] * self.S[3])

  def admitted(self, row: int) -> int:
    return int(self.ints[row, _ADMITTED])

  def evicted(self, row: int) -> int:
    return int(self.ints[row, _EVICTED])

  def retired(self, row: int) -> int:
    return int(self.ints[row, _RETIRED])


__all__ = ["MAX_CANDS", "NUM_KINDS", "PRIOR_CODES", "RULE_CODES", "CompiledBank"]
