"""ModelConfig validation, derived layout and presets."""

import pytest

from models import config as config_lib
from models.config import ModelConfig


@pytest.mark.parametrize("name", sorted(config_lib.PRESETS))
def test_presets_are_tiny_and_valid(name):
  cfg = config_lib.get_preset(name)
  assert 4 <= cfg.num_layers <= 8
  assert 64 <= cfg.d_model <= 128
  assert 256 <= cfg.vocab_size <= 512
  assert len(cfg.layer_kinds) == cfg.num_layers
  assert hash(cfg) == hash(config_lib.get_preset(name))


def test_pattern_repeats_and_groups():
  cfg = config_lib.qwen35_tiny(num_layers=8)
  assert cfg.layer_kinds == tuple("GGGAGGGA")
  assert cfg.cache_groups == ("mamba", "full")
  assert cfg.layer_group == (0, 0, 0, 1, 0, 0, 0, 1)
  assert cfg.layer_slot == (0, 1, 2, 0, 3, 4, 5, 1)
  assert cfg.recurrent_group == 0
  g3 = config_lib.gemma3_tiny()
  assert g3.layer_kinds == tuple("SSSSSA")  # F is an alias of A
  assert g3.cache_groups == ("swa", "full")
  assert g3.recurrent_group is None
  h3 = config_lib.hybrid3_tiny()
  assert h3.cache_groups == ("mamba", "swa", "full")
  assert h3.layer_group == (0, 1, 0, 2)
  # Truncation when num_layers is not a multiple of the pattern length.
  assert ModelConfig(layer_pattern="GA", num_layers=3).layer_kinds == ("G", "A", "G")


def test_per_kind_recurrent_grouping_gives_one_group_per_kind():
  cfg = ModelConfig(layer_pattern="GSMA", num_layers=8, window=8, recurrent_grouping="per_kind")
  assert cfg.cache_groups == ("mamba", "swa", "mamba", "full")
  assert cfg.layer_group == (0, 1, 2, 3, 0, 1, 2, 3)
  assert cfg.recurrent_groups == (0, 2) and cfg.recurrent_group == 0
  assert (cfg.recurrent_index("G"), cfg.recurrent_index("M")) == (0, 1)
  shared = cfg.replace(recurrent_grouping="shared")
  assert shared.cache_groups == ("mamba", "swa", "full")
  assert shared.recurrent_groups == (0,) and shared.num_recurrent_rows == 1
  assert (shared.recurrent_index("G"), shared.recurrent_index("M")) == (0, 0)
  # Only one recurrent kind: one group either way.
  assert config_lib.qwen35_tiny(recurrent_grouping="per_kind").cache_groups == ("mamba", "full")
  assert config_lib.gemma3_tiny().num_recurrent_rows == 1  # no recurrent group: one dummy row
  with pytest.raises(ValueError, match="kind"):
    shared.recurrent_index("A")


def test_derived_dims():
  cfg = ModelConfig(
    layer_pattern="GM",
    num_layers=2,
    gdn_num_k_heads=2,
    gdn_num_v_heads=4,
    gdn_head_k_dim=8,
    gdn_head_v_dim=16,
    mamba_num_heads=4,
    mamba_head_dim=8,
    mamba_state_dim=16,
    mamba_n_groups=2,
  )
  assert cfg.gdn_conv_dim == 2 * 2 * 8 + 4 * 16
  assert cfg.mamba_d_inner == 32
  assert cfg.mamba_conv_dim == 32 + 2 * 2 * 16
  assert cfg.cache_groups == ("mamba",)


