"""Request traces: Marconi's token JSONL and Mooncake's block-hash JSONL, as symbol sequences.

A request's tokens are held as *symbols*: `seq` is int64[n] and `cum` is int64[n + 1] with
`cum[i]` = tokens before symbol i (`cum[0] = 0`, `cum[-1]` = input + output tokens). Token
traces use one symbol per token (`cum` = arange). Mooncake traces use one symbol per run of
tokens whose content is fixed by a hash id, with the token-level expansion

  token(hash id h, offset o) = h * 512 + o          (o in [0, 512))
  output tokens of request i = fresh, contiguous, above every input token

so two Mooncake sequences diverge (token by token) only at symbol boundaries: different hash ids
start with different tokens. A hash id that appears with several lengths (a partial last block)
is cut at every such length, so this stays exact. `expand_tokens` writes the token-level form;
a token-level simulator fed with it sees exactly what the symbol-level one sees.

Loaders raise ValueError naming the file, the 1-based line number and the field on bad input.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from collections.abc import Sequence

import numpy as np

MOONCAKE_BLOCK = 512
_INT64_MAX = 2**63 - 1


@dataclasses.dataclass(frozen=True, eq=False)
class Request:
  """One request of a trace (symbols of input + output, see module docstring).

  seq: int64[n] symbols of input then output; the input is seq[:num_input_symbols].
  cum: int64[n + 1] cumulative tokens; cum[num_input_symbols] == num_input_tokens.
  """

  seq: np.ndarray
  cum: np.ndarray
  num_input_symbols: int
  num_input_tokens: int
  num_output_tokens: int
  session_id: int | str = 0
  turn_id: int = 0
  ts: float = 0.0

  @property
  def num_tokens(self) -> int:
    return self.num_input_tokens + self.num_output_tokens


@dataclasses.dataclass(frozen=True, eq=False)
class Trace:
  """A list of requests in replay order; `kind` is "tokens" or "mooncake"."""

  requests: tuple[Request, ...]
  kind: str = "tokens"
  name: str = ""

  def __len__(self) -> int:
    return len(self.requests)

  @property
  def input_tokens(self) -> int:
    return sum(r.num_input_tokens for r in self.requests)

  def head(self, n: int) -> Trace:
    return Trace(self.requests[:n], self.kind, self.name)


def token_request(
  input_tokens: Sequence[int],
  output_tokens: Sequence[int],
  *,
  session_id: int | str = 0,
  turn_id: int = 0,
  ts: float = 0.0,
) -> Request:
  """A request with one symbol per token."""
  seq = np.concatenate(
    [
      np.asarray(input_tokens, np.int64).reshape(-1),
      np.asarray(output_tokens, np.int64).reshape(-1),
    ]
  )
  n_in = len(input_tokens)
  return Request(
    seq=seq,
    cum=np.arange(len(seq) + 1, dtype=np.int64),
    num_input_symbols=n_in,
    num_input_tokens=n_in,
    num_output_tokens=len(seq) - n_in,
    session_id=session_id,
    turn_id=turn_id,
    ts=float(ts),
  )


def _bad(path: str, lineno: int, msg: str) -> ValueError:
  return ValueError(f"{path}:{lineno}: {msg}")


def _int_list(path: str, lineno: int, obj: dict, field: str) -> list[int]:
  v = obj.get(field)
  if not isinstance(v, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in v):
    raise _bad(path, lineno, f"field {field!r} must be a list of integers, got {type(v).__name__}")
  if v and min(v) < 0:
    raise _bad(path, lineno, f"field {field!r} must contain integers >= 0, got {min(v)}")
  if v and max(v) > _INT64_MAX:
    raise _bad(path, lineno, f"field {field!r} must contain integers < 2**63, got {max(v)}")
  return v


def _nonneg_int(path: str, lineno: int, obj: dict, field: str) -> int:
  v = obj.get(field)
  if isinstance(v, bool) or not isinstance(v, int) or v < 0:
    raise _bad(path, lineno, f"field {field!r} must be an integer >= 0, got {v!r}")
  return v


def _json_lines(path: str | os.PathLike) -> Iterable[tuple[int, dict]]:
  path = os.fspath(path)
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise _bad(path, lineno, f"malformed JSON at column {e.colno} ({e.msg})") from None
      if not isinstance(obj, dict):
        raise _bad(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
      yield lineno, obj


def load_marconi(path: str | os.PathLike, *, limit: int | None = None) -> Trace:
  """Loads Marconi's JSONL: input_tokens, output_tokens (+ session_id, turn_id, ts)."""
  reqs = []
  p = os.fspath(path)
  for lineno, obj in _json_lines(p):
    if limit is not None and len(reqs) >= limit:
      break
    inp = _int_list(p, lineno, obj, "input_tokens")
    out = _int_list(p, lineno, obj, "output_tokens") if "output_tokens" in obj else []
    for field, got in (("num_input_tokens", len(inp)), ("num_output_tokens", len(out))):
      if field in obj and obj[field] != got:
        raise _bad(p, lineno, f"field {field!r} is {obj[field]!r} but the token list has {got}")
    ts = obj.get("ts", 0.0)
    if isinstance(ts, bool) or not isinstance(ts, int | float):
      raise _bad(p, lineno, f"field 'ts' must be a number, got {ts!r}")
    turn_id = obj.get("turn_id", 0)
    try:
      turn_id = int(turn_id)
    except (TypeError, ValueError, OverflowError):
      raise _bad(p, lineno, f"field 'turn_id' must be an integer, got {turn_id!r}") from None
    reqs.append(
      token_request(
        inp,
        out,
        session_id=obj.get("session_id", len(reqs)),
        turn_id=turn_id,
        ts=ts,
      )
    )
  return Trace(tuple(reqs), "tokens", os.path.basename(p))


