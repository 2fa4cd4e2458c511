"""`python -m hybrid_cache.explain`: per request, what vLLM 0.33 hits and why the rest is lost.

  python -m hybrid_cache.explain --trace FILE --format {marconi,mooncake,synthetic,sharegpt} \\
      --model-config DIR [--target sm90] [--vllm-flags JSON] [--capacity-bytes 4e10] \\
      [--limit N] [--out DIR]

Prints the table (hit / evicted / not retained / below the block floor / partial block / no
state yet, then the tokens each vLLM flag or project policy recovers; `explain.py` defines
them) and, with --out, writes explain.json, requests.jsonl and explain.png. Bad input exits
with status 2 and one `error:` line.
"""

from __future__ import annotations

import sys

from hybrid_cache import cli_util
from hybrid_cache import geometry
from hybrid_cache.explain.explain import TraceArgs
from hybrid_cache.explain.explain import explain
from hybrid_cache.explain.explain import table
from hybrid_cache.explain.explain import write
from hybrid_cache.sim.cli_args import _vllm_flags_arg


def build_parser():
  p = cli_util.ArgumentParser(
    prog="python -m hybrid_cache.explain", description=__doc__.split("\n")[0]
  )
  p.add_argument("--trace", required=True, help="trace file (or a synthetic generator's name)")
  p.add_argument(
    "--format", required=True, choices=("marconi", "mooncake", "synthetic", "sharegpt")
  )
  p.add_argument(
    "--model-config", required=True, help="a Hugging Face config.json or its directory"
  )
  p.add_argument("--target", default=geometry.DEFAULT_TARGET, choices=sorted(geometry.TARGETS))
  p.add_argument(
    "--vllm-flags", type=_vllm_flags_arg, default=None, help="JSON object of vLLM flags"
  )
  p.add_argument("--capacity-bytes", type=cli_util.positive_float_arg, default=40e9)
  p.add_argument("--limit", type=cli_util.int_arg(1), default=None)
  p.add_argument("--max-input", type=cli_util.int_arg(1), default=None)
  p.add_argument("--seed", type=cli_util.int_arg(0), default=0)
  p.add_argument("--out", default=None, help="write explain.json, requests.jsonl, explain.png here")
  return p


def main(argv: list[str] | None = None) -> int:
  try:
    args = build_parser().parse_args(argv)
  except SystemExit as e:
    return e.code if isinstance(e.code, int) else cli_util.USAGE_ERROR
  try:
    flags = None if args.vllm_flags is None else args.vllm_flags.changed()
    result = explain(
      TraceArgs(args.trace, args.format, args.limit, args.max_input, args.seed),
      args.model_config,
      args.target,
      flags,
      args.capacity_bytes,
    )
    if args.out:
      write(result, args.out)
  except (ValueError, OSError, ImportError) as e:
    print(f"error: {cli_util.one_line(e)}", file=sys.stderr)
    return cli_util.USAGE_ERROR
  print(table(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
