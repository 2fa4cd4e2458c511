"""Writes a Marconi-format JSONL trace (token level) from a Mooncake file or a generator.

  python -m experiments.traces.make_trace mooncake --src FILE [--max-input 32768] [--limit N] OUT
  python -m experiments.traces.make_trace synthetic --kind chat --seed 0 [--param k=v ...] OUT

Mooncake conversion: token(hash id h, offset o) = 512 h + o, fresh contiguous output tokens
(`hybrid_cache.sim.trace`), so Marconi's own simulator on OUT sees exactly what our symbol-level
replay of the Mooncake file sees. Prints the sha256 of OUT for the manifest.
"""

from __future__ import annotations

import argparse
import hashlib
import json

from hybrid_cache.sim import synthetic
from hybrid_cache.sim import trace as trace_lib


def _param(kv: str):
  k, _, v = kv.partition("=")
  try:
    return k, json.loads(v)
  except json.JSONDecodeError:
    return k, v


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("source", choices=("mooncake", "synthetic"))
  p.add_argument("out")
  p.add_argument("--src")
  p.add_argument("--max-input", type=int)
  p.add_argument("--limit", type=int)
  p.add_argument("--kind", default="chat")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--param", action="append", default=[], help="generator keyword k=v")
  a = p.parse_args()
  if a.source == "mooncake":
    if not a.src:
      p.error("--src is required for mooncake")
    tr = trace_lib.load_mooncake(a.src, limit=a.limit, max_input=a.max_input)
  else:
    tr = synthetic.generate(a.kind, seed=a.seed, **dict(_param(x) for x in a.param))
  trace_lib.write_marconi(tr, a.out)
  with open(a.out, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  print(f"{a.out}: {len(tr)} requests, {tr.input_tokens} input tokens, sha256 {digest}")


if __name__ == "__main__":
  main()
