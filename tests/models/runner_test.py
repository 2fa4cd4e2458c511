"""StepInputs construction, recurrent ids, cache shapes and their bad-input errors."""

import jax
import numpy as np
import pytest

from models import cache as cache_lib
from models import config as config_lib
from models import runner
from models.runner import SeqStep


def test_build_step_inputs_packs_and_maps_slots():
  cfg = config_lib.hybrid3_tiny()  # groups: mamba, swa, full
  bs = 4
  seqs = [
    SeqStep([5, 6, 7], 2, [[9], [8, 3], [1, 2]], state_read=9, state_write=9),
    SeqStep([8], 0, [[4], [5], [6]], state_write=4),
  ]
  inp = runner.build_step_inputs(cfg, seqs, bs)
  np.testing.assert_array_equal(inp.token_ids, [5, 6, 7, 8])
  np.testing.assert_array_equal(inp.positions, [2, 3, 4, 0])
  np.testing.assert_array_equal(inp.query_start_loc, [0, 3, 4])
  np.testing.assert_array_equal(inp.seq_lens, [5, 1])
  np.testing.assert_array_equal(inp.slot_mapping[1], [8 * 4 + 2, 8 * 4 + 3, 3 * 4 + 0, 5 * 4])
  np.testing.assert_array_equal(inp.slot_mapping[2], [1 * 4 + 2, 1 * 4 + 3, 2 * 4 + 0, 6 * 4])
  np.testing.assert_array_equal(inp.state_read, [[9, -1]])  # [R=1 recurrent group, N]
  np.testing.assert_array_equal(inp.state_write, [[9, 4]])
  assert inp.ckpt_write.shape == (1, 2, 0) and inp.ckpt_every is None
  assert not inp.decode


