"""Trace loaders: Marconi JSONL, Mooncake block hashes, malformed input, symbol expansion."""

import json
import pathlib

import numpy as np
import pytest

from hybrid_cache.sim import trace as T

MOONCAKE = str(
  pathlib.Path(__file__).resolve().parents[3]
  / "experiments"
  / "traces"
  / "mooncake_conversation_trace.jsonl"
)


def _write(path, rows):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return path


def test_marconi_roundtrip(tmp_path):
  p = _write(
    tmp_path / "t.jsonl",
    [
      {"session_id": 0, "turn_id": 0, "ts": 0, "input_tokens": [5, 6, 7], "output_tokens": [8]},
      {"session_id": 0, "turn_id": 1, "ts": 1.5, "input_tokens": [5, 6, 7, 8, 9]},
    ],
  )
  tr = T.load_marconi(p)
  assert len(tr) == 2 and tr.input_tokens == 8
  r = tr.requests[1]
  assert r.num_output_tokens == 0 and r.ts == 1.5 and r.turn_id == 1
  T.write_marconi(tr, tmp_path / "u.jsonl")
  again = T.load_marconi(tmp_path / "u.jsonl")
  for a, b in zip(tr.requests, again.requests):
    assert a.seq.tolist() == b.seq.tolist() and a.num_input_tokens == b.num_input_tokens


@pytest.mark.parametrize(
  "bad, needle",
  [
    ("{not json", "malformed JSON"),
    ('{"input_tokens": [1, "x"]}', "'input_tokens'"),
    ('{"output_tokens": [1]}', "'input_tokens'"),
    ('{"input_tokens": [1, -2]}', ">= 0"),
    ('{"input_tokens": [1], "num_input_tokens": 3}', "num_input_tokens"),
    ("[1, 2]", "JSON object"),
  ],
)
def test_marconi_malformed_line_number(tmp_path, bad, needle):
  p = _write(tmp_path / "t.jsonl", [{"input_tokens": [1], "output_tokens": []}, "", bad])
  with pytest.raises(ValueError, match=r"t\.jsonl:3: .*" + needle.replace("(", r"\(")):
    T.load_marconi(p)


@pytest.mark.parametrize(
  "bad, needle",
  [
    ({"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}, "ceil"),
    ({"timestamp": 0, "input_length": -1, "output_length": 1, "hash_ids": []}, "input_length"),
    ({"timestamp": 0, "input_length": 5, "hash_ids": [1]}, "output_length"),
    ({"timestamp": "x", "input_length": 5, "output_length": 1, "hash_ids": [1]}, "timestamp"),
  ],
)
def test_mooncake_malformed_line_number(tmp_path, bad, needle):
  good = {"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}
  p = _write(tmp_path / "m.jsonl", [good, bad])
  with pytest.raises(ValueError, match=r"m\.jsonl:2: .*" + needle):
    T.load_mooncake(p)


def test_mooncake_symbols_and_expansion():
  tr = T.load_mooncake(MOONCAKE, limit=3)
  r0 = tr.requests[0]  # 6758 input tokens: 13 full blocks + 102, then 500 output tokens
  assert r0.num_input_tokens == 6758 and r0.num_output_tokens == 500
  assert r0.num_input_symbols == 14 and r0.cum[14] == 6758 and r0.cum[-1] == 7258
  assert r0.seq[:3].tolist() == [0, 512, 1024]  # symbol = first token = hash_id * 512
  inp, out = T.expand_tokens(r0)
  assert inp[:3].tolist() == [0, 1, 2] and inp[512] == 512 and len(out) == 500
  assert out.min() > T.expand_tokens(tr.requests[2])[0].max()  # outputs above every input
  # outputs of different requests never overlap
  o1 = T.expand_tokens(tr.requests[1])[1]
  assert set(out.tolist()).isdisjoint(o1.tolist())


def test_mooncake_partial_block_cut(tmp_path):
  # hash id 7 appears as a 100-token last block and as a full block: it is cut at 100.
  rows = [
    {"timestamp": 0, "input_length": 612, "output_length": 2, "hash_ids": [3, 7]},
    {"timestamp": 1, "input_length": 1124, "output_length": 2, "hash_ids": [3, 7, 9]},
  ]
  tr = T.load_mooncake(_write(tmp_path / "m.jsonl", rows))
  a, b = tr.requests
  assert a.seq[: a.num_input_symbols].tolist() == [3 * 512, 7 * 512]
  assert b.seq[: b.num_input_symbols].tolist() == [3 * 512, 7 * 512, 7 * 512 + 100, 9 * 512]
  assert np.diff(b.cum).tolist()[:4] == [512, 100, 412, 100]
  ta, tb = (T.expand_tokens(r)[0] for r in (a, b))
  assert tb[:612].tolist() == ta.tolist()


def test_load_unknown_format():
  with pytest.raises(ValueError, match="format"):
    T.load(MOONCAKE, "csv")
