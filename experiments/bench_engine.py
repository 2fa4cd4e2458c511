"""Engine benchmark on CPU: prefill and decode tokens/s of each preset, and the shared-prefix
latency ratio (align + Marconi admission vs caching off) measured side by side in one run.

  python -m experiments.bench_engine [--presets=qwen35_tiny,...] [--num_prompts=20]
      [--implementation=xla|pallas|interpret]

Prints a table and the command; every number comes from this one process (compilations are
excluded: each configuration runs once untimed first). Decode is timed twice per preset, side
by side in interleaved rounds (best of 3): through the recurrent decode kernels (the engine's
default) and through the chunked prefill kernels (`Engine(decode_kernels=False)`, the earlier
path).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import numpy as np
from absl import app
from absl import flags

from hybrid_cache.engine import workload as engine_workload
from hybrid_cache.engine.config import cache_config_for
from hybrid_cache.engine.engine import Engine
from models.config import PRESETS

_PRESETS = flags.DEFINE_list("presets", sorted(PRESETS), "Presets to time.")
_PREFILL = flags.DEFINE_integer("prefill_len", 256, "Prompt tokens per request (throughput).")
_BATCH = flags.DEFINE_integer("batch", 4, "Concurrent requests (throughput).")
_DECODE = flags.DEFINE_integer("decode_len", 32, "Generated tokens per request (throughput).")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 20, "Shared-prefix prompts.")
_PREFIX = flags.DEFINE_integer("prefix_len", 500, "Shared prefix length.")
_IMPL = flags.DEFINE_enum(
  "implementation", None, ["xla", "pallas", "interpret"], "Kernels (default: by backend)."
)


def _engine(
  preset: str,
  prefill_len: int,
  batch: int,
  decode_len: int,
  decode_kernels: bool,
  implementation: str | None = None,
):
  budget = batch * prefill_len
  cc = cache_config_for(
    preset,
    enable_prefix_caching=False,
    num_blocks=batch * (-(-(prefill_len + decode_len) // 16)) * 3 + 8,
    max_num_batched_tokens=budget,
    max_model_len=prefill_len + decode_len,
    max_requests=batch,
  )
  return Engine(
    preset,
    cc,
    seed=0,
    token_buckets=(batch, budget),
    seq_buckets=(2 * batch,),
    decode_kernels=decode_kernels,
    implementation=implementation,
  )


def _time_round(eng: Engine, prompts: list[list[int]], decode_len: int) -> tuple[float, float]:
  """(prefill s of one step over every prompt, decode s of the remaining decode_len - 1)."""
  for p in prompts:
    eng.add_request(p, decode_len)
  t0 = time.perf_counter()
  eng.step()  # one step: every prompt in full
  t1 = time.perf_counter()
  eng.run()
  t2 = time.perf_counter()
  return t1 - t0, t2 - t1


def throughput(
  preset: str,
  prefill_len: int,
  batch: int,
  decode_len: int,
  rounds: int = 3,
  implementation: str | None = None,
) -> dict[str, float]:
  """Prefill tok/s (all prompts at once, budget = batch * prompt) and decode tok/s.

  Decode runs through the recurrent decode kernels (the engine's default) and through the
  chunked prefill kernels (`decode_kernels=False`, the path before them), in interleaved
  rounds after one untimed (compiling) round each; each figure is the best round.
  """
  rng = np.random.RandomState(0)
  prompts = [rng.randint(0, 256, prefill_len).tolist() for _ in range(batch)]
  engines = {
    k: _engine(preset, prefill_len, batch, decode_len, k, implementation) for k in (True, False)
  }
  for eng in engines.values():
    _time_round(eng, prompts, decode_len)  # compile
  best = {k: [float("inf"), float("inf")] for k in engines}
  for _ in range(rounds):
    for k, eng in engines.items():
      for i, t in enumerate(_time_round(eng, prompts, decode_len)):
        best[k][i] = min(best[k][i], t)
  decoded = batch * (decode_len - 1)
  return {
    "prefill_tok_s": batch * prefill_len / best[True][0],
    "decode_tok_s": decoded / best[True][1],
    "decode_step_ms": best[True][1] / (decode_len - 1) * 1e3,
    "chunked_decode_step_ms": best[False][1] / (decode_len - 1) * 1e3,
  }


def main(argv: Sequence[str]) -> None:
  del argv
  print("command:", " ".join(["python -m experiments.bench_engine"] + sys.argv[1:]))
  print(
    f"\n{'preset':18s}{'prefill tok/s':>15s}{'decode tok/s':>14s}{'decode step ms':>16s}"
    f"{'chunked-kernel decode step ms':>31s}{'ratio':>7s}"
  )
  for p in _PRESETS.value:
    r = throughput(p, _PREFILL.value, _BATCH.value, _DECODE.value, implementation=_IMPL.value)
    old = r["chunked_decode_step_ms"]
    print(
      f"{p:18s}{r['prefill_tok_s']:15.0f}{r['decode_tok_s']:14.1f}{r['decode_step_ms']:16.1f}"
      f"{old:31.1f}{old / r['decode_step_ms']:7.1f}x",
      flush=True,
    )
  prompts = engine_workload.shared_prefix_prompts(0, _NUM_PROMPTS.value, _PREFIX.value, 24)
  arms = {k: engine_workload.STANDARD_ARMS[k] for k in ("off", "vllm_default")}
  common = dict(num_blocks=512, max_num_batched_tokens=1024, max_model_len=1024, max_requests=1)
  res = engine_workload.compare_arms(
    "qwen35_tiny",
    arms,
    prompts,
    4,
    common=common,
    repeats=3,
    engine_kwargs=dict(max_num_seqs=1, token_buckets=(32, 512, 1024), implementation=_IMPL.value),
  )
  off, on = res["off"], res["vllm_default"]
  print(
    f"\nshared prefix ({_NUM_PROMPTS.value} prompts, prefix {_PREFIX.value}, qwen35_tiny): "
    f"off {off['wall_s']:.3f}s, vllm_default {on['wall_s']:.3f}s, "
    f"latency ratio {on['latency_ratio_vs_off']:.3f}, cached {on['cached_tokens']} tokens, "
    f"outputs equal {on['outputs_equal_to_off']}"
  )


if __name__ == "__main__":
  app.run(main)