@pytest.mark.parametrize(
  "kwargs, field",
  [
    (dict(layer_pattern="GXA", num_layers=4), "layer_pattern"),
    (dict(layer_pattern="", num_layers=4), "layer_pattern"),
    (dict(layer_pattern="ga", num_layers=4), "layer_pattern"),
    (dict(layer_pattern="GA", num_layers=0), "num_layers"),
    (dict(layer_pattern="GA", num_layers=2, vocab_size=0), "vocab_size"),
    (dict(layer_pattern="GA", num_layers=2, num_heads=3, num_kv_heads=2), "num_heads"),
    (dict(layer_pattern="GA", num_layers=2, head_dim=15), "head_dim"),
    (dict(layer_pattern="GA", num_layers=2, gdn_num_k_heads=3), "gdn_num_v_heads"),
    (dict(layer_pattern="MA", num_layers=2, mamba_n_groups=3), "mamba_num_heads"),
    (dict(layer_pattern="SA", num_layers=2), "window"),
    (dict(layer_pattern="SA", num_layers=2, window=0), "window"),
    (dict(layer_pattern="GA", num_layers=2, window=8), "window"),
    (dict(layer_pattern="GA", num_layers=2, conv_kernel=1), "conv_kernel"),
    (dict(layer_pattern="GA", num_layers=2, dtype="float16"), "dtype"),
    (dict(layer_pattern="GA", num_layers=2, rope_theta=-1.0), "rope_theta"),
    (dict(layer_pattern="GA", num_layers=2.0), "num_layers"),
    (dict(layer_pattern="GMA", num_layers=3, recurrent_grouping="split"), "recurrent_grouping"),
  ],
)
def test_bad_config_raises_naming_field(kwargs, field):
  with pytest.raises(ValueError, match=field):
    ModelConfig(**kwargs)


def test_unknown_letter_message_names_value_and_allowed():
  with pytest.raises(ValueError, match=r"layer_pattern\[1\]='X'.*allowed"):
    ModelConfig(layer_pattern="GXA", num_layers=3)


def test_unknown_preset():
  with pytest.raises(ValueError, match="preset"):
    config_lib.get_preset("llama_huge")


# ---- sparse MoE fields ----

MOE = dict(moe_num_experts=8, moe_top_k=2, moe_hidden=32)


def test_moe_layers_choose_each_layers_feed_forward():
  assert all(config_lib.get_preset(n).layer_ffn.count("moe") == 0 for n in config_lib.PRESETS)
  qwen = config_lib.qwen35_tiny(**MOE, moe_layers=(0, 2))
  assert qwen.layer_ffn == ("moe", "mlp", "moe", "mlp")
  nemotron = ModelConfig(layer_pattern="M-A-", num_layers=4, block_style="single")
  assert nemotron.layer_ffn == (None, "mlp", None, "mlp")
  sparse = nemotron.replace(**MOE, moe_layers=(3,))
  assert sparse.layer_ffn == (None, "mlp", None, "moe")
  assert sparse.layer_group == nemotron.layer_group  # MoE layers cache nothing


def _moe(**changes):
  return config_lib.qwen35_tiny(**{**MOE, "moe_layers": (1,), **changes})


@pytest.mark.parametrize(
  "changes, message",
  [
    (dict(moe_layers=[1]), "moe_layers must be a tuple"),
    (dict(moe_layers=(2, 1)), "moe_layers must be increasing"),
    (dict(moe_layers=(4,)), r"moe_layers must be increasing indices in \[0, num_layers=4\)"),
    (dict(moe_layers=()), "moe_num_experts must be 0 without moe_layers"),
    (dict(moe_num_experts=0), "moe_num_experts must be >= 1"),
    (dict(moe_top_k=9), r"moe_top_k must be in \[1, moe_num_experts=8\]"),
    (dict(moe_top_k=0), "moe_top_k must be >= 1"),
    (dict(moe_hidden=0), "moe_hidden must be >= 1"),
    (dict(moe_shared_hidden=-1), "moe_shared_hidden must be >= 0"),
    (dict(moe_shared_gate=True), "moe_shared_gate needs a shared expert"),
    (dict(moe_router="relu"), "moe_router must be one of"),
    (dict(moe_n_group=2), "moe_n_group must be 1 with moe_router='softmax'"),
    (dict(moe_router="sigmoid", moe_n_group=3), "moe_n_group must divide moe_num_experts=8"),
    (dict(moe_router="sigmoid", moe_n_group=8), "groups of >= 2 experts"),
    (dict(moe_router="sigmoid", moe_n_group=2, moe_topk_group=3), "moe_topk_group must be in"),
    (dict(moe_router="sigmoid", moe_n_group=4, moe_top_k=3), "moe_top_k must be <= the experts"),
    (dict(moe_scaling=0.0), "moe_scaling must be a number > 0"),
  ],
)
def test_bad_moe_field_is_one_line_naming_it(changes, message):
  with pytest.raises(ValueError, match=message) as err:
    _moe(**changes)
  assert "\n" not in str(err.value)


def test_single_block_moe_layer_must_be_mlp_only():
  with pytest.raises(ValueError, match="layer 0 of kind 'M'"):
    ModelConfig(layer_pattern="M-", num_layers=2, block_style="single", **MOE, moe_layers=(0,))
