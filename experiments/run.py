"""Runs one experiment from a gin file: `python -m experiments.run --gin_file=F [--workdir=D]`.

The gin file binds `run.run_experiment.experiment` to an experiment function (any callable
`fn(workdir: str) -> dict`) and configures it. Library code stays gin-free: gin files use
`from __gin__ import dynamic_registration` to bind undecorated functions and classes.

Writes into `--workdir` (default `runs/<gin file stem>`):
  config.gin    the operative config (what the run actually used), written after the run
  results.json  the dict the experiment returned, plus `seed`, `gin_files`, `gin_bindings`
  *.png         plots the experiment saved into the workdir

Bad input (no or a missing --gin_file, a gin syntax error, an unknown configurable or parameter,
a value the experiment rejects) prints one `error:` line naming the file or binding and exits
with status 2.
"""

from __future__ import annotations

import importlib.util  # noqa: F401 - gin's resource reader uses importlib.util unimported
import json
import logging as std_logging
import os
import pathlib
import re
import sys
import time
import tokenize
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import gin
from absl import app
from absl import flags
from absl import logging

from hybrid_cache import persistent_cache

if __name__ == "__main__":
  # Under `python -m experiments.run`, gin files' `from experiments import run` must get this
  # very module (same flags, same `run_experiment`), not a second copy.
  sys.modules.setdefault("experiments.run", sys.modules[__name__])

_CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"

_SEARCH_PATHS_ADDED = False
_EXPERIMENT = "run.run_experiment.experiment"
# Errors gin raises for a bad file or binding (syntax, unknown name, failed import, include,
# ambiguous selector, locked config).
_GIN_ERRORS = (
  SyntaxError,
  tokenize.TokenError,
  ValueError,
  AttributeError,
  NameError,
  KeyError,
  ImportError,
  OSError,
  RuntimeError,
)
_LOCATION = re.compile(r'In (?:file "(?P<file>.*)",|bindings string) line (?P<line>\d+)')

_GIN_FILE = flags.DEFINE_multi_string("gin_file", [], "Gin config files (relative to configs/ ok).")
_GIN_BINDINGS = flags.DEFINE_multi_string("gin_bindings", [], "Extra gin bindings.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (default runs/<gin stem>).")
_COMPILE_CACHE = flags.DEFINE_bool(
  "compile_cache", True, "JAX's persistent compilation cache (hybrid_cache/persistent_cache.py)."
)


def run_experiment(
  experiment: Callable[..., dict[str, Any]] = gin.REQUIRED, seed: int = 0, workdir: str = ""
) -> dict[str, Any]:
  """Calls `experiment(workdir=..., seed=...)` and returns its results dict."""
  return experiment(workdir=workdir, seed=seed)


class ConfigError(ValueError):
  """Bad command-line input or gin config; the message is one line naming the file or binding."""


def _gin_error_line(e: BaseException, where: str) -> str:
  """One line from a gin error: `FILE:LINE: MESSAGE (in: STATEMENT)`, else `WHERE: MESSAGE`.

  Gin appends the location (`In file "F", line N` or `In bindings string line N`, then the
  statement and a caret) and `In call to configurable ...` lines to the original message.
  """
  if isinstance(e, tokenize.TokenError):  # e.g. a parenthesis left open at the end
    msg, (line, _) = e.args
    return f"{where}: {msg}" + (f" (line {line})" if where.startswith("--gin_file") else "")
  if isinstance(e, SyntaxError):
    lines = str(e.msg).splitlines()
    loc = f"{e.filename}:{e.lineno}" if e.filename else where
    statement = (e.text or "").strip() if e.filename else ""
  else:
    lines = str(e).splitlines()
    loc, statement = where, ""
  for k, line in enumerate(lines):
    m = _LOCATION.search(line)
    if m:
      if m["file"]:  # else a binding: `where` names it
        loc = f"{m['file']}:{m['line']}"
        statement = lines[k + 1].strip() if k + 1 < len(lines) else ""
      break
  # The message is the first meaningful line (later ones are gin's context, e.g. the config).
  noise = ("In call to configurable", "In file ", "In bindings string")
  kept = [x.strip() for x in lines if x.strip() and "<ast." not in x]
  text = next((x for x in kept if not x.startswith(noise)), type(e).__name__)
  if isinstance(e, KeyError):  # str() of a KeyError is the repr of its message
    text = text.strip("'\"")
  return f"{loc}: {text.rstrip(': ')}" + (f" (in: {statement})" if statement else "")


def _find_gin_file(name: str) -> None:
  """ConfigError unless `name` is a gin file here, under configs/ or under the repository."""
  if os.path.isabs(name):
    candidates = [name]
  else:
    candidates = [name, str(_CONFIGS / name), str(_CONFIGS.parent / name)]
  if any(os.path.isfile(c) for c in candidates):
    return
  if any(os.path.isdir(c) for c in candidates):
    raise ConfigError(f"--gin_file {name!r} is a directory, not a gin file")
  dirs = ", ".join(repr(os.path.dirname(c) or ".") for c in candidates)
  raise ConfigError(f"--gin_file {name!r} does not exist (looked in {dirs})")


