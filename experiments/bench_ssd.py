"""Mamba2 SSD prefill throughput: our Pallas kernel vs the chunked XLA reference vs mamba_ssm.

Usage (on a GPU machine):
  PYTHONPATH=. python -m experiments.bench_ssd [--tokens 8192,32768] [--seqs 1]
      [--pallas_cfgs "64,64,4,1;128,64,4,1;64,32,4,1"]

Shapes default to Nemotron-H-like Mamba2 layers: 64 heads of P = 64, state N = 128, 8 groups,
bf16 inputs, fp32 state; ``--seqs`` packs that many equal-length sequences into the token count.
Pallas configs are ``chunk,block_p,num_warps,num_stages[,fused|parallel]`` (the two
algorithms of ``kernels/pallas/ssd/pallas_gpu.py``). mamba_ssm's Triton
``mamba_chunk_scan_combined`` (chunk 256 by default, as in its Mamba2 module) runs on the same
inputs when importable; otherwise "mamba_ssm not installed" is printed. Prints the mean time per
call over ``--iters`` back-to-back calls after one warm-up call (JAX: host clock around the
batch; torch: CUDA events), tokens/s and the ratio to the XLA reference. Checks the
Pallas output against XLA (relative RMS) so a fast-but-wrong config is visible.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np


def _time_jax(fn, args, iters):
  """Mean seconds per call over ``iters`` back-to-back calls (same method as bench_kernels)."""
  jax.block_until_ready(fn(*args))
  t0 = time.perf_counter()
  outs = [fn(*args) for _ in range(iters)]
  jax.block_until_ready(outs)
  return (time.perf_counter() - t0) / iters


def _inputs(t, h, p, g, n, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((t, h, p), np.float32)
  dt = (rng.standard_normal((t, h)) - 2.0).astype(np.float32)
  a = -np.exp(rng.uniform(0.0, 2.0, (h,))).astype(np.float32)
  b = (rng.standard_normal((t, g, n)) / np.sqrt(n)).astype(np.float32)
  c = rng.standard_normal((t, g, n), np.float32)
  d = rng.standard_normal((h,), np.float32)
  bias = rng.standard_normal((h,), np.float32) * 0.5
  return x, dt, a, b, c, d, bias


def _rel_rms(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.sqrt(np.mean((a - b) ** 2) / max(np.mean(b**2), 1e-30)))


def bench_ssd(args):
  """SSD chunked prefill tokens/s: Pallas configs vs XLA vs mamba_ssm."""
  from kernels.pallas.ssd import api  # noqa: PLC0415
  from kernels.pallas.ssd import pallas_gpu  # noqa: PLC0415

  h, p, n, g = args.heads, args.head_dim, args.state, args.groups
  print(f"device: {jax.devices()[0].device_kind}; jax {jax.__version__}")
  print(f"command: {' '.join(sys.argv)}")
  print(f"SSD prefill, H={h} P={p} N={n} G={g}, {args.seqs} seq(s), bf16 in, fp32 state")
  rows = []
  for t in [int(v) for v in args.tokens.split(",")]:
    x, dt, a, b, c, d, bias = _inputs(t, h, p, g, n)
    bf = jnp.bfloat16
    jargs = (jnp.asarray(x, bf), jnp.asarray(dt), jnp.asarray(a), jnp.asarray(b, bf),
             jnp.asarray(c, bf), jnp.asarray(d), jnp.asarray(bias))  # fmt: skip
    cu = jnp.asarray(np.linspace(0, t, args.seqs + 1).astype(np.int32))
    res, outs = {}, {}

    cu = None if args.seqs == 1 else cu

    def xla_fn(x, dt, a, b, c, d, bias, cu=cu):
      return api.chunk_scan(x, dt, a, b, c, D=d, dt_bias=bias, cu_seqlens=cu,
                            chunk_size=args.xla_chunk, implementation="xla")[:2]  # fmt: skip

    variants = [(f"xla chunk={args.xla_chunk}", jax.jit(xla_fn))]
    for cfg in args.pallas_cfgs.split(";"):
      fields = cfg.split(",")
      ch, bp, nw, ns = (int(v) for v in fields[:4])
      alg = fields[4] if len(fields) > 4 else "fused"

      def pl_fn(x, dt, a, b, c, d, bias, ch=ch, bp=bp, nw=nw, ns=ns, alg=alg, cu=cu):
        return pallas_gpu.ssd_chunk_scan(
          x, dt, a, b, c, D=d, dt_bias=bias, cu_seqlens=cu,
          chunk_size=ch, block_p=bp, num_warps=nw, num_stages=ns, algorithm=alg,
        )[:2]  # fmt: skip

      variants.append((f"pallas {alg} C={ch} bp={bp} w={nw} s={ns}", jax.jit(pl_fn)))
    for name, fn in variants:
      try:
        res[name] = _time_jax(fn, jargs, args.iters)
        outs[name] = fn(*jargs)
      except Exception as e:  # noqa: BLE001 - report and continue with the other variants
        print(f"  {name}: FAILED {type(e).__name__}: {str(e)[:300]}")
    try:
      res[f"mamba_ssm chunk={args.mamba_chunk}"] = _bench_mamba(x, dt, a, b, c, d, bias, args)
    except ImportError:
      print("  mamba_ssm not installed")
    except Exception as e:  # noqa: BLE001
      print(f"  mamba_ssm: FAILED {type(e).__name__}: {str(e)[:300]}")
    base_name = variants[0][0]
    base = res.get(base_name)
    for name, sec in res.items():
      err = ""
      if name in outs and base_name in outs and name != base_name:
        y_err = _rel_rms(outs[name][0], outs[base_name][0])
        s_err = _rel_rms(outs[name][1], outs[base_name][1])
        err = f"  relRMS vs xla y={y_err:.1e} state={s_err:.1e}"
      ratio = f"{base / sec:6.2f}x xla" if base else ""
      rows.append((t, name, sec))
      print(f"  T={t:6d}  {name:30s} {sec * 1e3:9.3f} ms  {t / sec / 1e6:8.2f} M tok/s  "
            f"{ratio}{err}")  # fmt: skip
  return rows


def _bench_mamba(x, dt, a, b, c, d, bias, args):
  import torch  # noqa: PLC0415
  from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined  # noqa: PLC0415

  dev = "cuda"
  to = lambda v, dtype: torch.from_numpy(v).to(dev, dtype)
  tx, tb, tc = (to(v, torch.bfloat16)[None] for v in (x, b, c))
  tdt = to(dt, torch.float32)[None]
  ta, td, tbias = (to(v, torch.float32) for v in (a, d, bias))
  t = x.shape[0]
  seq_idx = None
  if args.seqs > 1:
    bounds = np.linspace(0, t, args.seqs + 1).astype(np.int64)
    ids = np.searchsorted(bounds[1:], np.arange(t), side="right").astype(np.int32)
    seq_idx = torch.from_numpy(ids)[None].to(dev)

  def fn():
    return mamba_chunk_scan_combined(
      tx, tdt, ta, tb, tc, args.mamba_chunk, D=td, dt_bias=tbias, dt_softplus=True,
      seq_idx=seq_idx, return_final_states=args.seqs == 1,
    )  # fmt: skip

  with torch.no_grad():
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.iters):
      fn()
    end.record()
    torch.cuda.synchronize()
  return start.elapsed_time(end) / 1e3 / args.iters


def add_args(p: argparse.ArgumentParser) -> None:
  p.add_argument("--tokens", default="8192,32768")
  p.add_argument("--seqs", type=int, default=1)
  p.add_argument("--heads", type=int, default=64)
  p.add_argument("--head_dim", type=int, default=64)
  p.add_argument("--state", type=int, default=128)
  p.add_argument("--groups", type=int, default=8)
  p.add_argument("--iters", type=int, default=10)
  p.add_argument("--xla_chunk", type=int, default=128)
  p.add_argument("--mamba_chunk", type=int, default=256)
  p.add_argument(
    "--pallas_cfgs",
    default=(
      "64,64,4,1;64,64,8,1;128,64,8,1;64,32,4,1;64,64,4,2;"
      "64,64,4,1,parallel;128,64,4,1,parallel;64,32,4,1,parallel"
    ),
    help="';'-separated chunk,block_p,num_warps,num_stages[,fused|parallel]",
  )


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_args(p)
  bench_ssd(p.parse_args())


if __name__ == "__main__":
  main()
