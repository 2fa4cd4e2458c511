"""Synthetic generators are seeded, reproducible and have their advertised structure."""

import pytest

from hybrid_cache.sim import synthetic

SMALL = {
  "chat": dict(num_sessions=4, min_turns=3, max_turns=4),
  "agent": dict(num_sessions=2, min_turns=8, max_turns=8, obs_mean=50, sys_prompt_len=30),
  "shared_prefix": dict(num_requests=30, prefix_mean=50),
  "doc_qa": dict(num_docs=3, doc_mean=200),
  "self_consistency": dict(num_prompts=3, n=4),
  "rl_rollouts": dict(num_prompts=2, group=3, steps=2),
  "agentic": dict(num_sessions=3, sys_prompt_len=100, obs_mean=40.0, max_turns=6),
}


def _toks(tr):
  return [(r.seq.tolist(), r.num_input_symbols, r.ts) for r in tr.requests]


@pytest.mark.parametrize("kind", synthetic.KINDS)
def test_seeded_and_reproducible(kind):
  a = synthetic.generate(kind, seed=3, **SMALL[kind])
  b = synthetic.generate(kind, seed=3, **SMALL[kind])
  c = synthetic.generate(kind, seed=4, **SMALL[kind])
  assert len(a) > 0 and _toks(a) == _toks(b) and _toks(a) != _toks(c)
  ts = [r.ts for r in a.requests]
  assert ts == sorted(ts)


def test_chat_appends_previous_turn():
  tr = synthetic.generate("chat", seed=1, num_sessions=1, min_turns=3, max_turns=3)
  r0, r1 = tr.requests[0], tr.requests[1]
  assert r1.seq[: len(r0.seq)].tolist() == r0.seq.tolist()  # input(t) = input + output + user


def test_agent_collapses_history():
  tr = synthetic.generate("agent", seed=1, **SMALL["agent"], keep_last=2)
  s0 = [r for r in tr.requests if r.session_id == 0]
  late, nxt = s0[4], s0[5]
  common = 0
  for x, y in zip(late.seq.tolist(), nxt.seq.tolist()):
    if x != y:
      break
    common += 1
  assert 30 <= common < late.num_input_tokens  # shares the system prompt, not the full input


def test_self_consistency_repeats_prompt():
  tr = synthetic.generate("self_consistency", seed=0, num_prompts=1, n=3)
  ins = {tuple(r.seq[: r.num_input_symbols].tolist()) for r in tr.requests}
  assert len(tr) == 3 and len(ins) == 1


def test_unknown_kind_and_param():
  with pytest.raises(ValueError, match="kind"):
    synthetic.generate("nope")
  with pytest.raises(ValueError, match="parameters"):
    synthetic.generate("chat", bogus=1)


def _lcp(a, b):
  n = 0
  for x, y in zip(a.tolist(), b.tolist()):
    if x != y:
      break
    n += 1
  return n


def test_agentic_shares_prompts_compacts_history_and_fans_out():
  tr = synthetic.generate(
    "agentic",
    seed=2,
    num_sessions=6,
    num_sys_prompts=2,
    sys_prompt_len=100,
    obs_mean=300.0,
    min_turns=12,
    max_turns=12,
    history_budget=1500,
    p_fanout=0.3,
  )
  by = {}
  for r in tr.requests:
    by.setdefault(r.session_id, []).append(r)
  # sessions share a system prompt (>= 50 tokens: lengths are 0.5-1.5x the mean)
  firsts = [v[0] for v in by.values()]
  assert max(_lcp(a.seq, b.seq) for a in firsts for b in firsts if a is not b) >= 50
  compactions = fanouts = 0
  for reqs in by.values():
    for a, b in zip(reqs, reqs[1:]):
      if b.turn_id == a.turn_id:  # fan-out: same input, another output
        fanouts += 1
        assert b.seq[: b.num_input_symbols].tolist() == a.seq[: a.num_input_symbols].tolist()
      elif _lcp(a.seq, b.seq) < a.num_input_tokens:  # compaction: only prompt + task shared
        compactions += 1
  assert fanouts > 0 and compactions > 0
