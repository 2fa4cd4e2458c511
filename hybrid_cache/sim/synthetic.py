"""Seeded synthetic workloads as token traces (same seed and arguments -> identical trace).

Every generator returns a `Trace` of token requests sorted by arrival time (ties keep generation
order). Token ids are drawn uniformly from [1, vocab); lengths from exponential distributions
with the given means (at least 1). Kinds:
- chat: multi-turn sessions, input(t) = input(t-1) + output(t-1) + user(t) (Marconi's
  ShareGPT/LMSys builder); session i starts at i / sps, the next turn after user / 3 s.
- agent: as chat with a shared system prompt and SWE-agent history collapsing: once a session
  has more than `keep_last` rounds, each older observation is replaced by a short stub, so a new
  input shares only a partial prefix with the previous one.
- shared_prefix: `num_prefixes` system prompts / few-shot blocks, each request = one of them
  (Zipf-ish popularity) + a unique question.
- doc_qa: long documents, several questions per document.
- self_consistency: every prompt is sent `n` times (different outputs).
- rl_rollouts: groups of `group` rollouts of a prompt, `steps` turns each (input of turn t =
  previous input + output + tool/env feedback).
- agentic: tool-using agent sessions (issue 15): `num_sys_prompts` long system prompts (tool
  definitions, Zipf-ish popularity, `sys_prompt_len` tokens each), a user task, then rounds of
  tool call (output) + tool result (`obs_mean`) appended to the history; when the history passes
  `history_budget` tokens the oldest rounds are dropped and replaced by a fresh summary of
  `stub_len` tokens (context compaction, so the next input shares only system prompt + task);
  with probability `p_fanout` a turn is sent `fanout` times (parallel samples / sub-agents;
  only the first continues).
"""

from __future__ import annotations

import numpy as np

from hybrid_cache.sim.trace import Request
from hybrid_cache.sim.trace import Trace
from hybrid_cache.sim.trace import token_request

KINDS = (
  "chat",
  "agent",
  "shared_prefix",
  "doc_qa",
  "self_consistency",
  "rl_rollouts",
  "agentic",
)


class _Gen:
  def __init__(self, seed: int, vocab: int):
    if vocab < 2:
      raise ValueError(f"vocab must be >= 2, got {vocab}")
    self.rng = np.random.default_rng(seed)
    self.vocab = vocab

  def length(self, mean: float) -> int:
    return max(1, int(round(self.rng.exponential(mean))))

  def tokens(self, n: int) -> list[int]:
    return self.rng.integers(1, self.vocab, size=n).tolist()


def _finish(reqs: list[tuple[float, int, Request]], name: str) -> Trace:
  reqs.sort(key=lambda x: (x[0], x[1]))
  return Trace(tuple(r for _, _, r in reqs), "tokens", name)


def chat(
  seed=0,
  num_sessions=100,
  sps=1.0,
  min_turns=10,
  max_turns=20,
  user_mean=100.0,
  out_mean=300.0,
  sys_prompt_len=0,
  max_context=32768,
  vocab=32000,
) -> Trace:
  g = _Gen(seed, vocab)
  sys_prompt = g.tokens(sys_prompt_len)
  reqs = []
  for s in range(num_sessions):
    t = s / sps
    ctx = list(sys_prompt)
    for turn in range(int(g.rng.integers(min_turns, max_turns + 1))):
      user = g.tokens(g.length(user_mean))
      out = g.tokens(g.length(out_mean))
      inp = ctx + user
      if len(inp) + len(out) > max_context:
        break
      reqs.append((t, len(reqs), token_request(inp, out, session_id=s, turn_id=turn, ts=t)))
      ctx = inp + out
      t += len(user) / 3.0
  return _finish(reqs, f"chat_seed{seed}")


def agent(
  seed=0,
  num_sessions=50,
  sps=0.25,
  min_turns=20,
  max_turns=50,
  obs_mean=800.0,
  out_mean=150.0,
  sys_prompt_len=1500,
  keep_last=5,
  stub_len=8,
  max_context=32768,
  vocab=32000,
) -> Trace:
  g = _Gen(seed, vocab)
  sys_prompt = g.tokens(sys_prompt_len)
  reqs = []
  for s in range(num_sessions):
    t = s / sps
    rounds: list[tuple[list[int], list[int]]] = []  # (observation, action)
    for turn in range(int(g.rng.integers(min_turns, max_turns + 1))):
      obs = g.tokens(g.length(obs_mean))
      hist = []
      for k, (o, a) in enumerate(rounds):
        keep = k >= len(rounds) - keep_last
        hist += (o if keep else o[:stub_len]) + a
      inp = sys_prompt + hist + obs
      out = g.tokens(g.length(out_mean))
      if len(inp) + len(out) > max_context:
        break
      reqs.append((t, len(reqs), token_request(inp, out, session_id=s, turn_id=turn, ts=t)))
      rounds.append((obs, out))
      t += float(g.rng.exponential(5.0))
  return _finish(reqs, f"agent_seed{seed}")


