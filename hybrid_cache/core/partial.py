"""Fine-grained (partial) hits, vLLM §2.5: hits at hash-block granularity (traced only when
`lay.partial`).

Groups whose block is larger than the hash block (`lay.fine_groups`) are looked up at every
hash-block boundary (`fine_probe`); full attention finds its run of whole blocks and then the
partial tail block (phase 1 + phase 2, `_full_find_fine`); window and recurrent groups check
their valid ends at hash-block granularity (their kind's `fine_valid`), and each kind reads its
hit blocks (`fine_hit`); `lookup_partial` reconciles the spec groups like the coordinator's
fixed point (`coordinator.lookup`), with hits aligned to `lay.hit_align`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_cache.core import block_index
from hybrid_cache.core import groups
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.state import CacheState


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
    kind = groups.rules(spec)
    c, fc = merged(s)
    if kind.KEEPS_PREFIX:
      length, _, _ = _full_find_fine(lay, c, fc, max_len, jnp.asarray(spec.eagle), spec.block_size)
    else:
      valid[j] = kind.fine_valid(lay, spec, fc, c)
      f = jnp.max(jnp.where(valid[j] & ((fpos + 1) * hbs <= max_len), fpos, -1))
      length = ((f + 1) * hbs).astype(jnp.int32)
    sg_alone.append(length)
  alone = jnp.stack([sg_alone[j] for j in lay.spec_group_of])

  cur = max_len
  longest = None
  fa_state = {}
  common = jnp.ones((mh,), bool)
  for j, s in enumerate(lay.spec_groups):
    spec = s.spec
    members = list(s.members)
    if groups.rules(spec).KEEPS_PREFIX:  # looked up once, caps the hit
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
  has_rec = any(not groups.rules(s.spec).KEEPS_PREFIX for s in lay.spec_groups)
  if has_rec:
    fh = jnp.max(jnp.where(common & ((fpos + 1) * hbs <= cur), fpos, -1))
    hit = ((fh + 1) * hbs).astype(jnp.int32)
  else:
    hit = cur
  masks, out_found = [], []
  for g, spec in enumerate(lay.groups):
    fc = fine_of(g)
    m, blk = groups.rules(spec).fine_hit(lay, spec, g, hit, found, cached, fc, fa_state.get(g), pos)
    masks.append(m & (blk >= 0))
    out_found.append(blk)
  spb = jnp.where(longest > hit, longest, 0).astype(jnp.int32)
  return dict(hit=hit, alone=alone, hit_mask=jnp.stack(masks), found=jnp.stack(out_found), spb=spb)
