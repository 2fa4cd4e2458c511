"""Speculative decoding in the engine (issue 16): exactness, acceptance bookkeeping, bad input.

A scripted drafter proposes the reference greedy continuation but errs at a chosen offset
(per window: an accepted count not yet seen at that window start's offset in its block, else
a fixed cycle), so every accepted count 0..k occurs at every window start position relative
to a block boundary (asserted, not assumed). Greedy
outputs with speculation must equal those without, with caching off and on (jitted core), and
a second turn that re-sends the first turn's prompt + speculatively decoded output must hit
the prefix cache inside the decoded region (recurrent boundary states written by the verify
step, K/V copied from the private page) and still equal the uncached reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from hybrid_cache.engine import spec as engine_spec
from hybrid_cache.engine.config import cache_config_for
from hybrid_cache.engine.drafter import NgramDrafter
from hybrid_cache.engine.engine import Engine
from hybrid_cache.twin import rules

B = 8  # block size: small, so windows cross many block boundaries
K = 3  # drafts per window
CYCLE = (0, 1, 2, 3, 0)  # correct drafts per window once every count was seen at an offset
MAX_NEW = 40


class ScriptedDrafter:
  """Drafts the reference continuation with the wrong token at a scripted offset.

  `refs` are full reference sequences (prompt + greedy outputs). For the sequence that
  extends `tokens`, a window starting at offset r = start mod B gets the smallest count of
  correct drafts not yet used at r (then CYCLE[j % len(CYCLE)] for its j-th window), followed
  by a wrong one (all correct when the count is k). `expected[ref]` collects (r, accepted
  count) per window.
  """

  def __init__(self, vocab_size, refs):
    self.vocab_size = vocab_size
    self.refs = [list(r) for r in refs]
    self.calls = [0] * len(refs)
    self.expected: list[list[tuple[int, int]]] = [[] for _ in refs]

  def record(self, tokens):
    pass

  def propose(self, tokens, k):
    toks = list(tokens)
    i = next((j for j, r in enumerate(self.refs) if r[: len(toks)] == toks), None)
    if i is None:
      return []  # the engine left the reference: the exactness asserts report it
    truth = self.refs[i][len(toks) : len(toks) + k]
    r = (len(toks) - 1) % B
    used = {a for exp in self.expected for off, a in exp if off == r}
    good = next((a for a in range(k + 1) if a not in used), CYCLE[self.calls[i] % len(CYCLE)])
    self.calls[i] += 1
    draft = list(truth)
    if good < len(truth):
      draft[good] = (truth[good] + 1) % self.vocab_size
    self.expected[i].append((r, min(good, len(truth))))
    return draft


def _engine(preset, *, spec, caching, manager, drafter=None, mode="align"):
  cfg = cache_config_for(
    preset,
    mode=mode,
    block_size=B,
    num_blocks=160,
    max_model_len=160,
    max_requests=3,
    max_num_batched_tokens=32,
    enable_prefix_caching=caching,
    num_speculative_tokens=K if spec else 0,
  )
  return Engine(
    preset,
    cfg,
    cache_manager=manager,
    token_buckets=(32,),
    seq_buckets=(4,),
    drafter=drafter,
  )


def _serve(eng, prompts):
  return eng.generate(prompts, MAX_NEW, return_logits=True)


def _assert_exact(got, want):
  for g, w in zip(got, want, strict=True):
    assert g.finished and w.finished
    assert g.output_tokens == w.output_tokens, (g.request_id, g.output_tokens, w.output_tokens)
    rel = np.max(np.abs(g.logits - w.logits)) / np.max(np.abs(w.logits))
    assert rel <= 1e-5, (g.request_id, rel)


def _turns(seed, num, prefix_len):
  rng = np.random.RandomState(seed)
  prefix = rng.randint(0, 256, prefix_len).tolist()
  # Prompt lengths differ, so windows start at different offsets in their blocks.
  return [prefix + rng.randint(0, 256, 5 + 3 * i).tolist() for i in range(num)]


@pytest.mark.parametrize("preset", ["qwen35_tiny", "nemotron_h_tiny", "hybrid3_tiny"])
def test_speculative_equals_greedy_caching_off_and_on(preset):
  turn1 = _turns(0, 3, 19)
  ref_eng = _engine(preset, spec=False, caching=False, manager="reference")
  ref1 = _serve(ref_eng, turn1)
  turn2 = [p + o.output_tokens + [7, 8, 9] for p, o in zip(turn1, ref1)]
  ref2 = _serve(ref_eng, turn2)
  refs = [p + o.output_tokens for p, o in zip(turn1 + turn2, ref1 + ref2)]

  for caching, manager in ((False, "reference"), (True, "jax")):
    drafter = ScriptedDrafter(256, refs)
    eng = _engine(preset, spec=True, caching=caching, manager=manager, drafter=drafter)
    got1 = _serve(eng, turn1)
    _assert_exact(got1, ref1)
    got2 = _serve(eng, turn2)
    _assert_exact(got2, ref2)
    # The engine accepted exactly what the script implies, request by request.
    for i, out in enumerate(got1 + got2):
      assert out.num_accepted_tokens == sum(a for _, a in drafter.expected[i])
    seen = {pair for exp in drafter.expected for pair in exp}
    assert seen == {(r, a) for r in range(B) for a in range(K + 1)}
    assert eng.stats.accepted_tokens > 0 and eng.stats.draft_tokens > eng.stats.accepted_tokens
    if caching:
      # Turn 2 re-sends turn 1's prompt + output: the hit reaches into the decoded region.
      for t1, o2 in zip(turn1, got2):
        assert o2.num_cached_tokens > len(t1)
    else:
      assert eng.stats.cached_tokens == 0


def test_ngram_drafter_accepts_repeated_requests_exactly():
  # Greedy decoding is deterministic: a repeated prompt's drafts come from the history and
  # are all accepted; a fresh prompt gets (almost) no drafts.
  prompts = _turns(1, 2, 12)
  ref = _serve(_engine("qwen35_tiny", spec=False, caching=False, manager="reference"), prompts)
  eng = _engine(
    "qwen35_tiny",
    spec=True,
    caching=True,
    manager="reference",
    drafter=NgramDrafter(256, min_ngram=3),
  )
  first = _serve(eng, prompts)
  again = _serve(eng, prompts)
  _assert_exact(first, ref)
  _assert_exact(again, ref)
  for o in again:
    assert o.num_draft_tokens > 0
    assert o.num_accepted_tokens == o.num_draft_tokens
    assert o.num_cached_tokens > 0


def test_ngram_drafter_lookup_rules():
  d = NgramDrafter(16, min_ngram=2, max_ngram=4)
  assert d.propose([1, 2, 3, 4, 1, 2], 3) == [3, 4, 1]  # own context
  assert d.propose([5, 6], 2) == []
  d.record([9, 5, 6, 7, 8])
  assert d.propose([0, 5, 6], 3) == [7, 8]  # history, shorter tail
  d.record([1, 5, 6, 1, 1])
  assert d.propose([0, 5, 6], 3) == [1, 1]  # newest occurrence wins a tie
  assert d.propose([9, 5, 6], 3) == [7, 8]  # a longer match wins
  with pytest.raises(ValueError, match="max_ngram"):
    NgramDrafter(16, min_ngram=3, max_ngram=2)


class _BadVocab:
  vocab_size = 300

  def propose(self, tokens, k):
    return []

  def record(self, tokens):
    pass


class _OutOfRange(_BadVocab):
  vocab_size = 256

  def propose(self, tokens, k):
    return [256]


@pytest.mark.parametrize(
  ("cc", "drafter", "match"),
  [
    (dict(num_speculative_tokens=2), _BadVocab(), "drafter.vocab_size"),
    (dict(num_speculative_tokens=0), NgramDrafter(256), "num_speculative_tokens must be >= 1"),
    (dict(num_speculative_tokens=2), None, "num_speculative_tokens must be 0 without"),
    (dict(num_speculative_tokens=16), NgramDrafter(256), "num_speculative_tokens must be <"),
    (dict(num_speculative_tokens=2, use_eagle=True), NgramDrafter(256), "use_eagle"),
    (
      dict(num_speculative_tokens=2, mode="all", block_size=64),
      NgramDrafter(256),
      r"groups\[\]\.mode 'all'",
    ),
  ],
)
def test_bad_speculative_config_raises_naming_the_field(cc, drafter, match):
  cc = {"block_size": 16, "num_blocks": 64, **cc}
  cfg = cache_config_for("qwen35_tiny", **cc)
  with pytest.raises(ValueError, match=match):
    Engine("qwen35_tiny", cfg, cache_manager="reference", drafter=drafter)


def test_drafter_returning_out_of_vocab_tokens_raises():
  cfg = cache_config_for("qwen35_tiny", block_size=16, num_blocks=64, num_speculative_tokens=2)
  eng = Engine(
    "qwen35_tiny", cfg, cache_manager="reference", drafter=_OutOfRange(), token_buckets=(32,)
  )
  eng.add_request(list(range(20)), 4)
  with pytest.raises(ValueError, match=r"drafter.propose returned token 256"):
    eng.run()


def test_boundary_commit_is_vllms_post_forward_copy():
  # The verify step writes the state at the boundary the accepted tokens reach into the block
  # vLLM's post-forward copy (§5.3) would copy it to, from the same per-token state.
  for bs in (4, 16):
    for k in range(1, bs):
      for start in range(0, 3 * bs):
        col, off = engine_spec.boundary_commit(start, bs)
        for a in range(k + 1):
          copy, _ = rules.post_forward_copy(
            num_computed=start,
            num_scheduled=1 + k,
            num_draft=k,
            num_accepted=a + 1,
            block_size=bs,
            src_col=-1,
          )
          if copy is None:
            assert off > a
          else:
            assert off <= a and copy[1:] == (col, off)


@pytest.mark.parametrize("preset", ["qwen35_tiny", "nemotron_h_tiny"])
def test_verify_forward_returns_the_state_after_every_window_token(preset):
  # The per-token states of one verify forward equal the states an ordinary forward of the
  # first i + 1 window tokens writes into the pool (recurrent and conv); jitted, one shape.
  import jax

  from models import cache as cache_lib
  from models import runner
  from models.config import get_preset
  from models.hybrid_lm import build_model

  cfg = get_preset(preset)
  graphdef, params = runner.split_model(build_model(cfg, seed=0))
  fwd = jax.jit(lambda c, x: nnx.merge(graphdef, params)(c, x))
  ver = jax.jit(lambda c, x: nnx.merge(graphdef, params).verify(c, x, window=4))
  rng = np.random.RandomState(3)
  prompt, window = rng.randint(0, 256, 10).tolist(), rng.randint(0, 256, 4).tolist()
  tables = [list(range(1, 5)) for _ in cfg.cache_groups]

  def inputs(tokens, start, read, write):
    seq = runner.SeqStep(tokens, start, tables, read, write)
    return runner.build_step_inputs(cfg, [seq], 16, pad_tokens=16, pad_seqs=2, decode=False)

  _, cache = fwd(cache_lib.init_cache(cfg, 8, 16), inputs(prompt, 0, -1, 7))
  win = engine_spec.Window(window, 10, tables, [7], 6, [-1], -1)
  vin, _ = engine_spec.build_verify_inputs(cfg, [win], 16, window=4, pad_seqs=2, max_blocks=4)
  _, _, per_token = ver(cache, vin)
  kind = "G" if "G" in cfg.layer_kinds else "M"
  names = ("gdn_state", "gdn_conv") if kind == "G" else ("mamba_state", "mamba_conv")
  for i in range(4):
    _, ref = fwd(cache, inputs(window[: i + 1], 10, 7, 5))
    for got, name in zip(per_token[kind], names, strict=True):
      want = getattr(ref, name)[:, 5]
      np.testing.assert_allclose(np.asarray(got[:, 0, i]), np.asarray(want), rtol=1e-5, atol=1e-6)
