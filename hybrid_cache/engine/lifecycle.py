"""How a request's run moves on after a step: commit, finish, preempt, drop.

`commit_tokens` takes a request's newly sampled tokens (from `model_step.run_model` or
`spec_step.run_verify`): the request finishes (blocks freed, `finish`) or the cache manager
extends its hash chain. `preempt_newest` is the recompute preemption of the newest running
request when the core could not give a running request blocks; `drop_stuck` fails the head
waiting request when nothing ran and nothing runs (it can never fit); `release_private`
returns a speculative request's private pool id (`spec_step`). Each takes the `Engine`
and changes its queues (`_reqs`, `_waiting`, `_running`, `_finished`) and stats.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybrid_cache.engine.records import RequestOutput
from hybrid_cache.engine.records import RequestState

if TYPE_CHECKING:
  from hybrid_cache.engine.engine import Engine


def commit_tokens(
  eng: Engine, r: RequestState, tokens: list[int], now: float, finished: list[RequestOutput]
) -> None:
  """After r's sampled `tokens` are appended to r.output: token times, then the request
  finishes (blocks freed) or the manager extends its hash chain with the tokens."""
  if r.first_token_time is None:
    r.first_token_time = now
    r.first_token_step = eng.stats.steps
  r.last_token_time = now
  if r.done:
    eng.manager.free(r.rid)
    eng._running.remove(r.rid)
    finished.append(finish(eng, r))
  else:
    eng.manager.append_tokens(r.rid, tokens)


def preempt_newest(eng: Engine) -> None:
  """The newest running request gives its blocks back and waits first (recompute)."""
  if not eng._running:
    return
  rid = eng._running.pop()
  r = eng._reqs[rid]
  eng.manager.preempt(rid)
  r.running, r.num_computed = False, 0
  release_private(eng, r)
  r.preemptions += 1
  eng.stats.preemptions += 1
  eng._waiting.appendleft(rid)


def drop_stuck(eng: Engine, finished: list[RequestOutput]) -> None:
  """Nothing ran and nothing is running: the head waiting request can never be served."""
  if eng._running or not eng._waiting:
    return
  rid = eng._waiting.popleft()
  r = eng._reqs[rid]
  if r.in_manager:
    eng.manager.free(rid)
  r.error = (
    f"request {rid!r} ({r.num_tokens} tokens) cannot be scheduled even alone: the pool "
    f"(num_blocks={eng.cache_config.num_blocks}) or token budget is too small"
  )
  finished.append(finish(eng, r))


def finish(eng: Engine, r: RequestState) -> RequestOutput:
  """r leaves the engine: its private pool id back, the drafter told, its output recorded."""
  del eng._reqs[r.rid]
  if eng.drafter is not None:
    release_private(eng, r)
    if r.error is None:
      eng.drafter.record(r.prompt + r.output)
  out = r.output_record()
  eng._finished[r.rid] = out
  return out


def release_private(eng: Engine, r: RequestState) -> None:
  """Returns r's private pool id (request preempted or finished); drops its queued copies."""
  if r.private is not None:
    eng._pending_kv = [c for c in eng._pending_kv if c[1] != r.private]
    eng._free_private.append(r.private)
  r.private, r.carry_valid, r.scratch_col = None, False, None
