"""State-copy bandwidth: Pallas slot-copy kernel vs XLA gather/scatter vs plain d2d copies.

  python -m experiments.bench_state_copy [--layers 18] [--heads 16] [--dk 128] [--dv 128]
      [--copies 1,8,64] [--conv_dim 6144] [--pallas_cfgs "1024,4;4096,4;8192,8"] [--repeats 20]
      [--small]

Pool: fp32 recurrent state ``[L, S, H, d_k, d_v]`` (Qwen3.5-0.8B-like default: 18 GDN layers x
16 heads x 128 x 128 = 18 MiB per slot), optionally with a bf16 conv pool ``[L, S, 3, conv_dim]``
copied in the same launch. ``S = 2 * copies + 2`` slots; each batch copies ``copies`` disjoint
slots (all layers). Bandwidth counts bytes read + written: ``2 * payload / time``.

Rows printed per batch size:
  pallas[t,w]   ``copy_state_slots(implementation="pallas", max_tile=t, num_warps=w)`` under
                ``jit`` with the pool donated
  xla           ``copy_state_slots(implementation="xla")`` (gather + scatter), pool donated
  at_set        ``pool.at[:, dst].set(pool[:, src])`` written inline, pool donated
  d2d_copy      ``jnp.copy`` of a contiguous buffer of the payload size (the d2d reference rate)
  device_put    ``jax.device_put(buf, may_alias=False)`` of the same buffer (runtime d2d memcpy)
Timing: median of ``--repeats`` calls after 3 warm-ups, ``block_until_ready`` after each call.
On CPU (``--small``) the Pallas rows run in interpret mode and only smoke-test the script.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from kernels.pallas.state_copy import api


def _time(fn, state, repeats):
  """Median seconds of ``state = fn(state)``; ``state`` is threaded so donation works."""
  for _ in range(3):
    state = fn(state)
  jax.block_until_ready(state)
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    state = fn(state)
    jax.block_until_ready(state)
    times.append(time.perf_counter() - t0)
  return statistics.median(times), state


def _bench_batch(n, layers, heads, dk, dv, conv_dim, pallas_cfgs, repeats, pallas_impl):
  """Rows for one batch of ``n`` copies (every method)."""
  slots = 2 * n + 2
  pools = (jnp.zeros((layers, slots, heads, dk, dv), jnp.float32),)
  if conv_dim:
    pools += (jnp.zeros((layers, slots, 3, conv_dim), jnp.bfloat16),)
  payload = sum(p.dtype.itemsize * p[:, :n].size for p in pools)
  src = jnp.arange(n, dtype=jnp.int32)
  dst = src + n + 1
  rows = []

  def add(name, fn, state):
    secs, state = _time(fn, state, repeats)
    rows.append(
      dict(
        copies=n,
        method=name,
        payload_mib=payload / 2**20,
        us=secs * 1e6,
        gb_s=2 * payload / secs / 1e9,
      )
    )
    return state

  def pallas_copy(p, s, d, tile, warps):
    return api.copy_state_slots(p, s, d, implementation=pallas_impl, max_tile=tile, num_warps=warps)

  def xla_copy(p, s, d):
    return api.copy_state_slots(p, s, d, implementation="xla")

  def at_set(p, s, d):
    return tuple(x.at[:, d].set(x[:, s]) for x in p)

  for tile, warps in pallas_cfgs:
    f = jax.jit(pallas_copy, donate_argnums=0, static_argnames=("tile", "warps"))
    pools = add(
      f"pallas[{tile},{warps}]",
      lambda p, f=f, tile=tile, warps=warps: f(p, src, dst, tile=tile, warps=warps),
      pools,
    )
  for name, g in (("xla", xla_copy), ("at_set", at_set)):
    f = jax.jit(g, donate_argnums=0)
    pools = add(name, lambda p, f=f: f(p, src, dst), pools)
  del pools
  buf = jnp.zeros((payload // 4,), jnp.float32)
  add("d2d_copy", jax.jit(jnp.copy), buf)
  add("device_put", lambda x: jax.device_put(x, may_alias=False), buf)
  ref = next(r["gb_s"] for r in rows if r["method"] == "d2d_copy")
  for r in rows:
    r["of_d2d"] = r["gb_s"] / ref
  return rows


def state_copy(
  layers=18,
  heads=16,
  dk=128,
  dv=128,
  copies=(1, 8, 64),
  conv_dim=0,
  pallas_cfgs=((1024, 4), (4096, 4), (8192, 8)),
  repeats=20,
):
  """Runs the benchmark; returns a list of result dicts (one per batch size and method)."""
  on_gpu = jax.default_backend() in ("gpu", "cuda")
  pallas_impl = "pallas" if on_gpu else "interpret"
  results = []
  for n in copies:
    results.extend(
      _bench_batch(n, layers, heads, dk, dv, conv_dim, pallas_cfgs, repeats, pallas_impl)
    )
  return results


def print_results(rows) -> None:
  """Prints the rows returned by ``state_copy`` as a table."""
  print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}")
  print(f"{'copies':>6} {'method':<14} {'MiB':>8} {'us':>10} {'GB/s':>8} {'of_d2d':>7}")
  for r in rows:
    print(
      f"{r['copies']:>6} {r['method']:<14} {r['payload_mib']:8.1f} {r['us']:10.1f} "
      f"{r['gb_s']:8.1f} {r['of_d2d']:7.2f}"
    )


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--layers", type=int, default=18)
  p.add_argument("--heads", type=int, default=16)
  p.add_argument("--dk", type=int, default=128)
  p.add_argument("--dv", type=int, default=128)
  p.add_argument("--copies", default="1,8,64")
  p.add_argument("--conv_dim", type=int, default=0, help="also copy a bf16 [L,S,3,conv_dim] pool")
  p.add_argument(
    "--pallas_cfgs", default="1024,4;4096,4;8192,8", help="';'-separated max_tile,num_warps"
  )
  p.add_argument("--repeats", type=int, default=20)
  p.add_argument("--small", action="store_true", help="tiny CPU smoke-test sizes")
  a = p.parse_args()
  kw = dict(
    layers=a.layers,
    heads=a.heads,
    dk=a.dk,
    dv=a.dv,
    copies=tuple(int(x) for x in a.copies.split(",")),
    conv_dim=a.conv_dim,
    pallas_cfgs=tuple(tuple(int(x) for x in c.split(",")) for c in a.pallas_cfgs.split(";")),
    repeats=a.repeats,
  )
  if a.small:
    kw.update(layers=2, heads=2, dk=16, dv=16, copies=(1, 4), pallas_cfgs=((256, 4),), repeats=3)
  print_results(state_copy(**kw))


if __name__ == "__main__":
  main()