def test_slots_match_the_per_token_rule_on_a_padded_step():
  # slot = block * B + offset for every new token of a real sequence, -1 for padding
  cfg = config_lib.hybrid3_tiny()  # groups: mamba, swa, full
  bs, rng = 4, np.random.default_rng(0)
  seqs = []
  for _ in range(5):
    nc, n = int(rng.integers(0, 9)), int(rng.integers(1, 11))
    width = -(-(nc + n) // bs)
    tables = [list(rng.integers(1, 50, width)) for _ in range(3)]
    seqs.append(SeqStep(list(range(n)), nc, tables, state_write=1))
  inp = runner.build_step_inputs(cfg, seqs, bs, max_blocks=8, pad_tokens=64, pad_seqs=8)
  for g in (1, 2):
    want = [
      b * bs + p % bs
      for s in seqs
      for p in range(s.num_computed, s.num_computed + len(s.token_ids))
      for b in [s.block_tables[g][p // bs]]
    ]
    want += [-1] * (64 - len(want))
    np.testing.assert_array_equal(inp.slot_mapping[g], want)
  seqs[3] = SeqStep([1, 2], 4, [[1], [1, 0], [1, 2]])
  with pytest.raises(
    ValueError, match=r"seqs\[3\].block_tables\[1\]\[1\] is 0: a new token at position 4"
  ):
    runner.build_step_inputs(cfg, seqs, bs, max_blocks=8)


def test_two_recurrent_groups_get_one_id_row_each():
  cfg = config_lib.ModelConfig(
    layer_pattern="GMA", num_layers=3, recurrent_grouping="per_kind"
  )  # groups: mamba (G), mamba (M), full
  seqs = [
    SeqStep([5, 6], 4, [[9, 3], [7, 2], [1, 6]], state_read=(9, 7), state_write=(3, 2)),
    SeqStep([8], 0, [[4], [5], [6]], state_write=(4, 5)),
  ]
  inp = runner.build_step_inputs(cfg, seqs, 4)
  np.testing.assert_array_equal(inp.state_read, [[9, -1], [7, -1]])
  np.testing.assert_array_equal(inp.state_write, [[3, 4], [2, 5]])
  with pytest.raises(ValueError, match="one entry per recurrent group"):
    runner.build_step_inputs(cfg, [SeqStep([1], 0, [[1], [1], [1]], state_read=(1, 2, 3))], 4)


def test_decode_steps_hold_one_token_per_sequence():
  cfg = config_lib.qwen35_tiny()
  seqs = [SeqStep([1], 3, [[3], [4]], 3, 3), SeqStep([2], 5, [[5], [6]], 5, 5)]
  inp = runner.build_step_inputs(cfg, seqs, 8, pad_tokens=4, pad_seqs=4, decode=True)
  assert inp.decode
  np.testing.assert_array_equal(inp.query_start_loc, [0, 1, 2, 3, 4])
  np.testing.assert_array_equal(inp.state_write, [[3, 5, -1, -1]])
  with pytest.raises(ValueError, match="one token"):
    runner.build_step_inputs(cfg, [SeqStep([1, 2], 0, [[3], [4]])], 8, decode=True)
  with pytest.raises(ValueError, match="pad_tokens == pad_seqs"):
    runner.build_step_inputs(cfg, seqs, 8, pad_tokens=8, pad_seqs=4, decode=True)


def test_padding_adds_inert_sequences():
  cfg = config_lib.qwen35_tiny()
  inp = runner.build_step_inputs(
    cfg, [SeqStep([1, 2], 0, [[3], [4]], state_write=3)], 4, pad_tokens=8, pad_seqs=3
  )
  np.testing.assert_array_equal(inp.query_start_loc, [0, 2, 2, 8])
  np.testing.assert_array_equal(inp.state_write, [[3, -1, -1]])
  np.testing.assert_array_equal(inp.slot_mapping[1], [16, 17, -1, -1, -1, -1, -1, -1])
  assert inp.block_tables[1].shape == (3, 2)  # 6 padding tokens need 2 (null) blocks of 4


def test_recurrent_state_ids_follow_the_state_block_rule():
  assert runner.recurrent_state_ids([7, 8, 9], 0, 5, 4) == (-1, 8, [])
  assert runner.recurrent_state_ids([7, 8, 9], 4, 6, 4, checkpoints=True) == (7, 9, [8])
  assert runner.recurrent_state_ids([7, 8, 9], 5, 1, 4) == (8, 8, [])  # decode inside a block
  with pytest.raises(ValueError, match="num_computed"):
    runner.recurrent_state_ids([7, 8, 9], 5, 4, 4, checkpoints=True)
  with pytest.raises(ValueError, match="recurrent block table"):
    runner.recurrent_state_ids([7], 2, 4, 4)
  with pytest.raises(ValueError, match="num_new"):
    runner.recurrent_state_ids([7], 2, 0, 4)


@pytest.mark.parametrize(
  "seqs, kwargs, match",
  [
    ([], {}, "seqs"),
    ([SeqStep([], 0, [[1], [1]])], {}, r"seqs\[0\].token_ids"),
    ([SeqStep([1], 0, [[1]])], {}, "one table per cache group"),
    ([SeqStep([1, 2, 3, 4, 5], 0, [[1], [1]])], {}, r"block_tables\[1\].*needs >= 2"),
    ([SeqStep([1], 4, [[1], [1, 0]])], {}, "needs a real block"),
    ([SeqStep([1], 0, [[1], [1]], ckpt_write=(1,))], {}, "ckpt_every"),
    ([SeqStep([1, 2], 0, [[1], [1]])], dict(pad_tokens=1), "pad_tokens"),
    ([SeqStep([1], 0, [[1], [1]])], dict(pad_seqs=1), "pad_seqs"),
    ([SeqStep([1], 0, [[1], [1, 2, 3]])], dict(max_blocks=2), "max_blocks"),
  ],
)
def test_build_step_inputs_bad_input(seqs, kwargs, match):
  with pytest.raises(ValueError, match=match):
    runner.build_step_inputs(config_lib.qwen35_tiny(), seqs, 4, **kwargs)


def test_cache_shapes_and_bytes():
  cfg = config_lib.hybrid3_tiny()
  c = cache_lib.init_cache(cfg, num_blocks=5, block_size=8)
  assert c.k.shape == (2, 5, 8, cfg.num_kv_heads, cfg.head_dim)
  assert c.gdn_state.shape == (2, 5, cfg.gdn_num_v_heads, cfg.gdn_head_k_dim, cfg.gdn_head_v_dim)
  assert c.gdn_conv.shape == (2, 5, cfg.gdn_conv_dim, cfg.conv_kernel - 1)
  assert c.mamba_state.shape[0] == 0 and c.mamba_conv.shape[0] == 0
  assert c.gdn_state.dtype == np.float32
  assert (c.num_blocks, c.block_size) == (5, 8)
  assert cache_lib.cache_bytes(cfg, 5, 8) == sum(x.nbytes for x in jax.tree.leaves(c))
  m = cache_lib.init_cache(config_lib.nemotron_h_tiny(), 3, 4)
  assert m.mamba_state.shape[2:] == (4, 16, 16)  # [H, P, N]


@pytest.mark.parametrize(
  "num_blocks, block_size, match", [(1, 4, "num_blocks"), (4, 0, "block_size"), (4.0, 4, "num")]
)
def test_init_cache_bad_sizes(num_blocks, block_size, match):
  with pytest.raises(ValueError, match=match):
    cache_lib.init_cache(config_lib.qwen35_tiny(), num_blocks, block_size)
