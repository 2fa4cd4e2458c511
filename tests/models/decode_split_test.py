"""Mixed steps (`StepInputs.num_decodes`): decodes through the decode kernels, the rest chunked.

The same step run with num_decodes = D and with num_decodes = 0 (every sequence through the
chunked kernels) gives the same logits and the same cache (fp32, 1e-5 relative: the same
recurrence through a different kernel), checkpoints of the prefill sequences included, on a
GDN model (qwen35_tiny) and a Mamba2 model (nemotron_h_tiny); padding decodes
(`runner.padding_decode`) change nothing.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import cache as cache_lib
from models import config as config_lib
from models import hybrid_lm
from models import runner
from models.runner import SeqStep
from models.testing import max_rel_diff

BS = 64
REL = 1e-5


def _random_cache(cfg, seed=0):
  cache = cache_lib.init_cache(cfg, num_blocks=24, block_size=BS)
  leaves, tree = jax.tree.flatten(cache)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  leaves = [0.5 * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)]
  return jax.tree.unflatten(tree, leaves)


def _seqs(cfg, rng):
  """Two decodes (one inside a state block, one across), a 130-token prefill chunk that writes
  two checkpoints, and a 3-token chunk: each attention group reads blocks 1.. of its own."""
  groups = len(cfg.cache_groups)

  def tables(first, n):
    return [list(range(first, first + n)) for _ in range(groups)]

  tok = lambda n: rng.integers(1, cfg.vocab_size, n).tolist()  # noqa: E731
  return [
    SeqStep(tok(1), 70, tables(1, 2), state_read=3, state_write=4),
    SeqStep(tok(1), 5, tables(5, 1), state_read=6, state_write=6),
    SeqStep(tok(130), 64, tables(7, 4), state_read=11, state_write=12, ckpt_write=(13, 14)),
    SeqStep(tok(3), 10, tables(15, 1), state_read=16, state_write=17),
  ]


def _run(model, cache, seqs, num_decodes, cfg):
  inputs = runner.build_step_inputs(
    cfg,
    seqs,
    BS,
    ckpt_every=64,
    num_ckpt_cols=2,
    max_blocks=4,
    pad_tokens=256,
    pad_seqs=len(seqs) + 2,
    num_decodes=num_decodes,
  )
  logits, new = jax.jit(lambda c, i: model(c, i))(cache, inputs)
  return np.asarray(logits), new, np.asarray(inputs.query_start_loc)


@pytest.mark.parametrize("preset", ["qwen35_tiny", "nemotron_h_tiny"])
def test_mixed_step_equals_all_chunked(preset):
  cfg = config_lib.get_preset(preset)
  model = hybrid_lm.build_model(cfg, seed=0)
  cache = _random_cache(cfg)
  seqs = _seqs(cfg, np.random.default_rng(0))
  base_logits, base_cache, qsl = _run(model, cache, seqs, 0, cfg)
  # two real decodes, then two padding decodes fill the bucket of 4
  padded = seqs[:2] + [runner.padding_decode(cfg)] * 2 + seqs[2:]
  for d, step in ((2, seqs), (4, padded)):
    logits, new, qsl_d = _run(model, cache, step, d, cfg)
    rows = [i for i, s in enumerate(step) if s.num_computed or i < 2]
    rows_base = [0, 1, 2, 3]
    for i, j in zip(rows, rows_base, strict=True):
      got = logits[qsl_d[i] : qsl_d[i + 1]]
      want = base_logits[qsl[j] : qsl[j + 1]]
      assert max_rel_diff(got, want) <= REL, (preset, d, i)
    for name, got, want in zip(
      new.__dataclass_fields__, jax.tree.leaves(new), jax.tree.leaves(base_cache), strict=True
    ):
      assert got.shape == want.shape
      if got.size:
        assert max_rel_diff(np.asarray(got), np.asarray(want)) <= REL, (preset, d, name)
  # the checkpoints were really written (a mixed step must not drop them)
  pools = (
    (base_cache.gdn_state, cache.gdn_state)
    if preset == "qwen35_tiny"
    else (
      base_cache.mamba_state,
      cache.mamba_state,
    )
  )
  assert not jnp.allclose(pools[0][:, 13], pools[1][:, 13])


def test_num_decodes_bad_input():
  cfg = config_lib.qwen35_tiny()
  one = SeqStep([1], 3, [[3], [4]], 3, 3)
  two = SeqStep([1, 2], 0, [[3], [4]])
  with pytest.raises(ValueError, match="one token in each"):
    runner.build_step_inputs(cfg, [two, one], 8, num_decodes=1)
  with pytest.raises(ValueError, match="num_decodes must be in"):
    runner.build_step_inputs(cfg, [one, one], 8, num_decodes=2)
  with pytest.raises(ValueError, match="decode step"):
    runner.build_step_inputs(cfg, [one, one], 8, num_decodes=1, decode=True)
