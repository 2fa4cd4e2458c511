"""Concurrent replay: arrivals at the trace's timestamps, a per-step token budget, FCFS batching.

Issue 15, item 4. An engine-step model of vLLM v1's scheduler (`Scheduler.schedule`: running
requests first, then the waiting queue, one token budget per step, chunked prefill), driving a
cache through two callbacks: `admit(i)` (the lookup, when request i is admitted) and `finish(i)`
(the insertion, when it has computed everything).

- Request i arrives at `arrival_scale` x `Request.ts` seconds (Mooncake: its `timestamp` ms /
  1000; synthetic traces: the generator's arrival times; a scale > 1 stretches the trace, i.e.
  lowers the offered load) and joins one FCFS queue (equal times: trace order).
- A step has a budget of `step_tokens` tokens (vLLM's `max_num_batched_tokens`; default 8,192,
  vLLM 0.33's API-server default on H100/H200, `EngineArgs._set_default_args`). The running
  requests take it first, in admission order: 1 token for a decoding request, the rest of its
  prompt (up to the budget left) for one still prefilling. Then waiting requests are admitted,
  head first, while budget is left and fewer than `max_running` run (vLLM's `max_num_seqs`,
  default 1,024 on H100/H200); each gets a first chunk of its uncached prompt. `admit` may
  refuse (the cache cannot hold the request beside the running ones): the queue then waits,
  head of line, for a request to finish.
- A step computing T tokens lasts `model.step_ms(T)` (the cost model's TTFT line) plus the time
  to restore the hit states of the requests admitted in it (`copy_ms` of the bytes `admit`
  returns).
- A request's first token comes at the end of the step that computes its last prompt token:
  its TTFT = that time - its arrival (queueing, chunking and the other requests' tokens in its
  steps included). It then decodes 1 token per step for output - 1 steps (the last sampled token
  is never computed, as the sequential replays) and finishes at the end of its last step
  (`finish`: the cache insertion); the checkpoint bytes `finish` returns are written before the
  next step (`copy_ms`).
- So a lookup sees exactly the requests that finished before the admission: a turn that arrives
  before its predecessor finishes cannot reuse the predecessor's states.
- `offered_load` = the prefill time of every prompt without a cache (slope x input tokens of
  the TTFT line) / the trace's span of arrivals: above 1 the queue grows whatever the cache.
- Runs of identical decode-only steps (no prefill, no admission, no finish, no arrival) are
  advanced in one jump.

Request i's admission depends only on the requests before it in arrival order (they alone run
or finish before it is admitted), so a cut trace replays its hits as a prefix of the full one;
its TTFT also depends on the requests that share its steps.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable

import numpy as np

from hybrid_cache.sim.cost_model import CostModel
from hybrid_cache.sim.trace import Trace

DEFAULT_STEP_TOKENS = 8192
DEFAULT_MAX_RUNNING = 1024


@dataclasses.dataclass
class ConcurrentResult:
  """Per-request times (ms, trace order) and run counters."""

  ttft_ms: np.ndarray  # first token - arrival
  queue_ms: np.ndarray  # start of the admission step - arrival
  steps: int
  makespan_ms: float  # last finish - first arrival
  max_running_seen: int
  refused_admissions: int  # steps whose head-of-queue request the cache refused
  offered_load: float | None  # module docstring; None when all arrive at once

  def summary(self) -> dict:
    t, q = self.ttft_ms, self.queue_ms
    n = len(t)
    return {
      "replay": "concurrent",
      "ttft_mean_ms": float(t.mean()) if n else 0.0,
      "ttft_p50_ms": float(np.percentile(t, 50)) if n else 0.0,
      "ttft_p95_ms": float(np.percentile(t, 95)) if n else 0.0,
      "ttft_p95_vs_vanilla": None,  # needs a concurrent no-cache replay; not computed
      "queue_mean_ms": float(q.mean()) if n else 0.0,
      "queue_p95_ms": float(np.percentile(q, 95)) if n else 0.0,
      "steps": self.steps,
      "makespan_s": self.makespan_ms / 1e3,
      "max_running_seen": self.max_running_seen,
      "refused_admissions": self.refused_admissions,
      "offered_load": self.offered_load,
    }


def _check(name: str, v, lo: int) -> None:
  if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < lo:
    raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")


def replay_concurrent(
  trace: Trace,
  model: CostModel,
  admit: Callable[[int], tuple[int, int] | None],
  finish: Callable[[int], int],
  copy_ms: Callable[[int], float],
  step_tokens: int = DEFAULT_STEP_TOKENS,
  max_running: int = DEFAULT_MAX_RUNNING,
  arrival_scale: float = 1.0,
) -> ConcurrentResult:
  """Runs the step model of the module docstring.

  Args:
    trace: requests (arrival `ts` in seconds).
    model: the step time (`CostModel.step_ms`).
    admit: admit(i) -> (hit tokens <= input - 1, bytes copied to restore the hit), or None when
      the cache refuses request i now (it stays at the head of the queue). Must not refuse
      when nothing runs.
    finish: finish(i) -> bytes written (new checkpoints) at request i's insertion.
    copy_ms: milliseconds to copy that many bytes.
    step_tokens: token budget per step (>= 1).
    max_running: most requests running at once (>= 1).
    arrival_scale: multiplies every arrival time (> 0, finite).
  """
  _check("step_tokens", step_tokens, 1)
  _check("max_running", max_running, 1)
  if not (isinstance(arrival_scale, int | float) and 0 < arrival_scale < float("inf")):
    raise ValueError(f"arrival_scale must be a finite number > 0, got {arrival_scale!r}")
  reqs = trace.requests
  n = len(reqs)
  arrival = np.array([r.ts * 1e3 * arrival_scale for r in reqs], np.float64)
  span = float(arrival.max() - arrival.min()) if n else 0.0
  work = model.ttft_slope_ms * sum(r.num_input_tokens for r in reqs)
  offered = work / span if span > 0 else None
  order = sorted(range(n), key=lambda i: (arrival[i], i))
  ttft = np.zeros(n, np.float64)
  queue = np.zeros(n, np.float64)
  waiting: collections.deque[int] = collections.deque()
  running: list[list[int]] = []  # [i, prefill tokens left, decode steps left], admission order
  nxt = 0
  t = float(arrival[order[0]]) if n else 0.0
  t0 = t
  steps = refused = max_seen = 0
  while nxt < n or waiting or running:
    while nxt < n and arrival[order[nxt]] <= t:
      waiting.append(order[nxt])
      nxt += 1
    if not running and not waiting:
      t = float(arrival[order[nxt]])
      continue
    budget = step_tokens
    tokens = 0
    prefill = False
    served: list[list[int]] = []
    for e in running:
      if budget == 0:
        break
      c = min(e[1], budget) if e[1] else 1
      prefill = prefill or e[1] > 0
      budget -= c
      tokens += c
      served.append([c, *e])
    restore = 0
    admitted = 0
    while waiting and budget > 0 and len(running) < max_running:
      i = waiting[0]
      got = admit(i)
      if got is None:
        if not running:
          raise ValueError(f"request {i} was refused with nothing running")
        refused += 1
        break
      waiting.popleft()
      hit, copied = got
      r = reqs[i]
      left = r.num_input_tokens - hit
      if not 0 < left <= r.num_input_tokens:
        raise ValueError(f"admit({i}) returned hit {hit} for {r.num_input_tokens} input tokens")
      e = [i, left, max(r.num_output_tokens - 1, 0)]
      running.append(e)
      queue[i] = t - arrival[i]
      restore += copied
      c = min(left, budget)
      budget -= c
      tokens += c
      served.append([c, *e])
      admitted += 1
      prefill = True
    max_seen = max(max_seen, len(running))
    dt = model.step_ms(tokens) + copy_ms(restore)
    t += dt
    steps += 1
    done = []
    by_id = {e[0]: e for e in running}
    for c, i, p_left, _ in served:
      e = by_id[i]
      if p_left:
        e[1] -= c
        if e[1] == 0:
          ttft[i] = t - arrival[i]
          if e[2] == 0:
            done.append(i)
      else:
        e[2] -= 1
        if e[2] == 0:
          done.append(i)
    if done:
      gone = set(done)
      running = [e for e in running if e[0] not in gone]
      written = sum(finish(i) for i in done)
      t += copy_ms(written)
      continue
    if not prefill and not admitted and len(served) == len(running) and running:
      # identical decode-only steps until a finish or (queue empty) an arrival
      m = min(e[2] for e in running) - 1
      if not waiting and nxt < n:
        m = min(m, max(int(np.ceil((arrival[order[nxt]] - t) / dt)), 0))
      if m > 0:
        for e in running:
          e[2] -= m
        t += m * dt
        steps += m
  return ConcurrentResult(ttft, queue, steps, t - t0, max_seen, refused, offered)


__all__ = [
  "DEFAULT_MAX_RUNNING",
  "DEFAULT_STEP_TOKENS",
  "ConcurrentResult",
  "replay_concurrent",
]
