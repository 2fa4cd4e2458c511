"""Scenario replay CLI (`shared/reference/scenario_format.md`).

  python -m hybrid_cache.replay SCENARIO.json [more files or dirs] [--out-dir DIR]
      [--compact] [--backend {jax,reference}] [--check]

Replays each scenario's actions through a `CacheManager` and emits, per scenario,
`{"scenario", "description", "config", "results"}`. Inputs ending in `.expected.json` are
skipped when a directory is given. `--check` compares every result with the sibling
`NAME.expected.json` on the compared fields. Exit status: 1 on a mismatch; 2 on bad input, one
`ERROR FILE: ...` line on stderr per bad file (unreadable, malformed JSON with line and column,
bad config, bad action named `actions[i]` and its field), the other files still replayed.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

from hybrid_cache import cli_util
from hybrid_cache import persistent_cache
from hybrid_cache.factory import make_manager
from hybrid_cache.hashing import RequestExtras
from hybrid_cache.replay import scenario as scenario_lib
from hybrid_cache.types import CacheManager
from hybrid_cache.types import EntryResult
from hybrid_cache.types import HitInfo
from hybrid_cache.types import ScheduleEntry

HIT_FIELDS = (
  "hit_tokens",
  "per_group_hit_tokens",
  "hit_blocks_per_group",
  "shared_prefix_boundary",
)
POOL_FIELDS = (
  "num_free_blocks",
  "num_used_blocks",
  "num_free_cached_blocks",
  "cached_blocks_per_group",
)
# Fields compared by --check (semantic + layout, scenario_format.md).
TOP_COMPARED = (
  "op",
  "num_tokens",
  "ok",
  "chunks",
  "num_computed_tokens",
  *HIT_FIELDS,
  *POOL_FIELDS,
  "block_ids",
  "num_real_blocks",
)
ENTRY_COMPARED = ("req", *HIT_FIELDS, "scheduled_tokens", "num_computed_tokens", "new_block_ids")
ACTIVE_COMPARED = ("num_computed_tokens", "num_tokens", "block_ids", "num_real_blocks")


def default_backend() -> str:
  try:
    from hybrid_cache.manager import JaxCacheManager  # noqa: F401
  except Exception:  # noqa: BLE001 - any import failure means "not available yet"
    return "reference"
  return "jax"


def _hit_dict(hit: HitInfo) -> dict[str, Any]:
  return {
    "hit_tokens": hit.hit_tokens,
    "per_group_hit_tokens": list(hit.per_group_hit_tokens),
    "hit_blocks_per_group": list(hit.hit_blocks_per_group),
    "shared_prefix_boundary": hit.shared_prefix_boundary,
  }


def _entry_dict(e: EntryResult) -> dict[str, Any]:
  d: dict[str, Any] = {"req": e.req, "admission": e.admission}
  if e.hit is not None:
    d.update(_hit_dict(e.hit))
  d["scheduled_tokens"] = e.scheduled_tokens
  if e.scheduled_tokens == 0:
    d["reason"] = e.reason
  else:
    d["new_block_ids"] = [list(r) for r in e.new_block_ids]
  d["num_computed_tokens"] = e.num_computed_tokens
  return d


def _extras(action: Mapping[str, Any]) -> RequestExtras | None:
  if "cache_salt" in action or "lora_name" in action:
    return RequestExtras(lora_name=action.get("lora_name"), cache_salt=action.get("cache_salt"))
  return None


def _check_fields(where: str, a: Mapping[str, Any]) -> None:
  """ValueError naming `where.field` when an action's (or entry's) optional field has a bad type."""
  for key in ("req", "cache_salt", "lora_name"):
    v = a.get(key)
    if v is not None and not isinstance(v, str):
      raise ValueError(f"{where}.{key} must be a string, got {v!r}")
  chunk = a.get("chunk")
  if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
    raise ValueError(f"{where}.chunk must be null or an integer >= 1, got {chunk!r}")


# Errors a malformed action can raise inside the manager (bad values reach it unchecked).
_ACTION_ERRORS = (ValueError, KeyError, TypeError, AttributeError, IndexError, OverflowError)


class Replayer:
  """Drives one manager through one scenario's actions."""

  def __init__(self, manager: CacheManager, sc: Mapping[str, Any]):
    self.m = manager
    self.sc = sc
    self.prompts = sc.get("prompts", {})
    self.tokens: dict[str, list[int]] = {}
    self.extras: dict[str, RequestExtras | None] = {}

  # ---- helpers ----
  def _pool(self) -> dict[str, Any]:
    s = self.m.pool_stats()
    d = {
      "num_free_blocks": s.num_free_blocks,
      "num_used_blocks": s.num_used_blocks,
      "num_free_cached_blocks": s.num_free_cached_blocks,
      "cached_blocks_per_group": list(s.cached_blocks_per_group),
    }
    if self.m.config.pinning:
      d["num_pinned_blocks"] = s.num_pinned_blocks
    return d

  def _prompt(self, where: str, action: Mapping[str, Any], name: str) -> list:
    """The tokens of `action`'s prompt (its `prompt`, else the prompt named like the request)."""
    field = "prompt" if "prompt" in action else "req"
    try:
      return scenario_lib.resolve_prompt(action.get("prompt", name), self.prompts)
    except ValueError as e:
      raise ValueError(f"{where}.{field}: {e}") from None

  def _ensure(self, name: str, action: Mapping[str, Any], where: str) -> None:
    if name in self.tokens:
      return
    toks = self._prompt(where, action, name)
    extras = _extras(action)
    self.m.add_request(name, toks, extras)
    self.tokens[name] = list(toks)
    self.extras[name] = extras

  def _layout(self, name: str) -> dict[str, Any]:
    v = self.m.request_view(name)
    return {"block_ids": [list(r) for r in v.block_ids], "num_real_blocks": list(v.num_real_blocks)}

  def _run_steps(self, name: str, action, rec: dict[str, Any], until_done: bool) -> None:
    chunk = action.get("chunk")
    chunks, steps, hit, failure = [], [], None, None
    # as vLLM's oracle drives it: at least one step (a `prefill` of a request whose prompt is
    # already computed schedules nothing: chunks [0], ok false), then steps until the prompt
    # is computed or a step schedules nothing
    while True:
      e = self.m.schedule([ScheduleEntry(name, chunk)]).entries[0]
      chunks.append(e.scheduled_tokens)
      steps.append(_entry_dict(e))
      if e.hit is not None:
        hit = e.hit
      if e.scheduled_tokens == 0:
        failure = e.reason
        break
      v = self.m.request_view(name)
      if not until_done or v.num_computed_tokens >= v.num_tokens:
        break
    v = self.m.request_view(name)
    rec.update(
      num_tokens=v.num_tokens,
      ok=failure is None,
      chunks=chunks,
      num_computed_tokens=v.num_computed_tokens,
    )
    if hit is not None:
      rec.update(_hit_dict(hit))
    if failure is not None:
      rec["failure"] = failure
    if action.get("verbose"):
      rec["steps"] = steps
    rec.update(self._layout(name))

  # ---- ops ----
  def run_action(self, i: int, a: Mapping[str, Any]) -> dict[str, Any]:
    op = a["op"]
    _check_fields(f"actions[{i}]", a)
    rec: dict[str, Any] = {"i": i, "op": op}
    name = a.get("req")
    if name is not None:
      rec["req"] = name
    if "note" in a:
      rec["note"] = a["note"]
    if op in ("lookup", "admit", "step", "prefill", "decode", "free", "finish", "preempt"):
      if name is None:
        raise ValueError(f"actions[{i}].req is required for op {op!r}")
    if op == "lookup":
      if name in self.tokens:
        toks, extras = self.tokens[name], self.extras[name]
      else:
        toks = self._prompt(f"actions[{i}]", a, name)
        extras = _extras(a)
      rec["num_tokens"] = len(toks)
      rec.update(_hit_dict(self.m.lookup(toks, extras)))
    elif op in ("admit", "prefill"):
      self._ensure(name, a, f"actions[{i}]")
      self._run_steps(name, a, rec, until_done=op == "prefill")
    elif op == "step":
      if name not in self.tokens:
        raise ValueError(f"actions[{i}].req must name an active request for 'step', got {name!r}")
      self._run_steps(name, a, rec, until_done=False)
    elif op == "schedule":
      entries = a.get("entries")
      if not isinstance(entries, list) or not entries:
        raise ValueError(f"actions[{i}].entries must be a non-empty list, got {entries!r}")
      for j, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("req"), str):
          raise ValueError(
            f"actions[{i}].entries[{j}] must be an object with a string 'req', got {e!r}"
          )
        _check_fields(f"actions[{i}].entries[{j}]", e)
      for j, e in enumerate(entries):
        self._ensure(e["req"], e, f"actions[{i}].entries[{j}]")
      res = self.m.schedule([ScheduleEntry(e["req"], e.get("chunk")) for e in entries])
      rec["entries"] = [_entry_dict(e) for e in res.entries]
    elif op == "decode":
      if name not in self.tokens:
        raise ValueError(f"actions[{i}].req must name an active request for 'decode', got {name!r}")
      try:
        toks = scenario_lib.resolve_prompt(a.get("tokens", []), self.prompts)
      except ValueError as e:
        raise ValueError(f"actions[{i}].tokens: {e}") from None
      steps, failure = [], None
      for t in toks:
        self.m.append_tokens(name, [t])
        self.tokens[name].append(t)
        e = self.m.schedule([ScheduleEntry(name, None)]).entries[0]
        steps.append(_entry_dict(e))
        if e.scheduled_tokens == 0:
          failure = e.reason
          break
      v = self.m.request_view(name)
      rec.update(
        ok=failure is None, num_tokens=v.num_tokens, num_computed_tokens=v.num_computed_tokens
      )
      if failure is not None:
        rec["failure"] = failure
      if a.get("verbose"):
        rec["steps"] = steps
      rec.update(self._layout(name))
    elif op in ("free", "finish"):
      self.m.free(name)
      self.tokens.pop(name, None)
      self.extras.pop(name, None)
    elif op == "preempt":
      self.m.preempt(name)
    elif op == "reset_prefix_cache":
      rec["ok"] = self.m.reset_prefix_cache()
    elif op == "state":
      active = {}
      for n in self.m.active_requests():
        v = self.m.request_view(n)
        active[n] = {
          "status": v.status,
          "num_computed_tokens": v.num_computed_tokens,
          "num_tokens": v.num_tokens,
          "block_ids": [list(r) for r in v.block_ids],
          "num_real_blocks": list(v.num_real_blocks),
        }
      rec["active"] = active
    rec.update(self._pool())
    return rec

  def run(self) -> dict[str, Any]:
    """Replays every action; a bad one raises ValueError naming `actions[i]` (and the field)."""
    results = []
    for i, a in enumerate(self.sc["actions"]):
      try:
        results.append(self.run_action(i, a))
      except _ACTION_ERRORS as e:
        msg = cli_util.one_line(e if isinstance(e, ValueError) else f"{type(e).__name__}: {e}")
        if msg.startswith(f"actions[{i}]"):
          raise
        raise ValueError(f"actions[{i}] (op {a.get('op')!r}): {msg}") from e
    return {
      "scenario": self.sc["name"],
      "description": self.sc.get("description", ""),
      "config": self.m.config.to_dict(),
      "results": results,
    }


