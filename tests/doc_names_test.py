"""The code names the docs cite exist: every `hybrid_cache.x.y` / `experiments.x` in backticks.

Scans README.md, docs/*.md and the docstrings and comments of the packages for dotted names in
backticks that start with one of our packages, and resolves each: the longest importable module
prefix, then attributes. A renamed or removed module shows up here instead of in a reader's
failed import.
"""

import importlib
import pathlib
import re

import pytest

_ROOT = pathlib.Path(__file__).resolve().parents[1]
_PACKAGES = ("hybrid_cache", "experiments", "kernels", "models")
_NAME = re.compile(r"`((?:" + "|".join(_PACKAGES) + r")(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def _sources() -> list[pathlib.Path]:
  files = [_ROOT / "README.md", *sorted((_ROOT / "docs").glob("*.md"))]
  for pkg in _PACKAGES:
    files += sorted((_ROOT / pkg).rglob("*.py"))
  return files


def _cited() -> dict[str, str]:
  """Dotted name -> the first file (relative path) that cites it."""
  names: dict[str, str] = {}
  for f in _sources():
    for m in _NAME.finditer(f.read_text()):
      names.setdefault(m.group(1), str(f.relative_to(_ROOT)))
  return names


def _resolve(name: str) -> None:
  parts = name.split(".")
  for cut in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:cut]))
    except ModuleNotFoundError:
      continue
    for attr in parts[cut:]:
      obj = getattr(obj, attr)
    return
  raise ModuleNotFoundError(name)


def test_docs_cite_some_names():
  assert len(_cited()) > 10


@pytest.mark.parametrize("name,where", sorted(_cited().items()))
def test_cited_name_resolves(name, where):
  try:
    _resolve(name)
  except (ImportError, AttributeError) as e:
    pytest.fail(f"{where} cites `{name}`, which does not resolve: {e}")


def test_no_citation_of_the_removed_reference_package():
  # The plain-Python twin was `hybrid_cache/reference*`, then the `oracle` package (state class
  # `OracleState`), and is now `hybrid_cache.twin` (`PythonCacheManager`, `TwinState`).
  stale = re.compile(
    r"`reference\.(?:rules|policies|eviction)\b|hybrid_cache[./](?:reference|oracle)\b"
    r"|\bOracleState\b"
  )
  hits = [
    f"{f.relative_to(_ROOT)}:{i}"
    for f in _sources()
    for i, line in enumerate(f.read_text().splitlines(), 1)
    if stale.search(line)
  ]
  assert not hits, f"cite hybrid_cache.twin instead: {hits}"
