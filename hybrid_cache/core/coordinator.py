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
from hybrid_cache.core import groups
from hybrid_cache.core import xla_cpu
from hybrid_cache.core.layout import Layout
from hybrid_cache.core.partial import lookup_partial
from hybrid_cache.core.state import CacheState


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
  return groups.rules(spec).find_hit(lay, spec, need, cached, cap, drop)


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
  alone = jnp.stack([sg_alone[j] for j in lay.spec_group_of])
  # "simple hybrid": full attention (looked up once, `KEEPS_PREFIX`) + one group, one pass
  simple = ns == 2 and groups.rules(sgs[0].spec).KEEPS_PREFIX

  def one_pass(carry):
    hit, lens, los, verified, longest, fa_done, _ = carry
    cur = hit
    for j, s in enumerate(sgs):
      spec = s.spec
      kind = groups.rules(spec)
      drop = jnp.asarray(spec.eagle) & ~verified[j]
      cap = kind.eagle_cap(spec, cur, drop, max_len)
      length, lo = kind.find_hit(lay, spec, s.need, sg_cached[j], cap, drop)
      new_verified = jnp.where(
        drop, verified.at[j].set(True), jnp.where(length < cur, jnp.zeros_like(verified), verified)
      )
      new_longest = jnp.maximum(longest, length)
      if kind.KEEPS_PREFIX:  # looked up once (its valid ends are downward closed, §3.2)
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
    lo = jnp.where(groups.rules(s.spec).KEEPS_PREFIX, 0, los[j])  # the whole prefix from 0
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
  return groups.rules(spec).valid_ends(spec, need, cached, cs, aligned, lead)


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
  cs = xla_cpu.row_prefix_counts(rows)  # inclusive prefix count of every row
  specs = [(g, groups.rules(g).hit_need(g)) for g in lay.groups]
  specs += [(s.spec, s.need) for s in sgs]
  valid = jnp.stack(
    [_valid_ends(lay, spec, need, rows[i], cs[i]) for i, (spec, need) in enumerate(specs)]
  )
  bss = np.array([spec.block_size for spec, _ in specs], np.int32)[:, None]
  ends = (pos[None, :] + 1) * bss  # i32[G + NS, MB] token end of each position
  best = jnp.max(jnp.where(valid & (ends <= max_len), ends, 0), axis=1)
  # each group alone = its spec group's lookup (vLLM `find_longest_cache_hit_per_group`)
  alone = best[g_n + np.asarray(lay.spec_group_of)]
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
    lo = groups.rules(s.spec).hit_lo(s.spec, hi, s.need)
    m = (pos >= lo) & (pos < hi)
    for g in s.members:
      masks[g] = m & cached[g]
  spb = jnp.where(longest > hit, longest, 0).astype(jnp.int32)
  return dict(
    hit=hit, alone=alone.astype(jnp.int32), hit_mask=jnp.stack(masks), found=found, spb=spb
  )