def replay(sc: Mapping[str, Any], backend: str = "reference", factory: Callable | None = None):
  """Replays a parsed scenario; returns the output object."""
  config = scenario_lib.config_of(sc)
  manager = factory(config) if factory is not None else make_manager(config, backend)
  return Replayer(manager, sc).run()


def replay_file(path: str, backend: str = "reference") -> dict[str, Any]:
  return replay(scenario_lib.load(path), backend)


# ---- comparison ----
def _cmp_fields(exp: Mapping, act: Mapping, fields, path: str) -> str | None:
  for f in fields:
    if f in exp and (f not in act or exp[f] != act[f]):
      return f"{path}.{f}"
  return None


def _cmp_records(exp_list, act_list, path: str) -> str | None:
  if not isinstance(act_list, list) or len(exp_list) != len(act_list):
    return f"{path} (length {len(exp_list)} expected)"
  for k, (e, a) in enumerate(zip(exp_list, act_list)):
    d = _cmp_fields(e, a, ENTRY_COMPARED, f"{path}[{k}]")
    if d:
      return d
  return None


def first_difference(expected: Mapping, actual: Mapping) -> str | None:
  """The first differing compared path between two replay outputs, or None."""
  er, ar = expected["results"], actual["results"]
  if len(er) != len(ar):
    return f"results (length {len(er)} expected, got {len(ar)})"
  for i, (e, a) in enumerate(zip(er, ar)):
    p = f"results[{i}]"
    d = _cmp_fields(e, a, TOP_COMPARED, p)
    if d:
      return d
    for key in ("entries", "steps"):
      if key in e:
        d = _cmp_records(e[key], a.get(key), f"{p}.{key}")
        if d:
          return d
    if "active" in e:
      ea, aa = e["active"], a.get("active", {})
      if sorted(ea) != sorted(aa):
        return f"{p}.active (requests {sorted(ea)} expected, got {sorted(aa)})"
      for n in ea:
        d = _cmp_fields(ea[n], aa[n], ACTIVE_COMPARED, f"{p}.active.{n}")
        if d:
          return d
  return None


