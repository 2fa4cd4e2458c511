"""Records vLLM 0.33's outputs for the generated differential suite (run when the rules change).

  python -m tests.hybrid_cache.vllm_diff.record --oracle_dir=/tmp/vllm-oracle [--count=600]

Generates scenarios for seeds `first_seed .. first_seed+count-1` (`generator.generate`), runs
them on vLLM's real cache manager (`oracle.run_repaired`: an action vLLM rejects is dropped),
and writes `recorded.jsonl.gz` beside this file: one line per scenario,
`{"seed", "scenario", "expected"}` with vLLM's result trimmed to the compared fields
(`compare.trim`). CI replays the file without vLLM (`tests/hybrid_cache/vllm_diff_*_test.py`).

With `--scenario_dir=DIR` it writes scenario files instead, for the replay CLI: DIR/NAME.json
and vLLM's whole result as DIR/NAME.expected.json, so that

  python -m hybrid_cache.replay DIR --check --backend jax

checks the jitted core on fresh scenarios (issue 29: 140 of them, a fresh seed, one process).
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from typing import Any

from absl import app
from absl import flags

from tests.hybrid_cache.vllm_diff import compare
from tests.hybrid_cache.vllm_diff import generator
from tests.hybrid_cache.vllm_diff import oracle

RECORDED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recorded.jsonl.gz")

_ORACLE_DIR = flags.DEFINE_string("oracle_dir", None, "Directory setup_oracle.sh built.")
_COUNT = flags.DEFINE_integer("count", 600, "Scenarios to record.", lower_bound=1)
_FIRST_SEED = flags.DEFINE_integer("first_seed", 0, "First generator seed.", lower_bound=0)
_OUT = flags.DEFINE_string("out", RECORDED, "Output file (gzip JSON lines).")
_SCENARIO_DIR = flags.DEFINE_string(
  "scenario_dir", None, "Write NAME.json + NAME.expected.json files here instead of --out."
)


def load(path: str = RECORDED) -> list[dict[str, Any]]:
  """The recorded suite: a list of {"seed", "scenario", "expected"}."""
  with gzip.open(path, "rt") as f:
    return [json.loads(line) for line in f if line.strip()]


def _accepted(oracle_dir: str, seeds: range):
  """(seed, scenario, vLLM's result) of each generated scenario vLLM accepts, in seed order;
  a rejected one is reported on stderr and skipped."""
  runner = oracle.OracleRunner(oracle_dir)
  scenarios = [generator.generate(s) for s in seeds]
  for seed, (sc, result) in zip(seeds, oracle.run_repaired(runner, scenarios)):
    if result is None:
      print(f"seed {seed}: vLLM rejects the scenario, skipped", file=sys.stderr)
      continue
    yield seed, sc, result


def record(oracle_dir: str, seeds: range, out: str) -> int:
  rows = []
  for seed, sc, result in _accepted(oracle_dir, seeds):
    rows.append({"seed": seed, "scenario": sc, "expected": compare.trim(result)})
  # mtime=0: the same inputs give the same bytes (a regenerated file diffs only if vLLM's
  # outputs or the generator changed)
  with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
    for row in rows:
      f.write((json.dumps(row, separators=(",", ":"), sort_keys=True) + "\n").encode())
  print(f"recorded {len(rows)} of {len(seeds)} scenarios in {out}")
  return 0


def export(oracle_dir: str, seeds: range, out_dir: str) -> int:
  """Writes each accepted scenario and vLLM's result (`--scenario_dir`)."""
  os.makedirs(out_dir, exist_ok=True)
  n = 0
  for _, sc, result in _accepted(oracle_dir, seeds):
    for suffix, doc in ((".json", sc), (".expected.json", result)):
      with open(os.path.join(out_dir, sc["name"] + suffix), "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    n += 1
  print(f"wrote {n} of {len(seeds)} scenarios (and vLLM's results) to {out_dir}")
  return 0


def main(argv: list[str]) -> int:
  del argv
  if not _ORACLE_DIR.value:
    print("--oracle_dir is required (the directory setup_oracle.sh built)", file=sys.stderr)
    return 2
  seeds = range(_FIRST_SEED.value, _FIRST_SEED.value + _COUNT.value)
  try:
    if _SCENARIO_DIR.value:
      return export(_ORACLE_DIR.value, seeds, _SCENARIO_DIR.value)
    return record(_ORACLE_DIR.value, seeds, _OUT.value)
  except oracle.OracleError as e:
    print(f"oracle: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  app.run(main)
