"""Kernel throughput benchmarks, one function per op, compared side by side in one run.

Usage (on a GPU machine):
  PYTHONPATH=. python -m experiments.bench_kernels --op gdn [--tokens 8192,32768]

``--op gdn``: chunked GDN prefill (bf16 in, fp32 state) of one sequence at Qwen3.5-0.8B linear
attention shapes (16 key/value heads, d_k = d_v = 128): our Pallas kernel vs the chunked XLA
reference vs fla's Triton ``chunk_gated_delta_rule`` (when ``fla`` and torch are importable).
``--op ssd``: Mamba2 SSD prefill via ``experiments/bench_ssd.py`` defaults (64 heads, P=64,
N=128, 8 groups, bf16); run that module directly for its own options (packing, configs).
``--op state_copy``: batched state-slot copy bandwidth (Pallas vs XLA vs d2d copy) via
``experiments/bench_state_copy.py`` defaults (18 layers x 16 x 128 x 128 fp32 slots, 1/8/64 copies).
``--op attention``: paged attention (Pallas vs XLA reference), ``experiments/bench_attention.py``.
Prints ms per call and tokens/s: the mean over ``--iters`` back-to-back calls after one warm-up
call (JAX: host clock around the batch; torch: CUDA events around the batch).
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np


def _time_jax(fn, args, iters):
  """Mean seconds per call over ``iters`` back-to-back calls (device queue kept full)."""
  jax.block_until_ready(fn(*args))
  t0 = time.perf_counter()
  outs = [fn(*args) for _ in range(iters)]
  jax.block_until_ready(outs)
  return (time.perf_counter() - t0) / iters


def _time_torch(fn, iters):
  import torch  # noqa: PLC0415

  """Mean seconds per call over ``iters`` back-to-back calls (CUDA events)."""
  fn()
  torch.cuda.synchronize()
  start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
  start.record()
  for _ in range(iters):
    fn()
  end.record()
  torch.cuda.synchronize()
  return start.elapsed_time(end) / 1e3 / iters


def _gdn_inputs(t, h_k, h_v, d, seed=0):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((t, h_k, d), np.float32)
  k = rng.standard_normal((t, h_k, d), np.float32)
  v = rng.standard_normal((t, h_v, d), np.float32)
  g = -np.log1p(np.exp(rng.standard_normal((t, h_v)) + 1.0)).astype(np.float32)
  beta = (1.0 / (1.0 + np.exp(-rng.standard_normal((t, h_v))))).astype(np.float32)
  return q, k, v, g, beta


def bench_gdn(args):
  """GDN chunked prefill: Pallas vs XLA chunked vs fla (tokens/s)."""
  from kernels.pallas.gdn import api  # noqa: PLC0415

  h_k, h_v, d = args.heads_k, args.heads_v, 128
  print(f"device: {jax.devices()[0].device_kind}; jax {jax.__version__}")
  print(f"GDN prefill, one sequence, H_k={h_k} H_v={h_v} d={d}, bf16 in, fp32 state")
  rows = []
  for t in [int(x) for x in args.tokens.split(",")]:
    q, k, v, g, beta = _gdn_inputs(t, h_k, h_v, d)
    bf = jnp.bfloat16
    jargs = (
      jnp.asarray(q, bf), jnp.asarray(k, bf), jnp.asarray(v, bf), jnp.asarray(g),
      jnp.asarray(beta),
    )  # fmt: skip
    variants = [("xla", dict(implementation="xla"))]
    for cfg in args.pallas_cfgs.split(";"):
      fields = cfg.split(",")
      bv, nw, ns, iw = ([int(x) for x in fields[:4]] + [4])[:4]
      inv = {"b": "blocked", "p": "product"}[fields[4] if len(fields) > 4 else "p"]
      out = {"s": "parallel", "f": "fused"}[fields[5] if len(fields) > 5 else "s"]
      obv, ow, os_ = ([int(x) for x in fields[6:9]] + [64, 4, 2][len(fields[6:9]) :])[:3]
      name = f"pallas bv={bv} w={nw} s={ns} iw={iw} inv={inv[0]} out={out[0]}"
      if out == "parallel":
        name += f" obv={obv} ow={ow} os={os_}"
      variants.append((name, dict(cfg=(bv, nw, ns, iw, inv, out, obv, ow, os_))))

    def report(name, sec, t=t):  # printed as soon as measured: a timed-out run keeps its rows
      rows.append((t, name, sec))
      print(f"  T={t:6d}  {name:32s} {sec * 1e3:9.3f} ms  {t / sec / 1e6:8.2f} M tok/s", flush=True)

    for name, kw in variants:
      if "cfg" in kw:
        fn = _pallas_prefill_fn(t, h_v, d, *kw["cfg"])
      else:
        fn = jax.jit(lambda *a, kw=kw: api.chunk_gated_delta_rule(*a, **kw)[:2])
      try:
        report(name, _time_jax(fn, jargs, args.iters))
      except Exception as e:  # noqa: BLE001 - report and continue with the other variants
        print(f"  {name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    try:
      report("fla chunk_gated_delta_rule", _bench_fla(q, k, v, g, beta, args.iters))
    except Exception as e:  # noqa: BLE001
      print(f"  fla: unavailable ({type(e).__name__}: {str(e)[:200]})", flush=True)
  return rows


def _pallas_prefill_fn(
  t, h_v, d, block_v, num_warps, num_stages, intra_warps, inverse, output_pass, obv, ow, os_
):
  from kernels.pallas.gdn import pallas_gpu  # noqa: PLC0415

  def fn(q, k, v, g, b):
    return pallas_gpu.chunk_gated_delta_rule_pallas(
      q, k, v, g, b, initial_state=jnp.zeros((1, h_v, d, d), jnp.float32),
      cu_seqlens=jnp.asarray([0, t], jnp.int32), checkpoint_every=None, max_checkpoints=0,
      scale=d**-0.5, block_v=block_v, num_warps=num_warps, num_stages=num_stages,
      intra_warps=intra_warps, inverse=inverse, output_pass=output_pass, out_block_v=obv,
      out_warps=ow, out_stages=os_,
    )[:2]  # fmt: skip

  return jax.jit(fn)


def _bench_fla(q, k, v, g, beta, iters):
  import torch  # noqa: PLC0415
  from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: PLC0415

  dev = "cuda"
  tq, tk, tv = (torch.from_numpy(x)[None].to(dev, torch.bfloat16) for x in (q, k, v))
  tg, tb = (torch.from_numpy(x)[None].to(dev, torch.float32) for x in (g, beta))
  h_v, d = v.shape[1], v.shape[2]
  h0 = torch.zeros((1, h_v, d, d), device=dev, dtype=torch.float32)
  fn = functools.partial(
    chunk_gated_delta_rule, tq, tk, tv, tg, tb, scale=d**-0.5, initial_state=h0,
    output_final_state=True, use_qk_l2norm_in_kernel=True,
  )  # fmt: skip
  with torch.no_grad():
    return _time_torch(fn, iters)


def bench_ssd(args):
  """Mamba2 SSD prefill (Nemotron-H-like shapes); see ``experiments/bench_ssd.py``."""
  from experiments import bench_ssd as ssd_bench  # noqa: PLC0415

  p = argparse.ArgumentParser()
  ssd_bench.add_args(p)
  return ssd_bench.bench_ssd(p.parse_args(["--tokens", args.tokens, "--iters", str(args.iters)]))


def bench_state_copy(args):
  """State-slot copy bandwidth; see ``experiments/bench_state_copy.py`` (its own table format)."""
  from experiments import bench_state_copy as sc_bench  # noqa: PLC0415

  sc_bench.print_results(sc_bench.state_copy(repeats=args.iters))


def bench_attention(args):
  """Paged attention decode/prefill/mixed; see ``experiments/bench_attention.py``."""
  from experiments import bench_attention as attn_bench  # noqa: PLC0415

  attn_bench.print_results(attn_bench.attention(repeats=args.iters))


OPS = {
  "gdn": bench_gdn,
  "ssd": bench_ssd,
  "state_copy": bench_state_copy,
  "attention": bench_attention,
}


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--op", choices=sorted(OPS), default="gdn")
  p.add_argument("--tokens", default="8192,32768")
  p.add_argument("--heads_k", type=int, default=16)
  p.add_argument("--heads_v", type=int, default=16)
  p.add_argument("--iters", type=int, default=10)
  p.add_argument(
    "--pallas_cfgs",
    default="16,4,3,4",
    help="';'-separated block_v,num_warps,num_stages[,intra_warps[,inverse b|p[,out s|f"
    "[,out_block_v,out_warps,out_stages]]]] of the Pallas kernels (inverse: b = blocked 2x2,"
    " p = one 64x64 product form; out: s = split, state kernel + parallel output kernel,"
    " f = fused, O computed in the sequential kernel)",
  )
  args = p.parse_args()
  OPS[args.op](args)


if __name__ == "__main__":
  main()
