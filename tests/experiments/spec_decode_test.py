"""The spec_decode experiment at tiny size: every arm exact, caching and acceptance visible.

Three conversations over two questions (the third replays the first), 12 new tokens, k = 3,
the plain-Python core. The replayed conversation's drafts come from the drafter's history and
are all accepted; turn 2 (turn 1 + answer + follow-up) hits inside the answer with dense
retention, and only up to the turn-1 prompt's boundary or the junction with vLLM's default
retention 0.
"""

from __future__ import annotations

from experiments import spec_decode


def test_spec_decode_arms_exact_with_hits_and_acceptance(tmp_path):
  res = spec_decode.run(
    str(tmp_path),
    prefix_len=32,
    question_len=8,
    follow_len=4,
    num_questions=2,
    num_conversations=3,
    max_new_tokens=24,
    num_speculative_tokens=3,
    concurrency=2,
    max_num_batched_tokens=32,
    max_model_len=128,
    cache_manager="reference",
    rounds=1,
    progress=False,
  )
  arms = res["arms"]
  assert set(arms) == set(spec_decode.ARMS)
  for a in arms.values():
    assert a["outputs_equal_to_reference"] is True
    assert a["max_logit_rel_diff_vs_reference"] <= 1e-5
    for k in ("cached_tokens", "draft_tokens", "accepted_tokens", "wall_s"):
      assert k in a
  for name in ("nocache_nospec", "nocache_spec"):
    assert arms[name]["cached_tokens"] == 0
  for name in ("nocache_nospec", "cache_nospec"):
    assert arms[name]["draft_tokens"] == 0
  cs, vd = arms["cache_spec"], arms["cache_spec_vllm_default"]
  assert cs["cached_tokens"] > 0 and cs["acceptance"] >= 0.3
  # Speculation does not change what is cached; vLLM's retention 0 keeps less in turn 2.
  assert cs["cached_tokens"] == arms["cache_nospec"]["cached_tokens"]
  assert vd["cached_tokens_turn2"] < cs["cached_tokens_turn2"]
  assert (tmp_path / "spec_decode.png").exists()
