"""Draft proposers for the engine's speculative decoding (`hybrid_cache.engine.spec`).

A drafter proposes up to k tokens that may follow a request's tokens; the target model then
verifies them in one forward (greedy acceptance). Drafters here run on the host over token
ids only: they never read the target's hidden states (so the EAGLE cache rules do not apply,
vLLM's non-EAGLE speculators such as `ngram` and `suffix`) and never touch the target's KV
pages or recurrent state pools.

Choice (issue 16, "acceptance substantial by construction"): `NgramDrafter` is prompt lookup
(vLLM's `ngram` method) over the request's own tokens, extended with a history of finished
sequences (the idea of vLLM's `suffix` decoding: match against earlier requests' prompts and
outputs). Greedy decoding is deterministic, so whenever a context recurs (a chat question
asked again, a regenerated answer, a conversation that replays an earlier one) the earlier
continuation is exactly the target's greedy continuation and every drafted token is
accepted; on fresh contexts a random-weight model rarely repeats an n-gram of length >=
`min_ngram`, so the drafter proposes nothing (no wasted verify work). Self-speculation (the
target's first layers with its shared head) was measured and rejected: on the tiny random
presets the first L-1 layers agree with the full model on 20-60% of greedy tokens, and the
drafter would need recurrent states of its own per request.

Example::

  d = NgramDrafter(vocab_size=256, min_ngram=3, max_ngram=8)
  d.record(prompt + outputs)            # a finished sequence enters the history
  d.propose(new_prompt, 4)              # up to 4 tokens that followed the same n-gram before
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Drafter(Protocol):
  """What the engine needs from a drafter.

  Attributes:
    vocab_size: every proposed token is in [0, vocab_size); must equal the target's.
  """

  vocab_size: int

  def propose(self, tokens: Sequence[int], k: int) -> list[int]:
    """Up to `k` tokens that may follow `tokens` (the request's prompt + outputs so far)."""

  def record(self, tokens: Sequence[int]) -> None:
    """Called with prompt + outputs of every request that finished (may ignore them)."""


def _check_int(field: str, value, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ValueError(f"{field} must be an integer >= {minimum}, got {value!r}")


class NgramDrafter:
  """Prompt lookup over the request's tokens and a history of finished sequences.

  `propose(tokens, k)`: the longest suffix of `tokens` (between `min_ngram` and `max_ngram`
  tokens) that occurred before, in `tokens` itself (vLLM `ngram`: the occurrence must end
  before the last token) or in a recorded sequence; ties go to `tokens` itself, then to the
  newest occurrence. Proposes the (up to) k tokens that followed it; no match: [].

  Args:
    vocab_size: the target's vocabulary (the engine checks that it matches).
    min_ngram / max_ngram: matched suffix lengths, 1 <= min_ngram <= max_ngram.
    max_history: most finished sequences kept (oldest dropped first); 0 = prompt lookup only.
  """

  def __init__(
    self, vocab_size: int, *, min_ngram: int = 3, max_ngram: int = 8, max_history: int = 256
  ):
    _check_int("vocab_size", vocab_size, 1)
    _check_int("min_ngram", min_ngram, 1)
    _check_int("max_ngram", max_ngram, min_ngram)
    _check_int("max_history", max_history, 0)
    self.vocab_size = vocab_size
    self.min_ngram, self.max_ngram, self.max_history = min_ngram, max_ngram, max_history
    self._history: list[tuple[int, ...]] = []
    self._first = 0  # history index of self._history[0]
    # last min_ngram tokens -> [(history index, end position)], oldest first
    self._index: dict[tuple[int, ...], list[tuple[int, int]]] = {}

  def record(self, tokens: Sequence[int]) -> None:
    if self.max_history == 0:
      return
    seq = tuple(int(t) for t in tokens)
    idx = self._first + len(self._history)
    self._history.append(seq)
    m = self.min_ngram
    for end in range(m - 1, len(seq) - 1):
      self._index.setdefault(seq[end - m + 1 : end + 1], []).append((idx, end))
    if len(self._history) > self.max_history:
      self._history.pop(0)
      self._first += 1
      for key in list(self._index):
        kept = [e for e in self._index[key] if e[0] >= self._first]
        if kept:
          self._index[key] = kept
        else:
          del self._index[key]

  def _length(self, seq: Sequence[int], end: int, toks: Sequence[int]) -> int:
    """Length of the common suffix of seq[: end + 1] and toks, capped at max_ngram."""
    n = 0
    while n < self.max_ngram and n <= end and n < len(toks) and seq[end - n] == toks[-1 - n]:
      n += 1
    return n

  def propose(self, tokens: Sequence[int], k: int) -> list[int]:
    toks = [int(t) for t in tokens]
    m = self.min_ngram
    if k < 1 or len(toks) < m:
      return []
    best_len, best = m - 1, []
    for end in range(len(toks) - 2, m - 2, -1):
      n = self._length(toks, end, toks)
      if n > best_len:
        best_len, best = n, toks[end + 1 : end + 1 + k]
    for idx, end in reversed(self._index.get(tuple(toks[-m:]), [])):
      seq = self._history[idx - self._first]
      n = self._length(seq, end, toks)
      if n > best_len:
        best_len, best = n, list(seq[end + 1 : end + 1 + k])
    return best
