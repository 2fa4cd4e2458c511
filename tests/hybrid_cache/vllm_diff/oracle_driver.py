"""Runs scenarios on vLLM 0.33.0's real cache manager (`shared/vllm_oracle/`), JSON lines in/out.

Run with the oracle's interpreter (see `shared/vllm_oracle/README.md`)::

  PYTHONPATH=$ORACLE/src $ORACLE/.venv/bin/python oracle_driver.py ORACLE_SCRIPT_DIR < in > out

Each input line is one scenario document; each output line is `{"result": ...}` (the oracle's
result document) or `{"error": "...", "action": i}` (a scenario the oracle rejects: the message
and the index of the first action it rejects, found by replaying growing prefixes). One
process imports vLLM once (~10 s) and then replays thousands of scenarios. This file only calls
the oracle's `run_scenario`; it holds none of vLLM's code.
"""

import json
import sys


def _first_failing_action(vllm_oracle, sc: dict) -> int:
  """The smallest i such that the scenario cut after action i is rejected (-1: the config)."""
  lo, hi = 0, len(sc["actions"])  # prefix of lo actions passes, of hi fails
  try:
    vllm_oracle.run_scenario(dict(sc, actions=[]))
  except vllm_oracle.ScenarioError:
    return -1
  while hi - lo > 1:
    mid = (lo + hi) // 2
    try:
      vllm_oracle.run_scenario(dict(sc, actions=sc["actions"][:mid]))
      lo = mid
    except vllm_oracle.ScenarioError:
      hi = mid
  return hi - 1


def main() -> int:
  sys.path.insert(0, sys.argv[1])
  import vllm_oracle  # noqa: PLC0415 - the shared oracle script, found through argv[1]

  for line in sys.stdin:
    if not line.strip():
      continue
    sc = json.loads(line)
    try:
      out = {"result": vllm_oracle.run_scenario(sc)}
    except vllm_oracle.ScenarioError as e:
      out = {"error": str(e), "action": _first_failing_action(vllm_oracle, sc)}
    sys.stdout.write(json.dumps(out, separators=(",", ":")) + "\n")
    sys.stdout.flush()
  return 0


if __name__ == "__main__":
  sys.exit(main())
