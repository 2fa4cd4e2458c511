"""Key registration of the plain-Python twin (§1.7 `cache_blocks`, §2.3.4 / §2.4.7 retention).

Jitted twin: `core/cache_keys.py`. Optimistic caching (`cache_blocks`): a request's blocks are
keyed up to the scheduler-block floor of its computed tokens, through the retention masks of
the window and recurrent groups (`cacheable`; placement and admission seams of
`hybrid_cache.policies` for recurrent groups). With partial hits (§2.5) nothing is floored and
the prompt-tail entry is keyed too (`cache_partial_tail`, `cache_fa_tail`; core
`cache_partial_tail`); with fine keys (beyond vLLM) full blocks also get a key at every inner
hash-block boundary (`cache_fine_keys`; core `fine_key_entries`).
"""

from __future__ import annotations

from typing import NamedTuple

from hybrid_cache import hashing
from hybrid_cache.twin import access_history
from hybrid_cache.twin import block_pool
from hybrid_cache.twin import coordinator
from hybrid_cache.twin import rules
from hybrid_cache.twin.state import NULL
from hybrid_cache.twin.state import Request
from hybrid_cache.twin.state import TwinState


class PlacementRequest(NamedTuple):
  """What a stateful placement policy reads of one request's registration call, one recurrent
  group (`Placement.start`; jitted twin `core.cache_keys.PlacementRequest`, whose slot is the
  request `name` here).

  Attributes:
    name: the request.
    admitted: this call admits the request (its first allocation).
    hit: the hit tokens of the admission (0 otherwise).
    spb: the request's shared-prefix boundary (`Request.boundary`, 0 = none).
    prompt: prompt tokens.
    tokens: tokens known (prompt + output so far).
    computed: the group's block positions this call registers up to (from the group's
      `num_cached` to the registration floor), before any mask.
    keys: the group's block keys (64-bit).
  """

  name: str
  admitted: bool
  hit: int
  spb: int
  prompt: int
  tokens: int
  computed: range
  keys: list[int]


def cacheable(s: TwinState, req: Request, gid: int, i: int) -> bool:
  """Whether block i of group `gid` is kept (registered): the retention masks (§2.3.4, §2.4.7)."""
  # vLLM `reachable_block_mask` segments and aligns on the hit alignment (the hash block with
  # partial hits, else the scheduler block)
  g = s.groups[gid]
  r = s.config.retention_interval
  boundaries = [req.num_prompt_tokens - 1]
  if req.boundary > 0:
    boundaries.append(req.boundary)
  if s.fine_keys:  # beyond vLLM: also the scheduler-block states vLLM keeps there
    boundaries += [b for b in (rules.floor_to(x, s.sbs) for x in boundaries) if b > 0]
  if g.kind == "swa":
    return rules.swa_cacheable(
      i,
      block_size=s.bs[gid],
      need=rules.swa_need(g.window, s.bs[gid], g.eagle),
      alignment_tokens=s.align,
      eagle=g.eagle,
      retention_interval=r,
      boundaries=boundaries,
    )
  if g.kind == "mamba":
    keep = rules.mamba_cacheable(
      i,
      block_size=s.bs[gid],
      alignment_tokens=s.align,
      retention_interval=r,
      boundaries=boundaries,
    )
    if s.placement is not None:
      keep = s.placement.keep(s.config, i, s.bs[gid], s.align, boundaries, keep)
    return keep
  return True


