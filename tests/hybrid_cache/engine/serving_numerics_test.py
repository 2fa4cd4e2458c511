"""The "serving" numerics contract (bf16, fast dots; `engine_config.NUMERICS`): a statistical
bound, as serving engines state theirs, instead of fp32's 1e-5 (`exactness_test.py`).

Over 32 prompts that share a 96-token prefix (6 blocks: every prompt after the first hits it),
served with prefix caching off and on, in bf16:
  * greedy agreement: the first generated token equal on >= 31 of 32 prompts;
  * mean KL(uncached || cached) of the first next-token distributions at temperature 1
    <= 2.5e-3 (SGLang's bound for Qwen3-Next);
  * a cached recurrent state (GDN / Mamba2 state and conv state after the prefix, written
    while the prompt was prefilled in chunks) equals the state recomputed in one pass within
    2e-2 relative (bf16 activations; the states themselves are fp32).
The model: random weights with the LM head scaled by 4 (peaked next-token distributions, so
greedy agreement is not decided by near ties). Measured when written (CPU): 32 / 32 agree,
mean KL 5e-5 (GDN) and 0 (Mamba2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_cache.engine.config import cache_config_for
from hybrid_cache.engine.engine import Engine
from hybrid_cache.engine.workload import shared_prefix_prompts
from models.config import get_preset
from models.hybrid_lm import build_model
from models.testing import ToyDriver
from models.testing import max_rel_diff

NUM_PROMPTS, PREFIX, SUFFIX = 32, 96, 24
HEAD_SCALE = 4.0
KL_BOUND = 2.5e-3
MIN_AGREEING = 31
STATE_RTOL = 2e-2
CACHE = dict(
  block_size=16, num_blocks=256, max_model_len=256, max_num_batched_tokens=64, max_requests=8
)


def _peaked_model(preset: str):
  model = build_model(get_preset(preset, dtype="bfloat16"), seed=0)
  model.lm_head.kernel[...] = model.lm_head.kernel[...] * HEAD_SCALE
  return model


def _serve(model, **cache):
  cfg = cache_config_for(model, **CACHE, **cache)
  eng = Engine(model, cfg, numerics="serving", token_buckets=(64,), seq_buckets=(8,))
  prompts = shared_prefix_prompts(1, NUM_PROMPTS, PREFIX, SUFFIX)
  return eng.generate(prompts, 2, return_logits=True)


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
  p = jax.nn.log_softmax(jnp.asarray(p_logits, jnp.float32), -1)
  q = jax.nn.log_softmax(jnp.asarray(q_logits, jnp.float32), -1)
  return np.asarray(jnp.sum(jnp.exp(p) * (p - q), -1))


@pytest.mark.parametrize("preset", ["qwen35_tiny", "nemotron_h_tiny"])
def test_bf16_cached_serving_meets_the_statistical_bound(preset):
  model = _peaked_model(preset)
  off = _serve(model, enable_prefix_caching=False)
  on = _serve(model)
  # every prompt after the first two hits the whole prefix (the second one the first chunk)
  assert sum(o.num_cached_tokens for o in on) >= (NUM_PROMPTS - 2) * PREFIX
  agree = sum(a.output_tokens[0] == b.output_tokens[0] for a, b in zip(on, off, strict=True))
  assert agree >= MIN_AGREEING, agree
  kl = np.concatenate([_kl(b.logits[:1], a.logits[:1]) for a, b in zip(on, off, strict=True)])
  assert kl.mean() <= KL_BOUND, kl.mean()


@pytest.mark.parametrize("preset", ["qwen35_tiny", "nemotron_h_tiny"])
def test_bf16_cached_state_is_close_to_the_recomputed_one(preset):
  model = _peaked_model(preset)
  cfg = model.cfg
  prompt = shared_prefix_prompts(2, 1, PREFIX, 0)[0]
  drv = ToyDriver(model, num_blocks=32, block_size=16, max_blocks=8, pad_tokens=128)
  chunked, one_pass = drv.new_request(prompt), drv.new_request(prompt)
  for n in (40, 24, 32):  # the prefix in chunks, as the engine prefills a prompt
    drv.step([(chunked, n)])
  drv.step([(one_pass, PREFIX)])
  rg = cfg.recurrent_groups[0]
  blocks = [r.tables[rg][(PREFIX - 1) // 16] for r in (chunked, one_pass)]
  kind = "gdn" if "G" in cfg.layer_kinds else "mamba"
  for leaf in (f"{kind}_state", f"{kind}_conv"):
    pool = np.asarray(getattr(drv.cache, leaf).astype(jnp.float32))
    cached, recomputed = pool[:, blocks[0]], pool[:, blocks[1]]
    assert max_rel_diff(cached, recomputed) <= STATE_RTOL, (leaf, max_rel_diff(cached, recomputed))


def test_numerics_picks_the_dtype_and_rejects_a_mismatched_model():
  assert Engine("qwen35_tiny", numerics="serving").model_config.dtype == "bfloat16"
  assert Engine("qwen35_tiny").numerics == "exact"
  with pytest.raises(ValueError, match="numerics must be one of"):
    Engine("qwen35_tiny", numerics="fast")
  with pytest.raises(ValueError, match="needs a float32 model"):
    Engine(_peaked_model("qwen35_tiny"), numerics="exact")
