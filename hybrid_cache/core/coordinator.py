"""Hybrid coordinator (vLLM §3): the longest hit every group agrees on, for any number of groups.

Fixed point (§3.2): full attention is looked up once (its valid resume points are downward
closed); SWA and recurrent groups are re-checked at each smaller candidate until nobody shrinks.
Hits are multiples of the scheduler block size (LCM of group block sizes) and at most
num_tokens - 1. Equal-spec groups are merged (a hit needs the key in every member). With exactly
two spec groups, full attention first, one pass suffices ("simple hybrid"). EAGLE groups drop one
unit and re-verify (`verified` set) whenever the candidate shrinks; recurrent groups get no margin.

Worked example (§3.3, bs 4 for brevity as in scenario 04): FA 28, SWA 28, Mamba 24 -> pass 2: SWA
at 24 ok, Mamba 24 -> hit 24, shared_prefix_boundary 28.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_cache.core import block_index
from hybrid_cache.core.groups import full_attention
from hybrid_cache.core.groups import recurrent
from hybrid_cache.core.groups import sliding_window
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import Layout


def group_hashes(lay: Layout, hashes: jax.Array, num_tokens: jax.Array, g: int):
  """(u32[MB, 2], bool[MB]): group g's block keys (fine hash at each block end) and validity."""
  k = lay.groups[g].block_size // lay.hash_block_size
  pos = jnp.arange(lay.max_blocks)
  fine = (pos + 1) * k - 1
  valid = (pos + 1) * lay.groups[g].block_size <= num_tokens
  return hashes[jnp.clip(fine, 0, hashes.shape[0] - 1)], valid


