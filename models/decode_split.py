"""Mixed steps: the leading one-token sequences run the decode kernels, the rest the chunked ones.

A continuous-batching step mixes decodes (one token per sequence) with prefill chunks. The
chunked recurrent kernels (GDN delta rule, Mamba2 SSD, the causal conv) give every sequence at
least one whole chunk (64 tokens), so a step of 8 decodes and one 200-token chunk pays for
~8 x 64 + 256 token positions of recurrence; the decode kernels take one recurrence step per
sequence. vLLM orders a step's decodes first for the same reason (its Mamba metadata builder's
`num_decodes` split, `reorder_batch_threshold = 1`).

Contract (`StepInputs.num_decodes` = D, static): sequences [0, D) own one token each, tokens
[0, D); sequences [D, N) own tokens [D, T) (query_start_loc[D] == D). The split is exact: the
same recurrence per sequence, run by a different kernel (`tests/models/decode_split_test.py`).

Measured (mid-size Qwen3.5-like model, CPU, `BENCHMARKS.md` "Serving"): see there.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence

import jax
import jax.numpy as jnp


def split_decodes(
  num_decodes: int,
  query_start_loc: jax.Array,
  per_token: Sequence[jax.Array | None],
  per_seq: Sequence[jax.Array],
  decode_fn: Callable[..., tuple[jax.Array, jax.Array]],
  prefill_fn: Callable[..., tuple[jax.Array, jax.Array, tuple]],
) -> tuple[jax.Array, jax.Array, tuple]:
  """Runs sequences [0, D) through `decode_fn` and [D, N) through `prefill_fn`.

  Args:
    num_decodes: D (static), 0 < D < N.
    query_start_loc: int32[N+1] of the whole step.
    per_token: arrays with a leading token axis [T, ...] (None passes through as None).
    per_seq: arrays with a leading sequence axis [N, ...] (initial states).
    decode_fn: (*per_token[:D], *per_seq[:D]) -> (y [D, ...], final [D, ...]).
    prefill_fn: (*per_token[D:], *per_seq[D:], query_start_loc[D:] - D) ->
      (y [T-D, ...], final [N-D, ...], checkpoints of sequences D.. as the kernel returns them).
  Returns:
    (y [T, ...], final [N, ...], the prefill part's checkpoints): their rows belong to
    sequences D.., so the caller writes them with `ckpt_write[D:]`.
  """
  d = num_decodes

  def cut(a, sl):
    return None if a is None else a[sl]

  y_d, final_d = decode_fn(*[cut(a, slice(None, d)) for a in per_token], *[s[:d] for s in per_seq])
  y_p, final_p, ckpts = prefill_fn(
    *[cut(a, slice(d, None)) for a in per_token],
    *[s[d:] for s in per_seq],
    query_start_loc[d:] - d,
  )
  return jnp.concatenate([y_d, y_p]), jnp.concatenate([final_d, final_p]), ckpts
