"""Records vLLM 0.33's geometry for every case of `cases.py` into `recorded.json.gz`.

  python -m tests.hybrid_cache.vllm_geometry.record --oracle_dir=/tmp/vllm-oracle

runs `oracle_geometry.py` under the oracle's interpreter (shared/vllm_oracle/setup_oracle.sh),
one process per target, and writes `{"vllm_version", "cases": [{"id", "config", "target",
"flags", "vllm" | "error"}]}`. `vllm_geometry_test.py` compares the project's
`hybrid_cache.geometry.derive` with it; `vllm_geometry_live_test.py` runs this oracle afresh.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import subprocess
import sys

from hybrid_cache.geometry import get_target
from tests.hybrid_cache.vllm_geometry import cases as cases_module

HERE = os.path.dirname(os.path.abspath(__file__))
RECORDED = os.path.join(HERE, "recorded.json.gz")
ORACLE = os.path.join(HERE, "oracle_geometry.py")


def load_recorded() -> list[dict]:
  """The recorded cases (`main` writes them)."""
  with gzip.open(RECORDED, "rt", encoding="utf-8") as f:
    return json.load(f)["cases"]


def run_oracle(oracle_dir: str, cases: list[dict]) -> list[dict]:
  """vLLM's answer for each case (same order): the case plus "vllm" or "error"."""
  python = os.path.join(oracle_dir, ".venv", "bin", "python")
  src = os.path.join(oracle_dir, "src")
  for path in (python, src):
    if not os.path.exists(path):
      raise FileNotFoundError(f"{path} does not exist (run shared/vllm_oracle/setup_oracle.sh)")
  env = dict(
    os.environ,
    PYTHONPATH=os.pathsep.join([src, os.path.join(HERE, "stubs")]),
    VLLM_LOGGING_LEVEL="ERROR",
  )
  answers = {}
  for target_name in sorted({c["target"] for c in cases}):
    target = dataclasses.asdict(get_target(target_name))
    lines = []
    for c in cases:
      if c["target"] != target_name:
        continue
      flags = dict(c["flags"])
      usage = flags.pop("usage_context", "llm")
      lines.append(
        json.dumps(
          {
            "id": c["id"],
            "config_dir": os.path.join(cases_module.CONFIG_DIR, c["config"]),
            "flags": flags,
            "usage_context": usage,
            "available_memory": flags.get("kv_cache_memory_bytes"),
          }
        )
      )
    proc = subprocess.run(
      [python, ORACLE, json.dumps(target)],
      input="\n".join(lines) + "\n",
      capture_output=True,
      text=True,
      env=env,
      check=False,
    )
    if proc.returncode != 0:
      raise RuntimeError(f"oracle_geometry.py exited {proc.returncode}: {proc.stderr[-3000:]}")
    for line in proc.stdout.splitlines():
      if line.startswith("{"):
        row = json.loads(line)
        answers[row["id"]] = row
  missing = [c["id"] for c in cases if c["id"] not in answers]
  if missing:
    raise RuntimeError(f"the oracle answered no result for {missing[:5]} ({len(missing)} cases)")
  out = []
  for c in cases:
    row = answers[c["id"]]
    out.append({**c, **({"error": row["error"]} if "error" in row else {"vllm": row["vllm"]})})
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--oracle_dir", default=os.environ.get("HYBRID_CACHE_VLLM_ORACLE"))
  args = parser.parse_args(argv)
  if not args.oracle_dir:
    print("error: --oracle_dir (or HYBRID_CACHE_VLLM_ORACLE) is required", file=sys.stderr)
    return 2
  rows = run_oracle(args.oracle_dir, cases_module.cases())
  with gzip.open(RECORDED, "wt", encoding="utf-8") as f:
    json.dump({"vllm_version": "0.33.0", "cases": rows}, f, separators=(",", ":"), sort_keys=True)
    f.write("\n")
  errors = sum("error" in r for r in rows)
  print(f"recorded {len(rows)} cases ({errors} rejected by vLLM) into {RECORDED}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
