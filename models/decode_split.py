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


def run_recurrence(
  decode: bool,
  num_decodes: int,
  query_start_loc: jax.Array,
  per_token: Sequence[jax.Array],
  per_seq: Sequence[jax.Array],
  decode_fn: Callable[..., tuple[jax.Array, jax.Array]],
  prefill_fn: Callable[..., tuple[jax.Array, jax.Array, tuple]],
) -> tuple[jax.Array, tuple[jax.Array, tuple]]:
  """One recurrent op (a conv, a delta rule, an SSD) over a step, by the step's shape:
  a decode step (`decode`) all through `decode_fn`, a mixed step (D = `num_decodes` > 0)
  sequences [0, D) through `decode_fn` and [D, N) through `prefill_fn`, else all through
  `prefill_fn`.

  Args:
    per_token: arrays with a leading token axis [T, ...].
    per_seq: arrays with a leading sequence axis [N, ...] (initial states).
    decode_fn: (*per_token, *per_seq) -> (y, final) for one token per sequence.
    prefill_fn: (*per_token, *per_seq, query_start_loc) -> (y, final, checkpoints).
  Returns:
    (y [T, ...], (final [N, ...], checkpoints)) as `state_pool.write_recurrent` takes it: a
    decode step's checkpoints are (None, None); a mixed step's are those of sequences D..,
    written with `ckpt_write[D:]`.
  """
  if decode:
    y, final = decode_fn(*per_token, *per_seq)
    return y, (final, (None, None))
  d = num_decodes
  if not d:
    y, final, ckpts = prefill_fn(*per_token, *per_seq, query_start_loc)
    return y, (final, ckpts)
  y_d, final_d = decode_fn(*[a[:d] for a in per_token], *[s[:d] for s in per_seq])
  y_p, final_p, ckpts = prefill_fn(
    *[a[d:] for a in per_token], *[s[d:] for s in per_seq], query_start_loc[d:] - d
  )
  return jnp.concatenate([y_d, y_p]), (jnp.concatenate([final_d, final_p]), ckpts)
