"""The persistent compilation cache of the tools (`hybrid_cache/persistent_cache.py`): where it
lives, how it is turned off, and that a second replay of a scenario compiles nothing."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from hybrid_cache import persistent_cache

_REPO = pathlib.Path(__file__).resolve().parents[2]
_SCENARIO = _REPO / "tests/hybrid_cache/scenarios"


def _enable_in_fresh_process(env_value):
  env = dict(os.environ)
  if env_value is None:
    env.pop(persistent_cache.ENV, None)
  else:
    env[persistent_cache.ENV] = env_value
  code = "from hybrid_cache import persistent_cache as p; print(p.enable())"
  out = subprocess.run(
    [sys.executable, "-c", code], env=env, cwd=_REPO, capture_output=True, text=True, check=True
  )
  return out.stdout.strip()


def test_location_comes_from_the_environment_and_off_turns_it_off(tmp_path, monkeypatch):
  monkeypatch.setenv(persistent_cache.ENV, str(tmp_path))
  assert persistent_cache.cache_dir() == str(tmp_path)
  monkeypatch.setenv(persistent_cache.ENV, "off")
  assert persistent_cache.cache_dir() is None
  monkeypatch.delenv(persistent_cache.ENV)
  assert persistent_cache.cache_dir() == os.path.expanduser("~/.cache/hybrid_cache_jax")
  assert _enable_in_fresh_process("off") == "None"
  assert _enable_in_fresh_process(str(tmp_path)) == str(tmp_path)


def _replay(scenario, cache_dir, *flags):
  env = dict(os.environ, **{persistent_cache.ENV: str(cache_dir)})
  code = (
    "import json, jax\n"
    "from hybrid_cache.replay import replay\n"
    f"rc = replay.main([{str(scenario)!r}, '--backend', 'jax', '--check', *{list(flags)!r}])\n"
    "print(json.dumps({'rc': rc, 'dir': jax.config.jax_compilation_cache_dir}))\n"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], env=env, cwd=_REPO, capture_output=True, text=True, check=True
  )
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_second_replay_reads_the_programs_from_disk(tmp_path):
  scenario = next(p for p in sorted(_SCENARIO.glob("*.json")) if "expected" not in p.name)
  first = _replay(scenario, tmp_path)
  assert first == {"rc": 0, "dir": str(tmp_path)}
  written = sorted(os.listdir(tmp_path))
  assert written, "the first replay wrote no program"
  second = _replay(scenario, tmp_path)  # a program missing from disk would be written now
  assert second["rc"] == 0 and sorted(os.listdir(tmp_path)) == written
  off = _replay(scenario, tmp_path / "unused", "--no-compile-cache")
  assert off == {"rc": 0, "dir": None} and not (tmp_path / "unused").exists()