def _expand(inputs: list[str]) -> list[str]:
  out = []
  for x in inputs:
    if os.path.isdir(x):
      files = sorted(glob.glob(os.path.join(x, "*.json")))
      out.extend(f for f in files if not f.endswith(".expected.json"))
    elif any(c in x for c in "*?["):
      out.extend(f for f in sorted(glob.glob(x)) if not f.endswith(".expected.json"))
    else:
      out.append(x)
  return out


def _problem(path: str, message: object) -> None:
  """Prints one `ERROR PATH: MESSAGE` line on stderr (the path is not repeated)."""
  text = cli_util.one_line(message)
  if text.startswith(f"{path}: "):
    text = text[len(path) + 2 :]
  print(f"ERROR {path}: {text}", file=sys.stderr)


def _compare(path: str, out: Mapping[str, Any]) -> str | None:
  """--check of one result: None if equal, else the first difference (ValueError: bad file)."""
  exp_path = path[: -len(".json")] + ".expected.json"
  try:
    expected = scenario_lib.read_json(exp_path)
  except OSError as e:
    raise ValueError(f"{exp_path}: cannot read ({cli_util.os_error_text(e)})") from None
  if not isinstance(expected, dict) or not isinstance(expected.get("results"), list):
    raise ValueError(f"{exp_path}: expected output must be an object with a 'results' list")
  try:
    return first_difference(expected, out)
  except (KeyError, TypeError, AttributeError) as e:
    raise ValueError(f"{exp_path}: malformed expected output ({type(e).__name__}: {e})") from None


