"""SPEC D: cached / chunked / decoded runs reproduce the uncached single pass (fp32).

Every preset runs a prompt in one pass, in chunks (block-aligned: bit-exact; unaligned:
<= 1e-5 relative), as a second request that reuses a first request's prefix blocks and its
recurrent state at the prefix boundary, and as greedy decode steps after a prefill. SWA blocks
that leave the window are replaced by the null block, and both are filled with a large
"poison" value, so reading any of them would change the logits. Decode steps run both through
the chunked kernels and through the recurrent decode kernels (`StepInputs.decode`).
"""

import functools

import numpy as np
import pytest

from models import config as config_lib
from models import hybrid_lm
from models.testing import ToyDriver
from models.testing import max_rel_diff

PRESETS = sorted(config_lib.PRESETS)
REL = 1e-5
POISON = 1e3
PAD = 256  # every step is padded to 256 tokens and 4 sequences: one compilation per preset


@functools.cache
def _model(name):
  return hybrid_lm.build_model(config_lib.get_preset(name), seed=0)


def _block_size(name):
  # Recurrent checkpoints need multiples of the kernels' chunk (64); pure attention can use
  # small blocks, which makes SWA drop many blocks.
  return 16 if config_lib.get_preset(name).recurrent_group is None else 64


def _driver(name):
  bs = _block_size(name)
  return ToyDriver(
    _model(name),
    num_blocks=48,
    block_size=bs,
    poison_value=POISON,
    pad_tokens=PAD,
    pad_seqs=4,
    max_blocks=PAD // bs,
    # Same shapes with and without "all"-mode checkpoints: one compilation per preset.
    ckpt_cols=PAD // bs if bs % 64 == 0 else 0,
  )


def _tokens(name, n, seed):
  return list(np.random.default_rng(seed).integers(0, _model(name).cfg.vocab_size, n))


def _one_pass(name, tokens):
  return _one_pass_cached(name, tuple(tokens))


@functools.cache
def _one_pass_cached(name, tokens):
  drv = _driver(name)
  req = drv.new_request(tokens)
  return drv.step([(req, len(tokens))])[0]


def _assert_same(got, want, rel=REL):
  err = max_rel_diff(got, want)
  assert err <= rel, f"max relative logits difference {err:.3g} > {rel}"
  np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
  return err


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize(
  "chunks, exact",
  [
    ((64, 64, 72), True),
    ((50, 37, 113), False),
    pytest.param((1, 63, 5, 131), False, marks=pytest.mark.slow),
  ],
)
def test_chunked_prefill_matches_one_pass(name, chunks, exact):
  prompt = _tokens(name, sum(chunks), seed=1)
  want = _one_pass(name, prompt)
  drv = _driver(name)
  req = drv.new_request(prompt)
  got = np.concatenate([drv.step([(req, n)])[0] for n in chunks])
  if exact:
    np.testing.assert_array_equal(got, want)
  else:
    _assert_same(got, want)


@pytest.mark.parametrize("name", PRESETS)
def test_cached_prefix_matches_uncached(name):
  bs = _block_size(name)
  p = 2 * 64
  prefix = _tokens(name, p, seed=2)
  a_tokens = prefix + _tokens(name, 40, seed=3)
  b_tokens = prefix + _tokens(name, 60, seed=4)
  drv = _driver(name)
  a = drv.new_request(a_tokens)
  drv.step([(a, p)])  # the prefix chunk ends at the boundary: its state is in block (p-1)//B
  b = drv.new_request(b_tokens, prefix_from=a, prefix_len=p)
  assert b.tables[0][: p // bs] == a.tables[0][: p // bs]  # prefix blocks shared
  # B's suffix and A's rest in one packed step.
  got_b, got_a = drv.step([(b, 60), (a, 40)])
  _assert_same(got_b, _one_pass(name, b_tokens)[p:])
  _assert_same(got_a, _one_pass(name, a_tokens)[p:])


@pytest.mark.parametrize("name", [n for n in PRESETS if n != "gemma3_tiny"])
def test_all_mode_checkpoints_give_hits_at_every_block(name):
  bs = 64
  a_tokens = _tokens(name, 200, seed=5)
  drv = _driver(name)
  a = drv.new_request(a_tokens)
  drv.step([(a, 200)], checkpoints=True)  # states after 64, 128, 192 tokens checkpointed
  b1_tokens = a_tokens[:64] + _tokens(name, 30, seed=6)
  b2_tokens = a_tokens[:128] + _tokens(name, 70, seed=7)
  b1 = drv.new_request(b1_tokens, prefix_from=a, prefix_len=bs)
  b2 = drv.new_request(b2_tokens, prefix_from=a, prefix_len=2 * bs)
  got1, got2 = drv.step([(b1, 30), (b2, 70)])
  _assert_same(got1, _one_pass(name, b1_tokens)[bs:])
  _assert_same(got2, _one_pass(name, b2_tokens)[2 * bs :])


@pytest.mark.parametrize("decode_kernels", [False, True], ids=["chunked", "decode"])
@pytest.mark.parametrize("name", PRESETS)
def test_greedy_decode_matches_full_pass(name, decode_kernels):
  drv = _driver(name)
  reqs = [drv.new_request(_tokens(name, n, seed=8 + n)) for n in (70, 129)]
  outs = drv.step([(r, len(r.tokens)) for r in reqs])
  steps = 3
  step_logits = [[] for _ in reqs]
  for _ in range(steps):
    for r, o in zip(reqs, outs):
      r.tokens.append(int(o[-1].argmax()))
    outs = drv.step([(r, 1) for r in reqs], decode=decode_kernels)
    for i, o in enumerate(outs):
      step_logits[i].append(o[0])
  for r, logits in zip(reqs, step_logits):
    n = len(r.tokens)
    want = _one_pass(name, r.tokens)[n - steps :]
    _assert_same(np.stack(logits), want)
    # The generated tokens are the full pass's greedy choices.
    assert r.tokens[n - steps + 1 :] == list(want[:-1].argmax(-1))


@pytest.mark.parametrize("name", ["gemma3_tiny", "hybrid3_tiny"])
def test_swa_poison_is_detected_inside_the_window(name):
  """Control for the poison: poisoning a block that IS in the window changes the logits."""
  prompt = _tokens(name, 150, seed=9)
  drv = _driver(name)
  req = drv.new_request(prompt)
  drv.step([(req, 140)])
  clean = drv.step([(drv.new_request(prompt, prefix_from=req, prefix_len=128), 22)])[0]
  swa = config_lib.get_preset(name).cache_groups.index("swa")
  bs = _block_size(name)
  in_window = req.tables[swa][127 // bs]  # holds keys the query at 128 attends to
  drv._poison([in_window])
  dirty = drv.step([(drv.new_request(prompt, prefix_from=req, prefix_len=128), 22)])[0]
  assert max_rel_diff(dirty, clean) > 1e-2
