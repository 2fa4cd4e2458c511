"""Small simulator fixtures shared by tests (and handy in notebooks): a tiny model, traces.

`TINY`: Marconi's 7B hybrid shrunk to 1 attention + 1 recurrent layer with d = N = 1, so KV is
4 B per token and one recurrent state 34 B: capacities in the hundreds of bytes exercise
eviction on traces of a few dozen requests.
"""

from __future__ import annotations

import dataclasses

from hybrid_cache.sim import synthetic
from hybrid_cache.sim import trace as T
from hybrid_cache.sim.cost_model import get_model

M7B = get_model("marconi_7b")
TINY = dataclasses.replace(
  M7B, name="tiny", d_model=1, ssm_state_dim=1, n_attn=1, n_recurrent=1, n_mlp=1
)


def trace_of(*reqs) -> T.Trace:
  """A trace of (input tokens, output tokens) pairs, in order."""
  return T.Trace(tuple(T.token_request(i, o) for i, o in reqs))


def small_chat(n: int, seed: int = 0) -> T.Trace:
  """The first `n` requests of a seeded multi-turn chat trace over a 50-token vocabulary."""
  return synthetic.chat(
    seed=seed,
    num_sessions=max(1, n // 2),
    min_turns=4,
    max_turns=12,
    user_mean=12.0,
    out_mean=10.0,
    vocab=50,
    max_context=96,
  ).head(n)
