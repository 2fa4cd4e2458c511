"""Runs generated scenarios on vLLM's real cache manager (the shared oracle), from Python.

`OracleRunner(oracle_dir)` starts nothing until `run(scenarios)`: it pipes the scenarios as JSON
lines through `oracle_driver.py` under the oracle's own interpreter (one process, vLLM imported
once) and returns one `{"result"}` or `{"error", "action"}` object per scenario.

Locations: `oracle_dir` is the directory `setup_oracle.sh` built (holding `.venv/` and `src/`);
the oracle script's directory defaults to `shared/vllm_oracle` beside the repository
(`HYBRID_CACHE_VLLM_ORACLE_SCRIPT` overrides it).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEFAULT_SCRIPT_DIR = os.path.join(os.path.dirname(REPO), "shared", "vllm_oracle")
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "oracle_driver.py")


class OracleError(RuntimeError):
  """The oracle could not be started or answered something unexpected."""


class OracleRunner:
  """vLLM 0.33's cache manager behind `run(scenarios) -> results` (see module docstring)."""

  def __init__(self, oracle_dir: str, script_dir: str | None = None):
    self.python = os.path.join(oracle_dir, ".venv", "bin", "python")
    self.src = os.path.join(oracle_dir, "src")
    self.script_dir = script_dir or os.environ.get(
      "HYBRID_CACHE_VLLM_ORACLE_SCRIPT", DEFAULT_SCRIPT_DIR
    )
    for path, what in (
      (self.python, "the oracle's interpreter (run shared/vllm_oracle/setup_oracle.sh DIR)"),
      (self.src, "the oracle's vLLM sources"),
      (os.path.join(self.script_dir, "vllm_oracle.py"), "the oracle script"),
    ):
      if not os.path.exists(path):
        raise OracleError(f"{path} does not exist: {what}")

  def run(self, scenarios: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    text = "".join(json.dumps(sc, separators=(",", ":")) + "\n" for sc in scenarios)
    env = dict(os.environ, PYTHONPATH=self.src, VLLM_LOGGING_LEVEL="ERROR")
    proc = subprocess.run(
      [self.python, DRIVER, self.script_dir],
      input=text,
      capture_output=True,
      text=True,
      env=env,
      check=False,
    )
    if proc.returncode != 0:
      raise OracleError(f"oracle driver exited {proc.returncode}: {proc.stderr[-2000:]}")
    out = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    if len(out) != len(scenarios):
      raise OracleError(f"oracle answered {len(out)} of {len(scenarios)} scenarios")
    return out


def run_repaired(
  runner: OracleRunner, scenarios: Sequence[dict[str, Any]], rounds: int = 6
) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
  """Runs scenarios, dropping each action vLLM rejects (e.g. a decode whose prefill failed).

  The generator cannot know whether a prefill succeeds (that is what is tested), so a
  `decode` may follow an unfinished prompt; the oracle rejects it. Such an action is removed
  and the scenario run again, up to `rounds` times. Returns (scenario as run, vLLM's result or
  None when it still fails).
  """
  pending = {i: dict(sc) for i, sc in enumerate(scenarios)}
  done: dict[int, tuple[dict[str, Any], dict[str, Any] | None]] = {}
  for _ in range(rounds):
    if not pending:
      break
    keys = sorted(pending)
    answers = runner.run([pending[k] for k in keys])
    nxt = {}
    for k, ans in zip(keys, answers):
      sc = pending[k]
      if "result" in ans:
        done[k] = (sc, ans["result"])
      elif ans.get("action", -1) >= 0:
        actions = list(sc["actions"])
        del actions[ans["action"]]
        nxt[k] = dict(sc, actions=actions)
      else:
        done[k] = (sc, None)
    pending = nxt
  for k, sc in pending.items():
    done[k] = (sc, None)
  return [done[i] for i in range(len(scenarios))]