def query_keys(lay: Layout, hashes: jax.Array):
  """(u32[..., G * MB, 2], i32[G * MB]): every group block's key (the fine hash at its end,
  group-major, as `group_hashes`) from `hashes` (u32[..., MH, 2]), and its group."""
  g_n, mb = lay.num_groups, lay.max_blocks
  pos = np.arange(mb)
  fine = np.concatenate([(pos + 1) * (g.block_size // lay.hash_block_size) - 1 for g in lay.groups])
  grp = np.repeat(np.arange(g_n, dtype=np.int32), mb)
  return hashes[..., np.clip(fine, 0, hashes.shape[-2] - 1), :], jnp.asarray(grp)


def probe_all(lay: Layout, state: CacheState, hashes, num_tokens, keys=None):
  """i32[G, MB]: the first-inserted block carrying each group block's key, -1 on a miss.

  All groups are probed in one batch of G * MB queries (static gather indices per group).
  `keys` (optional): (u32[G * MB, 2] `query_keys`, i32[G * MB] their buckets), precomputed.
  """
  g_n, mb = lay.num_groups, lay.max_blocks
  pos = np.arange(mb)
  ends = np.concatenate([(pos + 1) * g.block_size for g in lay.groups]).astype(np.int32)
  h, grp = query_keys(lay, hashes) if keys is None else (keys[0], query_keys(lay, hashes)[1])
  found = block_index.probe(state, h, grp, None if keys is None else keys[1])
  return jnp.where(ends <= num_tokens, found, -1).reshape(g_n, mb)


def _find(lay: Layout, spec, need, cached, cap, drop):
  al = lay.sbs
  if spec.kind == "full":
    return full_attention.find(cached, cap, drop, spec.block_size, al)
  if spec.kind == "swa":
    return sliding_window.find(cached, cap, drop, spec.block_size, al, need)
  return recurrent.find(cached, cap, spec.block_size, al)


def lookup(lay: Layout, state: CacheState, hashes: jax.Array, num_tokens: jax.Array, keys=None):
  """Reconciled lookup for a fresh request.

  Returns a dict: hit (i32), alone (i32[G], each group looked up alone), hit_mask (bool[G, MB],
  non-null hit positions), found (i32[G, MB]), spb (shared-prefix boundary, 0 if none).
  `keys`: optional precomputed query keys and buckets (see `probe_all`).
  """
  g_n = lay.num_groups
  mb = lay.max_blocks
  found = probe_all(lay, state, hashes, num_tokens, keys)
  cached = found >= 0
  max_len = jnp.maximum(num_tokens - 1, 0).astype(jnp.int32)
  zero = jnp.int32(0)
  if not lay.caching:
    return dict(
      hit=zero,
      alone=jnp.zeros((g_n,), jnp.int32),
      hit_mask=jnp.zeros((g_n, mb), bool),
      found=found,
      spb=zero,
    )

  if lay.partial:
    return lookup_partial(lay, state, hashes, num_tokens, found)
  if not any(s.spec.eagle for s in lay.spec_groups):
    return _lookup_closed_form(lay, found, cached, max_len)

  sgs = lay.spec_groups
  ns = len(sgs)
  sg_cached = [jnp.all(cached[jnp.asarray(s.members)], axis=0) for s in sgs]
  # each group alone = its spec group's lookup (vLLM `find_longest_cache_hit_per_group`)
  sg_alone = [
    _find(lay, s.spec, s.need, sg_cached[j], max_len, jnp.asarray(s.spec.eagle))[0]
    for j, s in enumerate(sgs)
  ]
  alone = jnp.stack([sg_alone[j] for j in _spec_index(lay)])
  simple = ns == 2 and sgs[0].spec.kind == "full"

  def one_pass(carry):
    hit, lens, los, verified, longest, fa_done, _ = carry
    cur = hit
    for j, s in enumerate(sgs):
      spec = s.spec
      drop = jnp.asarray(spec.eagle) & ~verified[j]
      cap = cur
      if spec.kind != "mamba":
        cap = jnp.where(drop, jnp.minimum(cur + spec.block_size, max_len), cur)
      length, lo = _find(lay, spec, s.need, sg_cached[j], cap, drop)
      new_verified = jnp.where(
        drop, verified.at[j].set(True), jnp.where(length < cur, jnp.zeros_like(verified), verified)
      )
      new_longest = jnp.maximum(longest, length)
      if spec.kind == "full":
        skip = fa_done
        cur_f = jnp.minimum(cur, lens[j])
        cur = jnp.where(skip, cur_f, length)
        lens = lens.at[j].set(jnp.where(skip, lens[j], length))
        los = los.at[j].set(jnp.where(skip, los[j], lo))
        verified = jnp.where(skip, verified, new_verified)
        longest = jnp.where(skip, longest, new_longest)
      else:
        cur = length
        lens = lens.at[j].set(length)
        los = los.at[j].set(lo)
        verified = new_verified
        longest = new_longest
    done = (cur >= hit) | simple
    return jnp.minimum(cur, hit), lens, los, verified, longest, jnp.bool_(True), done

  init = (
    max_len,
    jnp.zeros((ns,), jnp.int32),
    jnp.zeros((ns,), jnp.int32),
    jnp.zeros((ns,), bool),
    zero,
    jnp.bool_(False),
    jnp.bool_(False),
  )
  hit, lens, los, _, longest, _, _ = jax.lax.while_loop(lambda c: ~c[-1], one_pass, init)

  pos = jnp.arange(mb)
  masks = [None] * g_n
  for j, s in enumerate(sgs):
    bs = s.spec.block_size
    hi = hit // bs
    lo = jnp.where(s.spec.kind == "full", 0, los[j])
    m = (pos >= lo) & (pos < hi)
    for g in s.members:
      masks[g] = m & cached[g]
  spb = jnp.where(longest > hit, longest, 0)
  return dict(hit=hit, alone=alone, hit_mask=jnp.stack(masks), found=found, spb=spb)


def _valid_ends(lay: Layout, spec, need: int, cached: jax.Array, cs: jax.Array) -> jax.Array:
  """bool[MB]: block positions where a hit of group kind `spec` may end (no EAGLE drop).

  `find(cap)` of that kind is the largest `(pos + 1) * bs <= cap` over these positions (0 if
  none): full attention: aligned ends inside the leading cached run; SWA: aligned cached ends
  with `need` cached blocks before them, or inside the leading run; recurrent: aligned cached
  blocks. `cs` (i32[MB]) is the inclusive prefix count of `cached`.
  """
  mb = cached.shape[0]
  pos = np.arange(mb)
  bs = spec.block_size
  aligned = jnp.asarray(((pos + 1) * bs) % lay.sbs == 0)
  lead = cs == jnp.asarray(pos + 1)  # pos inside the leading cached run
  if spec.kind == "full":
    return lead & aligned
  if spec.kind == "swa":
    k = max(need, 1)
    before = jnp.concatenate([jnp.zeros((k,), cs.dtype), cs[: mb - k]]) if k < mb else 0 * cs
    window = ((cs - before) == k) & jnp.asarray(pos >= k - 1)
    return cached & aligned & (window | lead)
  return cached & aligned


def _lookup_closed_form(lay: Layout, found, cached, max_len):
  """`lookup` without EAGLE groups, in one vectorised pass instead of the fixed-point loop.

  Without the EAGLE drop every finder returns the largest valid end at or below its cap, so
  the fixed point is the largest `L <= num_tokens - 1` (a multiple of the scheduler block size)
  that is a valid end in every spec group; a one-pass "simple hybrid" (full attention + one
  group) reaches the same point because full attention's valid ends are downward closed.
  """
  g_n, mb = lay.num_groups, lay.max_blocks
  sgs = lay.spec_groups
  pos = np.arange(mb)
  sg_cached = [jnp.all(cached[jnp.asarray(s.members)], axis=0) for s in sgs]
  rows = jnp.concatenate([cached, jnp.stack(sg_cached)], axis=0)  # [G + NS, MB]
  # inclusive prefix counts of every row in one small exact matmul (no reduce-window cumsum)
  tri = jnp.asarray((pos[:, None] <= pos[None, :]).astype(np.float32))
  cs = jnp.matmul(rows.astype(jnp.float32), tri, precision=jax.lax.Precision.HIGHEST)
  cs = cs.astype(jnp.int32)
  specs = [(g, g.window and -(-(g.window - 1) // g.block_size)) for g in lay.groups]
  specs += [(s.spec, s.need) for s in sgs]
  valid = jnp.stack(
    [_valid_ends(lay, spec, need, rows[i], cs[i]) for i, (spec, need) in enumerate(specs)]
  )
  bss = np.array([spec.block_size for spec, _ in specs], np.int32)[:, None]
  ends = (pos[None, :] + 1) * bss  # i32[G + NS, MB] token end of each position
  best = jnp.max(jnp.where(valid & (ends <= max_len), ends, 0), axis=1)
  # each group alone = its spec group's lookup (vLLM `find_longest_cache_hit_per_group`)
  alone = best[g_n + np.asarray(_spec_index(lay))]
  longest = best[g_n]  # first spec group at the full cap: every later find is at most this
  # common valid ends on the scheduler-block grid: L = k * sbs, k = 1..K
  al = lay.sbs
  k_max = min(mb * s.spec.block_size // al for s in sgs)
  common = jnp.ones((k_max,), bool)
  for j, s in enumerate(sgs):
    step = al // s.spec.block_size
    common &= valid[g_n + j, step - 1 :: step][:k_max]
  grid = (np.arange(k_max, dtype=np.int32) + 1) * al
  hit = jnp.max(jnp.where(common & (grid <= max_len), grid, 0), initial=0).astype(jnp.int32)
  masks = [None] * g_n
  for s in sgs:
    bs = s.spec.block_size
    hi = hit // bs
    if s.spec.kind == "swa":
      lo = jnp.maximum(hi - max(s.need, 1), 0)
    elif s.spec.kind == "mamba":
      lo = jnp.maximum(hi - 1, 0)
    else:
      lo = 0
    m = (pos >= lo) & (pos < hi)
    for g in s.members:
      masks[g] = m & cached[g]
  spb = jnp.where(longest > hit, longest, 0).astype(jnp.int32)
  return dict(
    hit=hit, alone=alone.astype(jnp.int32), hit_mask=jnp.stack(masks), found=found, spb=spb
  )


# ---------------------------------------------------------------------------------------------
# fine-grained (partial) hits, vLLM §2.5 (traced only when `lay.partial`)


def fine_probe(lay: Layout, state: CacheState, hashes: jax.Array, num_tokens: jax.Array):
  """i32[len(fine_groups), MH]: block carrying each hash-block key (the chained hash at every
  hash-block boundary) in every fine group, -1 on a miss or past `num_tokens`."""
  mh = lay.max_hashes
  fg = lay.fine_groups
  h = jnp.broadcast_to(hashes[None], (len(fg), mh, 2)).reshape(-1, 2)
  grp = jnp.asarray(np.repeat(np.asarray(fg, np.int32), mh))
  found = block_index.probe(state, h, grp).reshape(len(fg), mh)
  ends = (np.arange(mh) + 1) * lay.hash_block_size
  return jnp.where(ends[None, :] <= num_tokens, found, -1)


def _full_find_fine(lay: Layout, cached, fine_cached, cap, drop, bs: int):
  """Full attention with fine-grained hits (vLLM §2.5 phase 1 + phase 2).

  `cached` bool[MB] (block keys), `fine_cached` bool[MH] or None (bs == HBS: no phase 2).
  Returns (L, run, f): hit tokens after the EAGLE drop of one hash block, the leading run of
  full blocks, and the hash-block index phase 2 found (-1 if none).
  """
  hbs = lay.hash_block_size
  pos = jnp.arange(cached.shape[0])
  ok = cached & (pos < cap // bs)
  run = jnp.sum(jnp.cumprod(ok.astype(jnp.int32))).astype(jnp.int32)
  length = run * bs
  f = jnp.int32(-1)
  if fine_cached is not None:
    scale = bs // hbs
    fpos = jnp.arange(fine_cached.shape[0])
    first = run * scale
    hi = jnp.minimum(first + scale - 1, cap // hbs)
    sel = fine_cached & (fpos >= first) & (fpos < hi)
    f = jnp.max(jnp.where(sel, fpos, -1)).astype(jnp.int32)
    length = jnp.where(f >= 0, (f + 1) * hbs, length)
  length = jnp.where(drop & (length > 0), length - min(lay.hit_align, bs), length)
  return floor_to_i32(length, lay.hit_align), run, f


def floor_to_i32(x, m):
  return ((x // m) * m).astype(jnp.int32)


def _mamba_valid(lay: Layout, spec, fine_cached, cached):
  """bool[MH]: hash-block indices where a recurrent hit may end (key present, aligned)."""
  hbs = lay.hash_block_size
  if fine_cached is not None:
    return fine_cached
  # block == hash block: block position i ends at hash index i * (bs // hbs) + ... (scale 1)
  mh = lay.max_hashes
  k = spec.block_size // hbs
  fpos = np.arange(mh)
  blk = (fpos + 1) // k - 1
  on_edge = ((fpos + 1) % k == 0) & (blk < cached.shape[0])
  return jnp.where(jnp.asarray(on_edge), cached[np.clip(blk, 0, cached.shape[0] - 1)], False)


def _spec_index(lay: Layout) -> tuple[int, ...]:
  """Per group, the index of its spec group in `lay.spec_groups`."""
  out = [0] * lay.num_groups
  for j, s in enumerate(lay.spec_groups):
    for g in s.members:
      out[g] = j
  return tuple(out)


def _swa_valid_fine(lay: Layout, spec, cached):
  """bool[MH]: hash-block indices where a sliding-window hit may end, with partial hits.

  A window group beside partial hits has the hash block as its block (vLLM turns partial hits
  off otherwise), so block position i ends at hash index i: valid where the `swa_need` blocks
  (at least one) before the end are cached, or inside the leading cached run (§2.3).
  """
  mb, mh = cached.shape[0], lay.max_hashes
  k = max(spec.swa_need, 1)
  pos = jnp.arange(mb)
  cs = jnp.cumsum(cached.astype(jnp.int32))
  before = jnp.concatenate([jnp.zeros((k,), cs.dtype), cs[: mb - k]]) if k < mb else 0 * cs
  window = ((cs - before) == k) & (pos >= k - 1)
  valid = cached & (window | (cs == pos + 1))
  if mb >= mh:
    return valid[:mh]
  return jnp.concatenate([valid, jnp.zeros((mh - mb,), bool)])


def _rec_valid(lay: Layout, spec, fine_cached, cached):
  """bool[MH]: where a hit of a non-full group may end (recurrent or sliding window)."""
  if spec.kind == "swa":
    return _swa_valid_fine(lay, spec, cached)
  return _mamba_valid(lay, spec, fine_cached, cached)


def lookup_partial(lay: Layout, state: CacheState, hashes, num_tokens, found):
  """`lookup` with fine-grained hits (vLLM §2.5): alignment = hash block.

  Full attention (looked up once, phase 1 run plus phase 2 probe of the hash-block boundaries
  inside the next block, high to low; EAGLE drops one hash block) caps the hit; recurrent
  and sliding-window groups (whose block is the hash block) then agree on the largest
  hash-block boundary at or below it valid in every one of them (right-to-left scan over
  hash-block positions, no EAGLE drop). Output as `lookup`;
  `found` i32[G, MB] holds the block each hit position uses (a partial full-attention block at
  position hit // bs, the recurrent block at (hit - 1) // bs).
  """
  mb, mh = lay.max_blocks, lay.max_hashes
  hbs = lay.hash_block_size
  cached = found >= 0
  max_len = jnp.maximum(num_tokens - 1, 0).astype(jnp.int32)
  fine = fine_probe(lay, state, hashes, num_tokens) if lay.fine_groups else None
  frow = {g: i for i, g in enumerate(lay.fine_groups)}

  def fine_of(g):
    return None if g not in frow else fine[frow[g]]

  pos = jnp.arange(mb)
  fpos = jnp.arange(mh)
  def merged(s):  # (cached bool[MB], fine-cached bool[MH] or None) of a spec group's members
    members = list(s.members)
    c = jnp.all(cached[jnp.asarray(members)], axis=0)
    if fine_of(members[0]) is None:
      return c, None
    return c, jnp.all(jnp.stack([fine_of(g) >= 0 for g in members]), axis=0)

  # each group alone = its spec group's lookup (vLLM `find_longest_cache_hit_per_group`);
  # `valid[j]`: the valid ends of non-full spec group j (independent of the cap, reused below)
  sg_alone, valid = [], {}
  for j, s in enumerate(lay.spec_groups):
    spec = s.spec
    c, fc = merged(s)
    if spec.kind == "full":
      length, _, _ = _full_find_fine(lay, c, fc, max_len, jnp.asarray(spec.eagle), spec.block_size)
    else:
      valid[j] = _rec_valid(lay, spec, fc, c)
      f = jnp.max(jnp.where(valid[j] & ((fpos + 1) * hbs <= max_len), fpos, -1))
      length = ((f + 1) * hbs).astype(jnp.int32)
    sg_alone.append(length)
  alone = jnp.stack([sg_alone[j] for j in _spec_index(lay)])

  cur = max_len
  longest = None
  fa_state = {}
  common = jnp.ones((mh,), bool)
  for j, s in enumerate(lay.spec_groups):
    spec = s.spec
    members = list(s.members)
    if spec.kind == "full":
      sg_cached, sg_fine = merged(s)
      length, run, f = _full_find_fine(
        lay, sg_cached, sg_fine, cur, jnp.asarray(spec.eagle), spec.block_size
      )
      for g in members:
        fa_state[g] = (run, f)
      cur = length
      if longest is None:
        longest = length
    else:
      # equal specs merged: a hit needs the key in every member
      common &= valid[j]
      if longest is None:  # no full attention: the first group's own lookup
        f0 = jnp.max(jnp.where(valid[j] & ((fpos + 1) * hbs <= cur), fpos, -1))
        longest = ((f0 + 1) * hbs).astype(jnp.int32)
  has_rec = any(s.spec.kind != "full" for s in lay.spec_groups)
  if has_rec:
    fh = jnp.max(jnp.where(common & ((fpos + 1) * hbs <= cur), fpos, -1))
    hit = ((fh + 1) * hbs).astype(jnp.int32)
  else:
    hit = cur
  masks, out_found = [], []
  for g, spec in enumerate(lay.groups):
    bs = spec.block_size
    fc = fine_of(g)
    if spec.kind == "full":
      n = (hit + bs - 1) // bs
      m = pos < n
      run, f = fa_state[g]
      blk = found[g]
      if fc is not None:
        # the phase-2 block sits at position `run` (only used when the hit reaches into it)
        pb = fc[jnp.maximum(f, 0)]
        blk = jnp.where((pos == run) & (f >= 0), pb, blk)
    elif spec.kind == "swa":  # the window's blocks before the hit (§2.3)
      hi = hit // bs
      m = (pos >= jnp.maximum(hi - max(spec.swa_need, 1), 0)) & (pos < hi) & cached[g]
      blk = found[g]
    else:
      p = (hit - 1) // bs
      m = (pos == p) & (hit > 0)
      if fc is not None:
        fb = fc[jnp.maximum(hit // hbs - 1, 0)]
      else:
        fb = found[g][jnp.maximum(p, 0)]
      blk = jnp.where(m, fb, -1)
    masks.append(m & (blk >= 0))
    out_found.append(blk)
  spb = jnp.where(longest > hit, longest, 0).astype(jnp.int32)
  return dict(hit=hit, alone=alone, hit_mask=jnp.stack(masks), found=jnp.stack(out_found), spb=spb)
