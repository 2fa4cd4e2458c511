"""The numba kernels of the compiled replay: one checkpoint cache's step over arrays.

Part of `compiled_replay.py` (issue 15): `CompiledBank` holds the arrays, these kernels replay
requests on them. Same decisions as `UnitCache.serve` bit for bit: the lookup (`cache_bank.lookup`),
the write of the units a request creates (`CacheBank.insert_fresh`), the hit's pin and re-weighting,
the chain-aware GreedyDual eviction (`chain_eviction.py`: `_evict_one`, `_drop`, `fit`), the
insertion (`_insert`) and `reweigh`, with the same float operations in the same order (a pop takes
the least (priority, seq), a total order, so any binary heap pops what `heapq` pops; numba's typed
dicts iterate in insertion order as Python's do, which `reweigh`'s seq order needs).

Every jitted function and the row layouts they read (also `REQ_*`, the requests' columns, which
`checkpoint_sweep` writes) stay in this one file: numba's cache (`cache=True`) is invalidated by
changes to the file that defines a function only, so a kernel calling a kernel of another file would
keep a stale compiled copy of it (the flag bits, `NO_HISTORY` and `_COMPACT_MIN` come from the
Python cache: after changing one, delete the `__pycache__` entries of this file).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from hybrid_cache.sim.cache_bank import _BRANCH
from hybrid_cache.sim.cache_bank import _CKPT
from hybrid_cache.sim.chain_eviction import _COMPACT_MIN
from hybrid_cache.sim.chain_eviction import NO_HISTORY

# rows of `CompiledBank.ints` (per-cache int64 scalars; _NOW: lookups so far, `UnitCache._now`;
# _RETIRED: superseded checkpoints dropped at insertion, `UnitCache.retired_ckpts`)
_PAGES, _NCKPT, _SEQ, _EFF_N, _ROOTC, _COMPACT_AT, _ABSENT, _EVICTED, _ADMITTED, _HSIZE = range(10)
_NOW, _RETIRED, _NINTS = 10, 11, 12
# rows of `CompiledBank.flts`: GreedyDual's clock, the FLOPs ratio's running sum, the
# penultimate access new checkpoints of the current request get (`UnitCache._inherit`)
_CLOCK, _EFF_SUM, _INHERIT = range(3)
_NFLTS = 3
# rows of `CompiledBank.cfg`: capacity bytes, prior code, frequency, plain LRU (alpha None), flat
# weight (`UnitCache._flat_weight`), LRU-2 (`.penultimate`), access history kept (`._history`)
_CAP, _PRIOR, _FREQ, _LRU, _FLAT, _PEN, _HIST = range(7)
_NCFG = 7
# columns of the per-request rows `CompiledBank.req` (`checkpoint_sweep._walk_all` writes them)
REQ_START, REQ_LEN, REQ_OLD, REQ_CAP, REQ_NCOMP, REQ_DEEPEST, REQ_NCANDS, REQ_RETIRE = range(8)
REQ_COLS = 8
CAND_DEPTH, CAND_KIND = range(2)  # rows of `CompiledBank.cands[r]`
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
  flat[s0 : s0 + count] of a root path (`cache_bank._marks_above`; `flat` is the walked
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
  # `cache_bank.lookup`, one row
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
      q = req[r]
      s0, n, old, cap = q[REQ_START], q[REQ_LEN], q[REQ_OLD], q[REQ_CAP]
      n_comp, rdeep, nc, retire = q[REQ_NCOMP], q[REQ_DEEPEST], q[REQ_NCANDS], q[REQ_RETIRE]
      hit_out[k, r], add_out[k, r] = _serve(
        C, HP, HS, HN, k, T, S, reach[r], flat[s0 : s0 + n], old, cap, n_comp, rdeep,
        rule, kspars, cands[r, CAND_DEPTH], cands[r, CAND_KIND], nc, retire != 0, r,
      )  # fmt: skip


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
