"""Every Pallas kernel of ``kernels/pallas/*/pallas_gpu.py`` lowers for CUDA on a CPU host.

The per-op test files cross-lower their kernels over several shapes; this file is the coverage
gate: it lowers every implementation switch once (bf16 activations, fp32 states, production-like
head dims) while recording which kernel functions reach ``pl.pallas_call``, and fails when a
module-level ``*kernel`` function of any ``pallas_gpu`` module was not lowered, so a new kernel
cannot land without CUDA lowering coverage.
"""

import functools
import importlib
import inspect

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

_OPS = ("gdn", "ssd", "conv1d", "state_copy", "attention")
_MODULES = {op: importlib.import_module(f"kernels.pallas.{op}.pallas_gpu") for op in _OPS}
spec = jax.ShapeDtypeStruct
BF16, F32, I32 = jnp.bfloat16, jnp.float32, jnp.int32


def _kernel_functions(module):
  """Module-level functions named ``*kernel`` defined in ``module`` (the kernel bodies)."""
  return {
    f
    for name, f in vars(module).items()
    if name.endswith("kernel") and inspect.isfunction(f) and f.__module__ == module.__name__
  }


def _lower(fn, *args, donate=()):
  lowered = jax.jit(fn, donate_argnums=donate).trace(*args).lower(lowering_platforms=("cuda",))
  return lowered.as_text()


def _gdn_cases():
  from kernels.pallas.gdn import pallas_gpu  # noqa: PLC0415

  t, n, kk, h_k, h_v, d = 256, 2, 4, 2, 4, 128
  tok = (spec((t, h_k, d), BF16),) * 2 + (spec((t, h_v, d), BF16),) + (spec((t, h_v), F32),) * 2
  init, cu = spec((n, h_v, d, d), F32), spec((n + 1,), I32)
  for inverse, output_pass in [("blocked", "parallel"), ("product", "fused")]:
    fn = functools.partial(
      lambda q, k, v, g, b, s0, cu, **kw: pallas_gpu.chunk_gated_delta_rule_pallas(
        q, k, v, g, b, initial_state=s0, cu_seqlens=cu, checkpoint_every=128,
        max_checkpoints=2, scale=0.1, **kw,
      ),
      inverse=inverse, output_pass=output_pass,
    )  # fmt: skip
    yield f"gdn prefill {inverse}/{output_pass}", fn, (*tok, init, cu), ()
  pool, idx = spec((8, h_v, d, d), F32), spec((n,), I32)
  step = tuple(spec((n,) + x.shape[1:], x.dtype) for x in tok)
  decode = lambda q, k, v, g, b, p, r, w: pallas_gpu.decode_pallas(  # noqa: E731
    q, k, v, g, b, state_pool=p, read_indices=r, write_indices=w, scale=0.1
  )
  yield "gdn decode", decode, (*step, pool, idx, idx), (5,)
  win = tuple(spec((n, kk) + x.shape[1:], x.dtype) for x in tok)
  verify = lambda q, k, v, g, b, p, r: pallas_gpu.verify_pallas(  # noqa: E731
    q, k, v, g, b, state_pool=p, read_indices=r, scale=0.1
  )
  yield "gdn verify", verify, (*win, pool, idx), ()


def _ssd_cases():
  from kernels.pallas.ssd import pallas_gpu  # noqa: PLC0415

  t, h, p, g, n, nb, s = 256, 4, 64, 2, 128, 3, 4

  def inputs(lead):
    return (
      spec(lead + (h, p), BF16), spec(lead + (h,), BF16), spec((h,), F32),
      spec(lead + (g, n), BF16), spec(lead + (g, n), BF16), spec((h,), F32), spec((h,), F32),
    )  # fmt: skip

  for algorithm in ("fused", "parallel"):
    fn = functools.partial(
      lambda x, dt, a, b, c, d, bias, s0, cu, algorithm: pallas_gpu.ssd_chunk_scan(
        x, dt, a, b, c, D=d, dt_bias=bias, initial_state=s0, cu_seqlens=cu, chunk_size=64,
        checkpoint_every=128, max_checkpoints=2, algorithm=algorithm,
      ),
      algorithm=algorithm,
    )  # fmt: skip
    args = (*inputs((t,)), spec((2, h, p, n), F32), spec((3,), I32))
    yield f"ssd prefill {algorithm}", fn, args, ()
  pool, idx = spec((8, h, p, n), F32), spec((nb,), I32)
  decode = lambda x, dt, a, b, c, d, bias, pool, r, w: pallas_gpu.ssd_decode(  # noqa: E731
    x, dt, a, b, c, D=d, dt_bias=bias, state_pool=pool, read_indices=r, write_indices=w
  )
  yield "ssd decode", decode, (*inputs((nb,)), pool, idx, idx), (7,)
  verify = lambda x, dt, a, b, c, d, bias, pool, r: pallas_gpu.ssd_verify(  # noqa: E731
    x, dt, a, b, c, D=d, dt_bias=bias, state_pool=pool, read_indices=r
  )
  yield "ssd verify", verify, (*inputs((nb, s)), pool, idx), ()