def shared_prefix(
  seed=0,
  num_requests=1000,
  num_prefixes=8,
  prefix_mean=2000.0,
  question_mean=100.0,
  out_mean=200.0,
  rate=10.0,
  vocab=32000,
) -> Trace:
  g = _Gen(seed, vocab)
  prefixes = [g.tokens(g.length(prefix_mean)) for _ in range(num_prefixes)]
  w = 1.0 / np.arange(1, num_prefixes + 1)
  w /= w.sum()
  reqs, t = [], 0.0
  for i in range(num_requests):
    p = prefixes[int(g.rng.choice(num_prefixes, p=w))]
    inp = p + g.tokens(g.length(question_mean))
    reqs.append((t, i, token_request(inp, g.tokens(g.length(out_mean)), session_id=i, ts=t)))
    t += float(g.rng.exponential(1.0 / rate))
  return _finish(reqs, f"shared_prefix_seed{seed}")


def doc_qa(
  seed=0,
  num_docs=20,
  doc_mean=8000.0,
  questions_per_doc=5,
  question_mean=50.0,
  out_mean=100.0,
  rate=2.0,
  vocab=32000,
) -> Trace:
  g = _Gen(seed, vocab)
  docs = [g.tokens(g.length(doc_mean)) for _ in range(num_docs)]
  order = [d for d in range(num_docs) for _ in range(questions_per_doc)]
  g.rng.shuffle(order)
  reqs, t = [], 0.0
  for i, d in enumerate(order):
    inp = docs[d] + g.tokens(g.length(question_mean))
    reqs.append((t, i, token_request(inp, g.tokens(g.length(out_mean)), session_id=d, ts=t)))
    t += float(g.rng.exponential(1.0 / rate))
  return _finish(reqs, f"doc_qa_seed{seed}")


def self_consistency(
  seed=0, num_prompts=100, n=8, prompt_mean=500.0, out_mean=300.0, rate=5.0, vocab=32000
) -> Trace:
  g = _Gen(seed, vocab)
  reqs, t = [], 0.0
  for p in range(num_prompts):
    prompt = g.tokens(g.length(prompt_mean))
    for k in range(n):
      out = g.tokens(g.length(out_mean))
      reqs.append((t, len(reqs), token_request(prompt, out, session_id=p, turn_id=k, ts=t)))
    t += float(g.rng.exponential(1.0 / rate))
  return _finish(reqs, f"self_consistency_seed{seed}")


def rl_rollouts(
  seed=0,
  num_prompts=20,
  group=8,
  steps=4,
  prompt_mean=300.0,
  out_mean=200.0,
  feedback_mean=100.0,
  vocab=32000,
) -> Trace:
  g = _Gen(seed, vocab)
  reqs = []
  for p in range(num_prompts):
    prompt = g.tokens(g.length(prompt_mean))
    ctxs = [list(prompt) for _ in range(group)]
    for step in range(steps):
      t = p * steps + step
      for k in range(group):
        out = g.tokens(g.length(out_mean))
        reqs.append(
          (t, len(reqs), token_request(ctxs[k], out, session_id=p * group + k, turn_id=step, ts=t))
        )
        ctxs[k] = ctxs[k] + out + g.tokens(g.length(feedback_mean))
  return _finish(reqs, f"rl_rollouts_seed{seed}")


def agentic(
  seed=0,
  num_sessions=150,
  sps=2.0,
  num_sys_prompts=4,
  sys_prompt_len=6000,
  task_mean=300.0,
  min_turns=5,
  max_turns=30,
  obs_mean=700.0,
  out_mean=120.0,
  history_budget=12000,
  stub_len=200,
  p_fanout=0.1,
  fanout=3,
  vocab=32000,
) -> Trace:
  g = _Gen(seed, vocab)
  prompts = [
    g.tokens(max(1, int(sys_prompt_len * (0.5 + g.rng.random())))) for _ in range(num_sys_prompts)
  ]
  weights = 1.0 / np.arange(1, num_sys_prompts + 1)
  weights /= weights.sum()
  reqs = []
  for s in range(num_sessions):
    t = s / sps
    sys_prompt = prompts[int(g.rng.choice(num_sys_prompts, p=weights))]
    task = g.tokens(g.length(task_mean))
    hist: list[int] = []
    rounds: list[int] = []  # length of each round in hist
    for turn in range(int(g.rng.integers(min_turns, max_turns + 1))):
      if len(hist) > history_budget:
        while rounds and len(hist) > history_budget // 2:
          hist = hist[rounds.pop(0) :]
        hist = g.tokens(stub_len) + hist
        rounds.insert(0, stub_len)
      inp = sys_prompt + task + hist
      copies = fanout if g.rng.random() < p_fanout else 1
      outs = [g.tokens(g.length(out_mean)) for _ in range(copies)]
      for out in outs:
        reqs.append((t, len(reqs), token_request(inp, out, session_id=s, turn_id=turn, ts=t)))
      obs = g.tokens(g.length(obs_mean))
      hist = hist + outs[0] + obs
      rounds.append(len(outs[0]) + len(obs))
      t += float(g.rng.exponential(3.0))
  return _finish(reqs, f"agentic_seed{seed}")


GENERATORS = {
  "chat": chat,
  "agent": agent,
  "shared_prefix": shared_prefix,
  "doc_qa": doc_qa,
  "self_consistency": self_consistency,
  "rl_rollouts": rl_rollouts,
  "agentic": agentic,
}


def generate(kind: str, seed: int = 0, **params) -> Trace:
  """Runs generator `kind` (one of KINDS) with `seed` and keyword parameters."""
  if kind not in GENERATORS:
    raise ValueError(f"synthetic kind must be one of {KINDS}, got {kind!r}")
  try:
    return GENERATORS[kind](seed=seed, **params)
  except TypeError as e:
    raise ValueError(f"bad parameters for synthetic kind {kind!r}: {e}") from None
