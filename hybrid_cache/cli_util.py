"""Shared pieces of the command-line entry points: bad input is one line and exit status 2.

`ArgumentParser` reports a usage error as the single line `error: argument --FLAG: ...`;
the `*_arg` functions are argparse `type=` converters whose errors name the allowed range.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable

USAGE_ERROR = 2  # exit status for bad input (argparse's own)


def one_line(text: object) -> str:
  """`text` with its lines joined by single spaces (a message that fits one stderr line)."""
  return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def os_error_text(e: OSError) -> str:
  """The reason of an OSError without the path (`No such file or directory`, ...)."""
  return e.strerror or one_line(e) or type(e).__name__


def json_error_text(e: json.JSONDecodeError) -> str:
  """`malformed JSON at line L, column C: MSG` for a JSONDecodeError."""
  return f"malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}"


class ArgumentParser(argparse.ArgumentParser):
  """An argparse parser whose usage errors are one line on stderr (then exit status 2)."""

  def error(self, message: str):
    self.exit(USAGE_ERROR, f"error: {one_line(message)} (see --help)\n")


def int_arg(lo: int) -> Callable[[str], int]:
  """argparse type: an integer >= `lo`."""

  def parse(text: str) -> int:
    try:
      v = int(text)
    except ValueError:
      v = None
    if v is None or v < lo:
      raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got {text!r}")
    return v

  return parse


def positive_float_arg(text: str) -> float:
  """argparse type: a finite number > 0."""
  try:
    v = float(text)
  except ValueError:
    v = math.nan
  if not (math.isfinite(v) and v > 0):
    raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
  return v