def cache_blocks(
  s: TwinState, req: Request, num_tokens: int, admitted: bool = False, hit: int = 0
) -> None:
  """Optimistic caching (§1.7): register keys up to `num_tokens` (floored to the LCM).

  With partial hits (§2.5) nothing is floored and the prompt-tail entries are added too.
  `admitted`, `hit`: this call admits the request with this hit (read only by a stateful
  placement policy, which starts each recurrent group's call, and a retirement policy, which
  observes the blocks it keeps: `PlacementRequest`).
  """
  floored = num_tokens if s.partial else rules.floor_to(num_tokens, s.sbs)
  for gid in range(len(req.rows)):
    g, bs = s.groups[gid], s.bs[gid]
    n = floored
    if g.eagle and g.kind != "mamba":
      n = min(num_tokens, floored + bs)
    full = n // bs
    stateful = hasattr(s.placement, "start")
    if g.kind == "mamba" and (stateful or s.retirement is not None):
      preq = PlacementRequest(
        name=req.name,
        admitted=admitted,
        hit=hit if admitted else 0,
        spb=req.boundary,
        prompt=req.num_prompt_tokens,
        tokens=len(req.tokens),
        computed=range(req.num_cached[gid], full),
        keys=coordinator.group_hashes(s, req.fine_hashes, bs),
      )
      if stateful:
        s.placement.start(gid, preq)
      if s.retirement is not None:  # the points this call keeps (the core's `offered`)
        row = req.rows[gid]
        kept = [
          i for i in preq.computed if i < len(row) and row[i] != NULL and cacheable(s, req, gid, i)
        ]
        s.retirement.observe(gid, preq, kept)
    if s.partial:
      cache_partial_tail(s, req, gid, n, full)
      continue
    if req.num_cached[gid] < full:
      cache_full(s, req, gid, full)
    if g.kind == "full" and bs != s.hbs:
      # vLLM FullAttentionManager.cache_blocks: the prompt-tail entry is not gated on partial
      # hits; with n floored to sbs it is an extra key of a full block (EAGLE: maybe primary)
      cache_fa_tail(s, req, gid, n)


def cache_full(s: TwinState, req: Request, gid: int, full: int) -> None:
  """Keys the group's blocks [num_cached, full) (null / masked ones skipped)."""
  row, bs = req.rows[gid], s.bs[gid]
  hashes = coordinator.group_hashes(s, req.fine_hashes, bs)
  state = s.groups[gid].kind == "mamba"
  span = range(req.num_cached[gid], min(full, len(row)))
  # the ghosts (`access_history`) are read before this call's promotions drop any key (the
  # core reads them for the whole call at once)
  ghosts = {}
  if s.history:
    ghosts = {i: access_history.recall(s, (hashes[i], gid)) for i in span if i < len(hashes)}
  for i in span:
    b = row[i]
    if b == NULL or not cacheable(s, req, gid, i):
      continue
    admitted = True
    if s.admission is not None and s.groups[gid].kind == "mamba":
      admitted = s.admission.admit(gid, hashes[i])  # every kept state is offered
    if s.key[b] is not None:
      if s.key_end[b] >= (i + 1) * bs:
        continue
      block_pool.evict_key(s, b)  # partial -> full promotion drops every key of the block (§2.5)
    if not admitted:
      continue
    key = (hashes[i], gid)
    s.index.setdefault(key, []).append(b)
    s.key[b] = key
    s.key_end[b] = (i + 1) * bs
    s.hits[b] = 0
    s.stamp[b] = s.evict_clock  # the eviction clock now, not ranked yet
    s.ranked[b] = 0
    s.last[b] = s.step  # an access now, the one before inherited (`access_history`)
    s.penult[b] = max(req.inherit, ghosts.get(i, 0))
    # chain start: a state's previous kept state (then this one), else the block's start
    s.chain[b] = req.chain.get(gid, 0) if state else i * bs
    if state:
      req.chain[gid] = (i + 1) * bs
    s.cached_this_step.add(key)
    if s.fine_keys and s.groups[gid].kind == "full" and bs > s.hbs:
      cache_fine_keys(s, req, gid, b, i)
  req.num_cached[gid] = full


def cache_fine_keys(s: TwinState, req: Request, gid: int, b: int, i: int) -> None:
  """Beyond vLLM (`CacheConfig.fine_keys`, core `cache_keys.fine_key_entries`): full block
  b at table position i, just keyed, gets an extra key at every hash-block boundary inside
  it, in token order."""
  bs, hbs = s.bs[gid], s.hbs
  for t in range(i * bs + hbs, (i + 1) * bs, hbs):
    block_pool.insert_key(s, b, partial_key(s, req, t, gid), t, i * bs)


