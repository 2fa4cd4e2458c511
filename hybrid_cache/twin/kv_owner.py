"""Twin of `hybrid_cache.core.kv_owner`: which recurrent state each full-attention block was
kept for, recorded when a request finishes, and how an eviction policy ranks KV by it. The
rule, its reason (chains live and die as one unit, as in the simulator's unit cache) and its
deviations are documented there; here the same integers, one request at a time."""

from __future__ import annotations

from hybrid_cache.twin import coordinator
from hybrid_cache.twin.state import NULL
from hybrid_cache.twin.state import Request
from hybrid_cache.twin.state import TwinState


def _found(s: TwinState, r: Request, gid: int) -> list[int]:
  """Per block position of group `gid` within r's tokens: the first block indexed under r's
  key there, NULL on a miss (core `coordinator.probe_all`)."""
  bs = s.bs[gid]
  keys = coordinator.group_hashes(s, r.fine_hashes, bs)[: len(r.tokens) // bs]
  return [s.index.get((k, gid), [NULL])[0] for k in keys]


def record(s: TwinState, r: Request) -> None:
  """`TwinState.owner` of finishing request r's full-attention blocks (core `record`): each
  keyed block found under r's prefix takes r's nearest kept state at or after its end in the
  first recurrent group."""
  rec = [gid for gid, g in enumerate(s.groups) if g.kind == "mamba"]
  if not rec:
    return
  states = _found(s, r, rec[0])
  bsr = s.bs[rec[0]]
  for gid, g in enumerate(s.groups):
    if g.kind != "full":
      continue
    bs = s.bs[gid]
    for p, kv in enumerate(_found(s, r, gid)):
      first = -(-(p + 1) * bs // bsr) - 1
      q = next((i for i in range(first, len(states)) if states[i] != NULL), None)
      if q is not None and kv != NULL:
        s.owner[kv] = states[q]


def owned_priority(config, blocks, own_of) -> list[int]:
  """Per candidate (`blocks.candidates` order): its own priority `own_of(b)` (any block id),
  full-attention blocks ranked by their owner (`blocks.owner`, core `owned_priority`):
  max(own, the owner's) while the owner holds a key in a recurrent group, else 0 (owner lost
  its key, or none); everything as its own without a recurrent or a full-attention group."""
  kinds = [g.kind for g in config.resolved_groups]
  if "mamba" not in kinds or "full" not in kinds:
    return [own_of(b) for b in blocks.candidates]

  def kind(b: int) -> str | None:
    return None if blocks.group[b] is None else kinds[blocks.group[b]]

  out = []
  for b in blocks.candidates:
    o = blocks.owner[b]
    if kind(b) != "full":
      out.append(own_of(b))
    elif o >= 0 and kind(o) == "mamba":
      out.append(max(own_of(b), own_of(o)))
    else:
      out.append(0)
  return out
