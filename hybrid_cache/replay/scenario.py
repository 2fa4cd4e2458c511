"""Parsing of replay scenarios (`shared/reference/scenario_format.md`).

A scenario is `{"name", "description", "config", "prompts", "actions"}`. Prompts are a list
of ints, `{"range": [a, b]}`, `{"repeat": [tok, n]}`, `{"concat": [...]}` or another prompt's
name; `resolve_prompt` expands any of these (names resolved recursively, cycles rejected).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from hybrid_cache.config import CacheConfig

OPS = (
  "lookup",
  "admit",
  "step",
  "prefill",
  "schedule",
  "decode",
  "free",
  "finish",
  "preempt",
  "reset_prefix_cache",
  "state",
)


def resolve_prompt(spec: Any, prompts: Mapping[str, Any], _stack: tuple[str, ...] = ()) -> list:
  """Expands a prompt form to a list of ints (ValueError on a malformed form)."""
  if isinstance(spec, str):
    if spec not in prompts:
      raise ValueError(f"prompt name must be one of {sorted(prompts)}, got {spec!r}")
    if spec in _stack:
      raise ValueError(f"prompt {spec!r} refers to itself via {' -> '.join(_stack)}")
    return resolve_prompt(prompts[spec], prompts, _stack + (spec,))
  if isinstance(spec, list):
    out = []
    for t in spec:
      if isinstance(t, bool) or not isinstance(t, int):
        raise ValueError(f"prompt tokens must be integers >= 0, got {t!r}")
      out.append(t)
    return out
  if isinstance(spec, Mapping) and len(spec) == 1:
    ((kind, arg),) = spec.items()
    if kind == "range":
      if not (isinstance(arg, list) and len(arg) == 2 and all(isinstance(x, int) for x in arg)):
        raise ValueError(f"prompt range must be [a, b] with integers, got {arg!r}")
      return list(range(arg[0], arg[1]))
    if kind == "repeat":
      if not (isinstance(arg, list) and len(arg) == 2 and all(isinstance(x, int) for x in arg)):
        raise ValueError(f"prompt repeat must be [token, n] with integers, got {arg!r}")
      if arg[1] < 0:
        raise ValueError(f"prompt repeat count must be >= 0, got {arg[1]}")
      return [arg[0]] * arg[1]
    if kind == "concat":
      if not isinstance(arg, list):
        raise ValueError(f"prompt concat must be a list of prompt forms, got {arg!r}")
      out = []
      for part in arg:
        out.extend(resolve_prompt(part, prompts, _stack))
      return out
  raise ValueError(
    f"prompt must be a list of ints, a name, or one of {{range, repeat, concat}}, got {spec!r}"
  )


def read_json(path: str) -> Any:
  """The parsed JSON of `path` (OSError if unreadable; ValueError naming line and column)."""
  with open(path, encoding="utf-8") as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(
        f"{path}: malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}"
      ) from None
    except UnicodeDecodeError as e:
      raise ValueError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None


def load(path: str) -> dict[str, Any]:
  """Reads and minimally checks a scenario file (OSError if unreadable, else ValueError)."""
  sc = read_json(path)
  if not isinstance(sc, dict):
    raise ValueError(f"{path}: a scenario must be a JSON object, got {type(sc).__name__}")
  for key in ("config", "actions"):
    if key not in sc:
      raise ValueError(f"{path}: scenario is missing {key!r}")
  for key in ("name", "description"):
    if key in sc and not isinstance(sc[key], str):
      raise ValueError(f"{path}: {key} must be a string, got {sc[key]!r}")
  sc.setdefault("name", os.path.splitext(os.path.basename(path))[0])
  sc.setdefault("description", "")
  sc.setdefault("prompts", {})
  for key, kind in (("config", dict), ("prompts", dict), ("actions", list)):
    if not isinstance(sc[key], kind):
      want = "an object" if kind is dict else "a list"
      raise ValueError(f"{path}: {key} must be {want}, got {type(sc[key]).__name__}")
  for i, a in enumerate(sc["actions"]):
    if not isinstance(a, dict) or a.get("op") not in OPS:
      op = a.get("op") if isinstance(a, dict) else a
      raise ValueError(f"{path}: actions[{i}].op must be one of {OPS}, got {op!r}")
  return sc


def config_of(sc: Mapping[str, Any]) -> CacheConfig:
  return CacheConfig.from_dict(sc["config"])