@dataclasses.dataclass(frozen=True)
class MooncakeRow:
  timestamp: float
  input_length: int
  output_length: int
  hash_ids: tuple[int, ...]


def read_mooncake_rows(
  path: str | os.PathLike, *, limit: int | None = None, max_input: int | None = None
) -> list[MooncakeRow]:
  """Parses and validates Mooncake rows (len(hash_ids) == ceil(input_length / 512))."""
  p = os.fspath(path)
  rows = []
  for lineno, obj in _json_lines(p):
    if limit is not None and len(rows) >= limit:
      break
    n_in = _nonneg_int(p, lineno, obj, "input_length")
    n_out = _nonneg_int(p, lineno, obj, "output_length")
    ids = _int_list(p, lineno, obj, "hash_ids")
    if n_in < 1:
      raise _bad(p, lineno, f"field 'input_length' must be >= 1, got {n_in}")
    need = -(-n_in // MOONCAKE_BLOCK)
    if len(ids) != need:
      raise _bad(
        p, lineno, f"field 'hash_ids' has {len(ids)} ids, expected ceil({n_in}/512) = {need}"
      )
    ts = obj.get("timestamp", 0)
    if isinstance(ts, bool) or not isinstance(ts, int | float):
      raise _bad(p, lineno, f"field 'timestamp' must be a number, got {ts!r}")
    if max_input is not None and n_in > max_input:
      continue
    rows.append(MooncakeRow(float(ts), n_in, n_out, tuple(ids)))
  return rows


def mooncake_trace(rows: Sequence[MooncakeRow], name: str = "") -> Trace:
  """Builds the symbol form of Mooncake rows (see module docstring)."""
  cuts: dict[int, set[int]] = {}
  for r in rows:
    last = r.input_length - MOONCAKE_BLOCK * (len(r.hash_ids) - 1)
    for h in r.hash_ids[:-1]:
      cuts.setdefault(h, set()).add(MOONCAKE_BLOCK)
    cuts.setdefault(r.hash_ids[-1], set()).add(last)
  sorted_cuts = {h: sorted(c | {MOONCAKE_BLOCK}) for h, c in cuts.items()}
  out_base = (max(cuts) + 1) * MOONCAKE_BLOCK if cuts else 0
  reqs = []
  for i, r in enumerate(rows):
    syms, cum = [], [0]
    n = len(r.hash_ids)
    for j, h in enumerate(r.hash_ids):
      blen = MOONCAKE_BLOCK if j < n - 1 else r.input_length - MOONCAKE_BLOCK * (n - 1)
      start = 0
      for c in sorted_cuts[h]:
        if c > blen:
          break
        syms.append(h * MOONCAKE_BLOCK + start)
        cum.append(cum[-1] + c - start)
        start = c
    n_in_syms = len(syms)
    if r.output_length:
      syms.append(out_base)
      cum.append(cum[-1] + r.output_length)
      out_base += r.output_length
    reqs.append(
      Request(
        seq=np.asarray(syms, np.int64),
        cum=np.asarray(cum, np.int64),
        num_input_symbols=n_in_syms,
        num_input_tokens=r.input_length,
        num_output_tokens=r.output_length,
        session_id=i,
        turn_id=0,
        ts=r.timestamp / 1000.0,
      )
    )
  return Trace(tuple(reqs), "mooncake", name)


def load_mooncake(
  path: str | os.PathLike, *, limit: int | None = None, max_input: int | None = None
) -> Trace:
  """Loads a Mooncake block-hash trace (optionally the first `limit` rows <= `max_input`)."""
  rows = read_mooncake_rows(path, limit=limit, max_input=max_input)
  return mooncake_trace(rows, os.path.basename(os.fspath(path)))


def expand_tokens(req: Request) -> tuple[np.ndarray, np.ndarray]:
  """Token-level (input, output) of a request: symbol s of width w -> s, s+1, ..., s+w-1.

  For token traces this is the identity; for Mooncake traces it is the expansion of the
  module docstring (the symbol id is the symbol's first token).
  """
  widths = np.diff(req.cum)
  starts = np.repeat(req.seq - req.cum[:-1], widths)
  toks = starts + np.arange(req.cum[-1], dtype=np.int64)
  return toks[: req.num_input_tokens], toks[req.num_input_tokens :]


def tokens_trace(trace: Trace) -> Trace:
  """The token-level form of a trace (one symbol per token)."""
  reqs = []
  for r in trace.requests:
    i, o = expand_tokens(r)
    reqs.append(token_request(i, o, session_id=r.session_id, turn_id=r.turn_id, ts=r.ts))
  return Trace(tuple(reqs), "tokens", trace.name)


def write_marconi(trace: Trace, path: str | os.PathLike) -> None:
  """Writes Marconi's JSONL (token level) atomically (temp file + rename)."""
  path = os.fspath(path)
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      for r in trace.requests:
        i, o = expand_tokens(r)
        rec = {
          "session_id": r.session_id,
          "turn_id": r.turn_id,
          "ts": r.ts,
          "num_input_tokens": int(len(i)),
          "num_output_tokens": int(len(o)),
          "input_tokens": i.tolist(),
          "output_tokens": o.tolist(),
        }
        f.write(json.dumps(rec) + "\n")
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def load(path: str | os.PathLike, fmt: str, **kw) -> Trace:
  """Loads a trace file in format "marconi" or "mooncake"."""
  if fmt == "marconi":
    return load_marconi(path, limit=kw.get("limit"))
  if fmt == "mooncake":
    return load_mooncake(path, limit=kw.get("limit"), max_input=kw.get("max_input"))
  raise ValueError(f"format must be one of ('marconi', 'mooncake'), got {fmt!r}")


__all__ = [
  "MOONCAKE_BLOCK",
  "Request",
  "Trace",
  "expand_tokens",
  "load",
  "load_marconi",
  "load_mooncake",
  "mooncake_trace",
  "read_mooncake_rows",
  "token_request",
  "tokens_trace",
  "write_marconi",
]