def cache_partial_tail(s: TwinState, req: Request, gid: int, n: int, full: int) -> None:
  """Partial-hits caching of one group (§2.5): full blocks, then the prompt-tail entry.

  Full attention keys the block holding `t = _tail_boundary(req)` under the prefix hash at
  t once n >= t; a recurrent align group only when a chunk ends exactly at t, and then its
  block (when t is inside it) waits for a copy-on-write at the request's next allocation.
  """
  row, bs, hbs = req.rows[gid], s.bs[gid], s.hbs
  if req.num_cached[gid] < full:
    cache_full(s, req, gid, full)
  kind = s.groups[gid].kind
  if kind == "full":
    cache_fa_tail(s, req, gid, n)
    return
  if kind != "mamba" or s.mode[gid] != "align" or bs == hbs:
    return
  # vLLM MambaManager._cache_partial_tail_block: only when the chunk ends exactly at the
  # prompt's checkpoint position (`rules.checkpoint_position`: floor((P-1)/HBS)*HBS, EAGLE
  # floor(P/HBS)*HBS - HBS)
  t = tail_boundary(s, req, gid)
  j = rules.cdiv(t, bs) - 1
  if t <= 0 or n != t or j >= len(row) or row[j] == NULL:
    return
  if s.key[row[j]] is not None and s.key_end[row[j]] == t:
    return  # already keyed at t (a hit or an earlier step)
  b = row[j]
  cache_partial_block(s, req, b, t, gid, req.chain.get(gid, 0))
  req.chain[gid] = max(req.chain.get(gid, 0), t)  # the tail state is the latest kept one
  s.cached_this_step.add(partial_key(s, req, t, gid))
  if t % bs:  # a sub-block entry: the next allocation moves it to a copy (copy-on-write)
    req.partial[gid] = (j, b)
    req.num_cached[gid] = j


def cache_fa_tail(s: TwinState, req: Request, gid: int, n: int) -> None:
  """vLLM `FullAttentionManager._cache_partial_tail_block` (needs bs > HBS).

  Keys the block holding t = `tail_boundary` under the prefix hash at t once n >= t,
  unless t is 0 or block aligned, or the block is not allocated / null.
  """
  row, bs = req.rows[gid], s.bs[gid]
  t = tail_boundary(s, req, gid)
  if bs == s.hbs or t == 0 or t > n or t % bs == 0 or t // bs >= len(row):
    return
  if row[t // bs] != NULL:
    cache_partial_block(s, req, row[t // bs], t, gid, t // bs * bs)


def tail_boundary(s: TwinState, req: Request, gid: int) -> int:
  """The prompt-tail boundary of group `gid` (vLLM `_cache_partial_tail_block`).

  Full attention: floor((P-1)/HBS)*HBS (a re-sent prompt hits at most P-1 tokens; EAGLE
  lookups read the whole prompt: floor(P/HBS)*HBS). Recurrent: the prompt's checkpoint
  position (`rules.checkpoint_position`, EAGLE one hash block lower).
  """
  p, eagle = req.num_prompt_tokens, s.config.use_eagle
  if s.groups[gid].kind == "mamba":
    return rules.checkpoint_position(p, s.hbs, eagle)
  return rules.floor_to(p if eagle else p - 1, s.hbs)


def partial_key(s: TwinState, req: Request, t: int, gid: int) -> tuple[int, int]:
  """The key of the prefix of `t` tokens (a hash-block multiple) in group `gid`."""
  return (int(hashing.as_u64(req.fine_hashes[t // s.hbs - 1])), gid)


def cache_partial_block(s: TwinState, req: Request, b: int, t: int, gid: int, chain: int) -> None:
  """vLLM `cache_partial_block`: key the prefix of t tokens on block b (t inside b); `chain`:
  the key's chain start if it becomes b's primary key."""
  key = partial_key(s, req, t, gid)
  already = s.key[b] == key or b in s.index.get(key, ())
  if not already and s.key[b] is not None and s.key_end[b] < t:
    block_pool.evict_key(s, b)
  penult = max(req.inherit, access_history.recall(s, key) if s.history else 0)
  block_pool.insert_key(s, b, key, t, chain, penult)
