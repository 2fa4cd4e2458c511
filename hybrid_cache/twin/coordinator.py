"""Lookup of the plain-Python twin: per-group hits and the coordinator's fixed point (§2.2-§3.2).

Jitted twins: `core/coordinator.py` (`lookup`) and, for partial hits (§2.5), `core/partial.py`
(`lookup_partial`). The per-kind finders (`find_full`, `find_swa`, `find_mamba` and their
fine-grained forms) are pure rules in `twin/rules.py`; here they read the hash index.

`lookup` reports each group's hit alone (vLLM's `find_longest_cache_hit_per_group`: equal-spec
groups looked up together) and the hit every group agrees on (`reconcile`, §3.2): full
attention is looked up once, the other groups are re-checked at each smaller candidate until
nobody shrinks; EAGLE groups drop one unit and re-verify whenever the candidate shrinks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hybrid_cache import hashing
from hybrid_cache.twin import rules
from hybrid_cache.twin.state import NULL
from hybrid_cache.twin.state import SpecGroup
from hybrid_cache.twin.state import TwinState
from hybrid_cache.types import HitInfo


def group_hashes(s: TwinState, fine: np.ndarray, block_size: int) -> list[int]:
  """The chained hashes of a group's blocks from the hash-block ones ([] if not a multiple)."""
  if block_size % s.hbs:
    return []
  view = hashing.group_view(fine, block_size, s.hbs)
  return [int(x) for x in hashing.as_u64(view)] if len(view) else []


def cached_fn(s: TwinState, hashes: list[int], members: Sequence[int]):
  """`cached(i)` of `rules`: the first block of key i in every member group, or None."""

  def cached(i: int):
    if i >= len(hashes):
      return None
    out = []
    for g in members:
      ids = s.index.get((hashes[i], g))
      if not ids:
        return None
      out.append(ids[0])
    return tuple(out)

  return cached


def find(s: TwinState, sg: SpecGroup, fine, members, max_length: int, drop: bool):
  """One spec group's longest hit up to `max_length`: (entries, hit tokens), per kind."""
  hashes = group_hashes(s, fine, sg.block_size)
  cached = cached_fn(s, hashes, members)
  max_length = max(0, max_length)
  align = s.align
  if s.partial and sg.block_size > s.hbs and sg.kind in ("full", "mamba"):
    fine_keys = [int(x) for x in hashing.as_u64(fine)] if len(fine) else []
    cached_fine = cached_fn(s, fine_keys, members)
    if sg.kind == "full":
      return rules.find_full_fine(
        cached, cached_fine, sg.block_size, s.hbs, max_length, len(fine_keys), drop
      )
    return rules.find_mamba_fine(cached_fine, sg.block_size, s.hbs, max_length, len(fine_keys))
  if sg.kind == "full":
    return rules.find_full(cached, sg.block_size, max_length, drop, align)
  if sg.kind == "swa":
    return rules.find_swa(cached, sg.block_size, sg.window, max_length, drop, align)
  return rules.find_mamba(cached, sg.block_size, max_length, align)


def lookup(s: TwinState, fine: np.ndarray, num_tokens: int):
  """(HitInfo, per-group hit rows) for a fresh request of `num_tokens` tokens."""
  ng = len(s.groups)
  max_len = num_tokens - 1
  empty = HitInfo(0, (0,) * ng, (0,) * ng, 0), [[] for _ in range(ng)]
  if not s.caching or max_len <= 0:
    return empty
  # each group alone, as vLLM's `find_longest_cache_hit_per_group`: groups of equal specs are
  # looked up together (a hit needs the key in every member), each member reports that hit
  per_group = [0] * ng
  for sg in s.spec_groups:
    drop = s.groups[sg.members[0]].eagle and sg.kind != "mamba"
    hit_alone = find(s, sg, fine, sg.members, max_len, drop)[1]
    for gid in sg.members:
      per_group[gid] = hit_alone
  hit, entries, longest = reconcile(s, fine, max_len)
  rows = [[] for _ in range(ng)]
  for sg, ent in zip(s.spec_groups, entries):
    for k, gid in enumerate(sg.members):
      rows[gid] = [NULL if e is None else e[k] for e in ent]
  boundary = longest if longest > hit else 0
  info = HitInfo(
    hit_tokens=hit,
    per_group_hit_tokens=tuple(per_group),
    hit_blocks_per_group=tuple(sum(1 for b in r if b != NULL) for r in rows),
    shared_prefix_boundary=boundary,
  )
  return info, rows


def reconcile(s: TwinState, fine: np.ndarray, max_len: int):
  """The coordinator's fixed point (§3.2): (hit, entries per spec group, longest)."""
  sgs = s.spec_groups
  if len(sgs) == 1:
    sg = sgs[0]
    drop = sg.eagle and sg.kind != "mamba"
    ent, length = find(s, sg, fine, sg.members, max_len, drop)
    return length, [ent], length
  hit = max_len
  longest = 0
  verified: set[int] = set()
  entries: list[list] = [[] for _ in sgs]
  lengths = [0] * len(sgs)
  looked_up = [False] * len(sgs)
  while True:
    cur = hit
    for k, sg in enumerate(sgs):
      if sg.kind == "full" and looked_up[k]:
        cur = min(cur, lengths[k])
        continue
      drop = sg.eagle and sg.kind != "mamba" and k not in verified
      cap = cur
      if drop:
        # EAGLE margin: one hash block for a fine-grained full-attention group (§2.5)
        fine_grained = s.partial and sg.kind == "full" and sg.block_size > s.hbs
        cap = min(cur + (s.hbs if fine_grained else sg.block_size), max_len)
      ent, length = find(s, sg, fine, sg.members, cap, drop)
      if drop:
        verified.add(k)
      elif length < cur:
        verified.clear()
      cur = length
      entries[k], lengths[k], looked_up[k] = ent, length, True
      longest = max(longest, cur)
    if cur >= hit:
      break
    hit = cur
    if len(sgs) == 2 and sgs[0].kind == "full":
      break
  for k, sg in enumerate(sgs):
    if sg.kind == "full":
      entries[k] = entries[k][: rules.cdiv(hit, sg.block_size)]
  return hit, entries, longest
