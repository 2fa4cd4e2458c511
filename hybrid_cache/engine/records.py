"""The engine's records: what a request returns, the engine's totals, a request's state.

`RequestOutput` is what `Engine.run` / `Engine.step` hand back (one per finished request),
`EngineStats` the engine's counters and step timings (`Engine.stats`), `RequestState` the
engine's mutable record of one queued or running request (its tokens so far, how far the model
has computed it, speculative-decoding bookkeeping; `RequestState.output_record` makes its
`RequestOutput`). `check_request` holds `Engine.add_request`'s input rules. Plain dataclasses;
no device arrays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from hybrid_cache.hashing import RequestExtras


@dataclasses.dataclass
class RequestOutput:
  """A request's result.

  Attributes:
    request_id: the id `add_request` returned.
    prompt_tokens: the prompt.
    output_tokens: greedy tokens generated (len == max_new_tokens when finished).
    logits: f32[len(output_tokens), vocab], the logits each token was sampled from (only
      when requested).
    num_cached_tokens: prefix-cache hit at the first admission (vLLM's num_cached_tokens).
    num_prefill_tokens_computed: prompt (and recompute) tokens the model computed for it.
    num_preemptions: times it was preempted (recompute).
    ttft_s: seconds from `add_request` to the first output token.
    latency_s: seconds from `add_request` to the last output token.
    finished: all max_new_tokens were generated.
    error: why the request was dropped (e.g. it can never fit in the pool), else None.
    num_draft_tokens / num_accepted_tokens: speculative drafts verified / accepted for it.
    arrival_step / first_token_step: index of the first engine step that could schedule it
      and of the step that produced its first token (`EngineStats.steps` numbering, since the
      last `reset_stats`); with `EngineStats.step_tokens` they give its TTFT in tokens
      computed, the time an engine whose step costs its tokens would take.
  """

  request_id: str
  prompt_tokens: list[int]
  output_tokens: list[int]
  logits: np.ndarray | None
  num_cached_tokens: int
  num_prefill_tokens_computed: int
  num_preemptions: int
  ttft_s: float | None
  latency_s: float | None
  finished: bool
  error: str | None = None
  num_draft_tokens: int = 0
  num_accepted_tokens: int = 0
  arrival_step: int | None = None
  first_token_step: int | None = None


@dataclasses.dataclass
class EngineStats:
  """Engine totals since construction (or the last `reset_stats`)."""

  steps: int = 0
  prefill_tokens_computed: int = 0
  decode_tokens: int = 0
  cached_tokens: int = 0  # sum of prefix hits over all admissions (re-admissions included)
  prompt_tokens: int = 0
  output_tokens: int = 0
  preemptions: int = 0
  state_copies: int = 0  # recurrent state copies and KV page copies executed
  kv_page_copies: int = 0  # of which KV page copies (partial hits' copy-on-write, vLLM §2.5)
  draft_tokens: int = 0  # drafts verified (speculative decoding)
  accepted_tokens: int = 0  # drafts accepted
  verify_windows: int = 0  # verify windows run (one per decoding request and step)
  # one-token chunks of mixed steps run through the decode kernels (`decode_split`)
  mixed_step_decodes: int = 0
  # Where a step's time goes (host seconds; `forward_s` waits for the device's results):
  # schedule_s = intake + the cache core's schedule call; model_s = everything after it, of
  # which prepare_s = building the step's inputs and copy plans, forward_s = the jitted model
  # step until its tokens / logits are on the host, commit_s = appending tokens and finishing
  # requests. The engine's own (non-model) part of a step is wall_s - forward_s.
  schedule_s: float = 0.0
  model_s: float = 0.0
  prepare_s: float = 0.0
  forward_s: float = 0.0
  commit_s: float = 0.0
  wall_s: float = 0.0
  # tokens the model computed in each step (prefill, decode and verify-window tokens)
  step_tokens: list[int] = dataclasses.field(default_factory=list)

  def as_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@dataclasses.dataclass
class RequestState:
  """A queued or running request as the engine tracks it (see the module docstring)."""

  rid: str
  prompt: list[int]
  max_new_tokens: int
  return_logits: bool
  extras: RequestExtras | None
  arrival: float
  output: list[int] = dataclasses.field(default_factory=list)
  logits: list[np.ndarray] = dataclasses.field(default_factory=list)
  in_manager: bool = False
  running: bool = False
  num_computed: int = 0
  num_cached: int | None = None
  prefill_computed: int = 0
  preemptions: int = 0
  first_token_time: float | None = None
  last_token_time: float | None = None
  arrival_step: int = 0
  first_token_step: int | None = None
  error: str | None = None
  # speculative decoding: private pool id (KV page + carried recurrent state), whether the
  # carry slot holds the state after num_computed tokens, the block column whose K/V sits in
  # the private page, drafts verified / accepted.
  private: int | None = None
  carry_valid: bool = False
  scratch_col: int | None = None
  drafted: int = 0
  accepted: int = 0

  @property
  def num_tokens(self) -> int:
    return len(self.prompt) + len(self.output)

  @property
  def done(self) -> bool:
    return len(self.output) >= self.max_new_tokens or self.error is not None

  def output_record(self) -> RequestOutput:
    """The request's `RequestOutput` as it stands (when it finished or was dropped)."""
    return RequestOutput(
      request_id=self.rid,
      prompt_tokens=self.prompt,
      output_tokens=list(self.output),
      logits=np.stack(self.logits) if self.return_logits and self.logits else None,
      num_cached_tokens=self.num_cached or 0,
      num_prefill_tokens_computed=self.prefill_computed,
      num_preemptions=self.preemptions,
      ttft_s=None if self.first_token_time is None else self.first_token_time - self.arrival,
      latency_s=None if self.last_token_time is None else self.last_token_time - self.arrival,
      finished=self.error is None and len(self.output) >= self.max_new_tokens,
      error=self.error,
      num_draft_tokens=self.drafted,
      num_accepted_tokens=self.accepted,
      arrival_step=self.arrival_step,
      first_token_step=self.first_token_step,
    )


def check_request(
  tokens: Sequence[int], max_new_tokens: int, vocab: int, max_model_len: int
) -> list[int]:
  """A request's prompt as a list of ints; ValueError naming the rule it breaks.

  Rules (`Engine.add_request`): tokens are ints in [0, vocab), 1 <= len(tokens);
  max_new_tokens >= 1; len(tokens) + max_new_tokens <= max_model_len (never truncated).
  """
  try:
    toks = [int(t) for t in tokens]
    if any(int(t) != t for t in tokens):
      raise TypeError
  except (TypeError, ValueError):
    raise ValueError(f"tokens must be a sequence of integers, got {tokens!r:.80}") from None
  if not toks:
    raise ValueError("tokens must hold at least 1 token, got 0")
  bad = [t for t in toks if not 0 <= t < vocab]
  if bad:
    raise ValueError(f"tokens must be in [0, vocab_size={vocab}), got {bad[0]}")
  if len(toks) > max_model_len:
    raise ValueError(
      f"tokens has {len(toks)} tokens; the prompt must be <= max_model_len={max_model_len}"
    )
  if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int | np.integer):
    raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
  if len(toks) + max_new_tokens > max_model_len:
    raise ValueError(
      f"max_new_tokens={max_new_tokens} with a {len(toks)}-token prompt exceeds "
      f"max_model_len={max_model_len}; must be <= {max_model_len - len(toks)}"
    )
  return toks