class _DropGinPathNotFound(std_logging.Filter):
  """Drops gin's `Path not found` log records (a missing include is reported as the error)."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Path not found")


def _parse_gin(gin_files: Sequence[str], gin_bindings: Sequence[str]) -> None:
  """`gin.parse_config_files_and_bindings` with one-line ConfigErrors naming file or binding.

  Each binding is parsed on its own (gin would join them with newlines) so that an error
  names the binding.
  """
  root, quiet = std_logging.getLogger(), _DropGinPathNotFound()
  root.addFilter(quiet)
  try:
    for name in gin_files:
      _find_gin_file(name)
      try:
        gin.parse_config_file(name)
      except _GIN_ERRORS as e:
        if isinstance(e, OSError) and e.strerror:
          raise ConfigError(f"--gin_file {name!r}: cannot read ({e.strerror})") from e
        raise ConfigError(_gin_error_line(e, f"--gin_file {name!r}")) from e
    for binding in gin_bindings:
      try:
        gin.parse_config(binding)
      except _GIN_ERRORS as e:
        raise ConfigError(_gin_error_line(e, f"--gin_bindings {binding!r}")) from e
  finally:
    root.removeFilter(quiet)
  try:
    gin.finalize()
  except _GIN_ERRORS as e:  # e.g. a macro without a value
    raise ConfigError(_gin_error_line(e, f"gin config {list(gin_files)}")) from e


def _experiment_selector(gin_files: Sequence[str]) -> str:
  """The configurable bound to `run.run_experiment.experiment` (ConfigError when unbound)."""
  try:
    ref = gin.query_parameter(_EXPERIMENT)
  except (ValueError, KeyError):
    ref = None
  if not isinstance(ref, gin.config.ConfigurableReference):
    raise ConfigError(
      f"no experiment: {list(gin_files)} must bind {_EXPERIMENT} = @<module>.<function> "
      "(after `from experiments import run`)"
    )
  return ref.configurable.selector


def _jsonable(x: Any) -> Any:
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, list | tuple):
    return [_jsonable(v) for v in x]
  if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
    return x.item()
  if hasattr(x, "tolist"):
    return x.tolist()
  return x


def execute(
  gin_files: Sequence[str], gin_bindings: Sequence[str], workdir: str | None
) -> dict[str, Any]:
  """Parses the config, runs the experiment, writes config.gin and results.json.

  Raises:
    ConfigError: bad input (see the module docstring); its message is one line.
  """
  if not gin_files:
    raise ConfigError("--gin_file is required (e.g. configs/experiments/quickstart.gin)")
  global _SEARCH_PATHS_ADDED
  if not _SEARCH_PATHS_ADDED:  # once: gin keeps every path added (also across clear_config)
    gin.add_config_file_search_path(str(_CONFIGS))
    gin.add_config_file_search_path(str(_CONFIGS.parent))
    _SEARCH_PATHS_ADDED = True
  _parse_gin(gin_files, gin_bindings)
  selector = _experiment_selector(gin_files)
  if workdir is None:
    workdir = os.path.join("runs", pathlib.Path(gin_files[0]).stem)
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise ConfigError(f"--workdir {workdir!r}: cannot create ({e.strerror or e})") from e
  # the config itself is logged once it has run: a bad binding is one error line, not a dump
  logging.info("Running %s (%s) into %s", selector, ", ".join(gin_files), workdir)
  start = time.perf_counter()
  configured = gin.get_configurable(run_experiment)
  try:
    results = configured(workdir=workdir)
  except ValueError as e:  # a value the experiment rejects
    raise ConfigError(_gin_error_line(e, selector)) from e
  except RuntimeError as e:  # gin: a parameter bound to gin.REQUIRED was not set
    if "Required bindings" not in str(e):
      raise
    raise ConfigError(_gin_error_line(e, selector)) from e
  results = dict(_jsonable(results))
  results.setdefault("total_wall_s", time.perf_counter() - start)
  results["gin_files"] = list(gin_files)
  results["gin_bindings"] = list(gin_bindings)
  operative = gin.operative_config_str()
  logging.info("Operative config:\n%s", operative)
  with open(os.path.join(workdir, "config.gin"), "w") as f:
    f.write(operative)
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(results, f, indent=1, sort_keys=True)
  logging.info("Wrote %s", workdir)
  return results


def _error(message: str) -> int:
  print(f"error: {message}", file=sys.stderr)
  return 2


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl flag parsing whose errors are one line (then exit status 2)."""
  try:
    return flags.FLAGS(list(argv))
  except flags.Error as e:
    sys.exit(_error(f"{e} (see --helpshort)"))


def main(argv: Sequence[str]) -> int:
  """Runs the experiment; returns 0, or 2 after one `error:` line on bad input."""
  if len(argv) > 1:
    return _error(f"unexpected arguments {list(argv[1:])} (flags are --gin_file=F ...)")
  if _COMPILE_CACHE.value:
    persistent_cache.enable()
  try:
    execute(_GIN_FILE.value, _GIN_BINDINGS.value, _WORKDIR.value)
  except ConfigError as e:
    return _error(str(e))
  return 0


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