def main(argv: list[str] | None = None) -> int:
  """Runs the CLI; returns 0, 1 (a --check mismatch) or 2 (bad input: one ERROR line each)."""
  ap = cli_util.ArgumentParser(
    prog="python -m hybrid_cache.replay", description=__doc__.split("\n")[0]
  )
  ap.add_argument("inputs", nargs="+", help="scenario files, directories or globs")
  ap.add_argument("--out-dir", help="write each result to DIR/<scenario file name>")
  ap.add_argument("--compact", action="store_true", help="one-line JSON")
  ap.add_argument("--backend", choices=("jax", "reference"), default=None)
  ap.add_argument("--check", action="store_true", help="compare with NAME.expected.json")
  ap.add_argument(
    "--no-compile-cache",
    action="store_true",
    help="do not use JAX's persistent compilation cache (hybrid_cache/persistent_cache.py)",
  )
  try:
    args = ap.parse_args(argv)
  except SystemExit as e:  # usage errors (printed by the parser) and --help
    return e.code if isinstance(e.code, int) else cli_util.USAGE_ERROR
  if not args.no_compile_cache:
    persistent_cache.enable()
  backend = args.backend or default_backend()
  print(f"replay backend: {backend}", file=sys.stderr)
  bad, mismatches, files = 0, 0, []
  for x in args.inputs:
    found = _expand([x])
    if not found:
      _problem(x, "no scenario files (a directory or glob without *.json files)")
      bad += 1
    files.extend(found)
  if args.out_dir:
    try:
      os.makedirs(args.out_dir, exist_ok=True)
    except OSError as e:
      _problem(args.out_dir, f"--out-dir: cannot create ({cli_util.os_error_text(e)})")
      return cli_util.USAGE_ERROR
  for path in files:
    try:
      sc = scenario_lib.load(path)
      out = replay(sc, backend)
    except OSError as e:
      _problem(path, f"cannot read ({cli_util.os_error_text(e)})")
      bad += 1
      continue
    except ValueError as e:  # bad scenario input: name the file, go on with the others
      _problem(path, e)
      bad += 1
      continue
    except (OverflowError, MemoryError) as e:  # e.g. a num_blocks no pool can hold
      _problem(path, f"config too large for the {backend} backend ({type(e).__name__}: {e})")
      bad += 1
      continue
    except ImportError as e:
      _problem(path, f"backend {backend!r} is not available ({e})")
      return cli_util.USAGE_ERROR
    text = json.dumps(out, separators=(",", ":")) if args.compact else json.dumps(out, indent=1)
    if args.out_dir:
      dst = os.path.join(args.out_dir, os.path.basename(path))
      try:
        with open(dst, "w") as f:
          f.write(text + "\n")
      except OSError as e:
        _problem(path, f"cannot write {dst} ({cli_util.os_error_text(e)})")
        bad += 1
        continue
    elif not args.check:
      print(text)
    if args.check:
      exp_path = path[: -len(".json")] + ".expected.json"
      if not os.path.exists(exp_path):
        print(f"FAIL {path}: no {os.path.basename(exp_path)}")
        mismatches += 1
        continue
      try:
        diff = _compare(path, out)
      except ValueError as e:
        _problem(path, e)
        bad += 1
        continue
      if diff is None:
        print(f"PASS {path}")
      else:
        mismatches += 1
        print(f"FAIL {path}: first difference at {diff}")
  if bad:
    return cli_util.USAGE_ERROR
  return 1 if mismatches else 0


if __name__ == "__main__":
  sys.exit(main())