def _conv_cases():
  from kernels.pallas.conv1d import pallas_gpu  # noqa: PLC0415

  t, d, k, n = 300, 6144, 4, 3
  prefill = lambda x, w, st, cu: pallas_gpu.causal_conv1d(  # noqa: E731
    x, w, None, conv_state=st, cu_seqlens=cu, checkpoint_every=64, max_checkpoints=4
  )
  args = (spec((t, d), BF16), spec((d, k), BF16), spec((n, d, k - 1), BF16), spec((n + 1,), I32))
  yield "conv prefill", prefill, args, ()
  update = lambda x, w, b, pool, r, wr: pallas_gpu.causal_conv1d_update(  # noqa: E731
    x, w, b, state_pool=pool, read_indices=r, write_indices=wr
  )
  idx = spec((n,), I32)
  args = (spec((n, d), BF16), spec((d, k), BF16), spec((d,), BF16), spec((8, d, k - 1), BF16))
  yield "conv update", update, (*args, idx, idx), (3,)


def _state_copy_cases():
  from kernels.pallas.state_copy import api  # noqa: PLC0415

  ssm, conv = spec((18, 9, 16, 128, 128), F32), spec((18, 9, 3, 6144), BF16)
  idx = spec((8,), I32)
  copy = lambda ssm, conv, src, dst, layers, shift: api.copy_state_slots(  # noqa: E731
    (ssm, conv), src, dst, layers=layers, conv_shift=(None, shift), implementation="pallas"
  )
  yield "state copy", copy, (ssm, conv, idx, idx, idx, idx), (0, 1)


def _attention_cases():
  from kernels.pallas.attention import api  # noqa: PLC0415

  t, n, nb, bs, hq, hkv, d = 96, 8, 64, 16, 16, 4, 256
  pages = spec((nb, bs, hkv, d), BF16)
  meta = (spec((n, 16), I32), spec((n,), I32), spec((n + 1,), I32))
  for window in (None, 128):
    fn = functools.partial(
      lambda q, kp, vp, bt, sl, qsl, window: api.paged_attention(
        q, kp, vp, bt, sl, query_start_loc=qsl, window=window, implementation="pallas"
      ),
      window=window,
    )
    yield f"attention window={window}", fn, (spec((t, hq, d), BF16), pages, pages, *meta), ()
  decode = lambda q, kp, vp, bt, sl: api.paged_attention(  # noqa: E731
    q, kp, vp, bt, sl, window=32, implementation="pallas"
  )
  yield "attention decode", decode, (spec((n, hq, d), BF16), pages, pages, *meta[:2]), ()


_CASES = {"gdn": _gdn_cases, "ssd": _ssd_cases, "conv1d": _conv_cases}
_CASES.update(state_copy=_state_copy_cases, attention=_attention_cases)


@pytest.mark.parametrize("op", _OPS)
def test_every_pallas_kernel_lowers_for_cuda(op, monkeypatch):
  seen, names = set(), set()
  real = pl.pallas_call

  def recording_pallas_call(kernel, *args, **kwargs):
    seen.add(getattr(kernel, "func", kernel))
    if kwargs.get("name"):
      names.add(kwargs["name"])
    return real(kernel, *args, **kwargs)

  monkeypatch.setattr(pl, "pallas_call", recording_pallas_call)
  for label, fn, args, donate in _CASES[op]():
    text = _lower(fn, *args, donate=donate)
    assert "xla.gpu.triton" in text, label
  missing = {f.__name__ for f in _kernel_functions(_MODULES[op]) - seen}
  assert not missing, f"{op}: kernels never lowered for CUDA: {sorted(missing)}"
  assert names, f"{op}: no named pallas_call was lowered"


def test_gate_sees_every_pallas_gpu_module():
  """Each op folder with a pallas_gpu.py is listed, and each defines at least one kernel."""
  import pathlib  # noqa: PLC0415

  root = pathlib.Path(_MODULES["gdn"].__file__).parents[1]
  found = {p.parent.name for p in root.glob("*/pallas_gpu.py")}
  assert found == set(_OPS)
  for op, module in _MODULES.items():
    assert _kernel_functions(module), op
