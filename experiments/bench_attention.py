"""Paged attention speed: Pallas (Triton) kernel vs the XLA gather reference.

  python -m experiments.bench_attention [--hq 8] [--hkv 2] [--d 256] [--block_size 16]
      [--window 0] [--repeats 10] [--small]

Cases (bf16 q/k/v, fp32 softmax), Qwen3.5-0.8B-like attention heads by default:
  decode   64 sequences x 4096 context, one query each (query_start_loc=None)
  prefill  one 2048-token chunk on top of 2048 cached tokens
  mixed    the prefill chunk plus 63 decodes in one ragged batch
Prints the median time and, for decode, the effective KV read bandwidth (K+V bytes of all attended
positions / time). Timing: median of ``--repeats`` calls after 2 warm-ups.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from kernels.pallas.attention import api


def _time(fn, args, repeats):
  for _ in range(2):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def _case(q_lens, seq_lens, hq, hkv, d, bs, seed=0):
  rng = np.random.default_rng(seed)
  seq_lens = np.asarray(seq_lens, np.int32)
  max_blocks = int(-(-seq_lens.max() // bs))
  n = len(seq_lens)
  num_blocks = n * max_blocks + 1
  bt = (1 + rng.permutation(num_blocks - 1)[: n * max_blocks]).reshape(n, max_blocks)
  kp = jnp.asarray(rng.standard_normal((num_blocks, bs, hkv, d)), jnp.bfloat16)
  vp = jnp.asarray(rng.standard_normal((num_blocks, bs, hkv, d)), jnp.bfloat16)
  qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
  q = jnp.asarray(rng.standard_normal((int(qsl[-1]), hq, d)), jnp.bfloat16)
  return q, kp, vp, jnp.asarray(bt, jnp.int32), jnp.asarray(seq_lens), jnp.asarray(qsl)


def attention(hq=8, hkv=2, d=256, block_size=16, window=None, repeats=10, scale_down=1):
  """Returns result dicts for the decode / prefill / mixed cases and both implementations."""
  ctx = 4096 // scale_down
  chunk = 2048 // scale_down
  n_dec = max(2, 64 // scale_down)
  cases = {
    "decode": ([1] * n_dec, [ctx] * n_dec, True),
    "prefill": ([chunk], [2 * chunk], False),
    "mixed": ([chunk] + [1] * (n_dec - 1), [2 * chunk] + [ctx] * (n_dec - 1), False),
  }
  pallas = "pallas" if jax.default_backend() in ("gpu", "cuda") else "interpret"
  rows = []
  for name, (q_lens, seq_lens, decode) in cases.items():
    args = _case(q_lens, seq_lens, hq, hkv, d, block_size)
    num_tokens = int(args[0].shape[0])
    attended = sum(min(s, window or s) for s in seq_lens)
    kv_bytes = 2 * attended * hkv * d * 2
    for impl in ("xla", pallas):
      f = jax.jit(
        lambda q, kp, vp, bt, sl, qsl, impl=impl, decode=decode: api.paged_attention(
          q, kp, vp, bt, sl, query_start_loc=None if decode else qsl, window=window,
          implementation=impl,
        )
      )  # fmt: skip
      secs = _time(f, args, repeats)
      rows.append(
        dict(
          case=name, impl=impl, tokens=num_tokens, us=secs * 1e6,
          tok_s=num_tokens / secs, kv_gb_s=kv_bytes / secs / 1e9,
        )
      )  # fmt: skip
  return rows


def print_results(rows) -> None:
  """Prints the rows returned by ``attention`` as a table."""
  print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}")
  print(f"{'case':<8} {'impl':<10} {'tokens':>7} {'us':>10} {'tok/s':>12} {'KV GB/s':>8}")
  for r in rows:
    print(
      f"{r['case']:<8} {r['impl']:<10} {r['tokens']:>7} {r['us']:10.1f} {r['tok_s']:12.0f} "
      f"{r['kv_gb_s']:8.1f}"
    )


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--hq", type=int, default=8)
  p.add_argument("--hkv", type=int, default=2)
  p.add_argument("--d", type=int, default=256)
  p.add_argument("--block_size", type=int, default=16)
  p.add_argument("--window", type=int, default=0, help="0 = full attention")
  p.add_argument("--repeats", type=int, default=10)
  p.add_argument("--small", action="store_true", help="tiny CPU smoke-test sizes")
  a = p.parse_args()
  kw = dict(
    hq=a.hq, hkv=a.hkv, d=a.d, block_size=a.block_size, window=a.window or None,
    repeats=a.repeats,
  )  # fmt: skip
  if a.small:
    kw.update(hq=4, hkv=2, d=16, repeats=2, scale_down=64)
  print_results(attention(**kw))


if __name__ == "__main__":
  main()
