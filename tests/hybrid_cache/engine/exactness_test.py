"""Exactness matrix (issue 16): presets x cache policies on the jitted core, cached == uncached.

One row of `MATRIX` per policy cell: the `cache_config_for` overrides, the presets it applies to
and what the run must show besides exactness (that the policy really acted: hits, copy-on-write
copies, ...). Every cell serves the same workload through the engine with the jitted core
(`cache_manager="jax"`) and compares with the uncached run of the preset (prefix caching off):
greedy tokens equal and logits within fp32 1e-5 relative (SPEC D).

Workload: a 72-token prefix (4.5 blocks of 16) served first as a prompt of its own (+3 tokens,
so vLLM §2.5's partial entry sits at 72), then behind three prompts with 21-token suffixes;
budget 32 (chunked prefill), windows of 24 (SWA drops), Marconi junctions at 72.

Besides our presets, the matrix serves the real architectures loaded from tiny Hugging Face
checkpoints (`HF_MODELS`: Qwen3.5, Qwen3-Next, Nemotron-H, Gemma 3, written by `transformers`
itself, `tests/models/hf_checkpoints.py`, and loaded with `models.pretrained`); their cells skip
without the `hf` extra. Their cache groups equal the presets' (mamba + full, or swa + full with
the same window), so they share the presets' core compilations.

The default run holds `DEFAULT` (one jitted-core compilation per distinct cache config: the
two GDN/Mamba2 presets share theirs); everything else runs under `-m slow`. A new cell is one
more `Cell` row, with Engine keyword arguments in `engine` (as the speculative cell's drafter).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import importlib.util
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from hybrid_cache import profiles
from hybrid_cache.engine import workload
from hybrid_cache.engine.config import cache_config_for
from hybrid_cache.engine.config import resolve_model_config
from hybrid_cache.engine.drafter import NgramDrafter
from hybrid_cache.engine.engine import Engine
from models.pretrained import load_pretrained

# Real architectures from Hugging Face checkpoints: matrix name -> transformers model_type.
HF_MODELS = {
  "hf_qwen3_5": "qwen3_5_text",
  "hf_qwen3_next": "qwen3_next",
  "hf_nemotron_h": "nemotron_h",
  "hf_gemma3": "gemma3_text",
}
HF_RECURRENT = ("hf_qwen3_5", "hf_qwen3_next", "hf_nemotron_h")
PRESETS = ("qwen35_tiny", "nemotron_h_tiny", "gemma3_tiny", "hybrid3_tiny", *HF_MODELS)
RECURRENT = ("qwen35_tiny", "nemotron_h_tiny", "hybrid3_tiny", *HF_RECURRENT)
HAS_HF = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
BASE = dict(block_size=16, num_blocks=96, max_model_len=256, max_requests=4)
BUDGET = 32
PREFIX = 72
MAX_NEW = 3


@dataclasses.dataclass(frozen=True)
class Cell:
  """One policy of the matrix.

  Attributes:
    name: the policy.
    cache: `cache_config_for` overrides (on top of `BASE` and the token budget).
    presets: the presets the policy means something for.
    check: extra assertion on (outputs, engine): the policy acted.
    engine: extra `Engine` keyword arguments, or a function of the preset giving them.
  """

  name: str
  cache: dict[str, Any]
  presets: tuple[str, ...] = PRESETS
  check: Callable[[list, Engine], None] | None = None
  engine: dict[str, Any] | Callable[[str], dict[str, Any]] = dataclasses.field(default_factory=dict)


def _hits(outs) -> list[int]:
  return [o.num_cached_tokens for o in outs]


def _prefix_hits(align: int) -> Callable[[list, Engine], None]:
  """Every later prompt hits the shared prefix floored to `align` tokens."""

  def check(outs, eng):
    assert _hits(outs)[1:] == [PREFIX // align * align] * 3, _hits(outs)
    assert eng.stats.cached_tokens > 0

  return check


def _no_hits(outs, eng):
  assert eng.stats.cached_tokens == 0, _hits(outs)


def _partial_cow(hit: int, kv: bool) -> Callable[[list, Engine], None]:
  """Partial hits (vLLM §2.5) of `hit` tokens; copies ran (KV pages too iff `kv`)."""

  def check(outs, eng):
    assert _hits(outs)[1:] == [hit] * 3, _hits(outs)
    assert eng.cache_config.partial_hits
    assert eng.stats.state_copies > 0
    assert (eng.stats.kv_page_copies > 0) == kv, eng.stats

  return check


def _pinned(outs, eng):
  _prefix_hits(16)(outs, eng)
  assert eng.manager.pool_stats().num_pinned_blocks > 0


@functools.cache
def _model(preset: str):
  """A preset name as is, or the HybridLM loaded from that architecture's tiny checkpoint."""
  if preset not in HF_MODELS:
    return preset
  from tests.models import hf_checkpoints

  directory = tempfile.mkdtemp(prefix=f"{preset}-")
  atexit.register(shutil.rmtree, directory, ignore_errors=True)
  hf_checkpoints.save_tiny(HF_MODELS[preset], directory)
  return load_pretrained(directory).model


def _ngram_drafter(preset: str) -> dict[str, Any]:
  """Speculative decoding with prompt lookup (`engine.drafter.NgramDrafter`)."""
  vocab = resolve_model_config(_model(preset)).vocab_size
  return {"drafter": NgramDrafter(vocab, min_ngram=1)}


def _speculated(outs, eng):
  _prefix_hits(16)(outs, eng)
  assert eng.stats.verify_windows > 0, eng.stats  # decoding ran through verify windows


_ADAPTIVE = dict(
  max_num_batched_tokens=64, max_model_len=512, **workload.arm("adaptive", checkpoint_unit=64)
)
ADAPTIVE_PRESETS = ("qwen35_tiny", "nemotron_h_tiny", *HF_RECURRENT)

MATRIX = (
  Cell("none", dict(mode="none"), RECURRENT, _no_hits),
  Cell(
    "align_dense_no_junction", dict(mode="align", marconi_junction=False), check=_prefix_hits(16)
  ),
  # vLLM 0.33's serving configuration for hybrid models (`hybrid_cache.profiles.VLLM_DEFAULT`).
  Cell(
    "vllm_default",
    profiles.get("vllm_default").cache_overrides(),
    check=_prefix_hits(16),
  ),
  Cell(
    "all",
    dict(mode="all", block_size=64, max_num_batched_tokens=64, max_model_len=512),
    RECURRENT,
    _prefix_hits(64),
  ),
  Cell("vllm_align_dense", dict(mode="align", marconi_junction=True), check=_prefix_hits(16)),
  Cell("retention_0", dict(retention_interval=0), check=_prefix_hits(16)),
  Cell("retention_2B", dict(retention_interval=32), check=_prefix_hits(16)),
  Cell("flop_aware", dict(eviction="flop_aware", num_blocks=40), check=_prefix_hits(16)),
  Cell(
    "pinning_min_drop",
    dict(pinning=True, pin_min_drop_size=2),
    ("gemma3_tiny", "hybrid3_tiny", "hf_gemma3"),
    _pinned,
  ),
  # vLLM §2.5: hash block 8 < the recurrent block 16 -> hits at 72 = 4.5 blocks, the
  # full-attention block 4 and the recurrent state block copied on write.
  Cell(
    "partial_hits",
    dict(hash_block_size=8),
    ("qwen35_tiny", "nemotron_h_tiny", *HF_RECURRENT),
    _partial_cow(PREFIX, kv=True),
  ),
  # Unequal group block sizes (one KV page for the attention groups, `engine_config`):
  # recurrent 16 beside attention 32 -> hits align to the LCM, 32.
  Cell("unequal_lcm", dict(block_size=32, recurrent_block_size=16), RECURRENT, _prefix_hits(32)),
  # recurrent 32 beside attention 16 -> partial hits on the 16-token hash block (recurrent CoW).
  Cell("unequal_partial", dict(recurrent_block_size=32), RECURRENT, _partial_cow(64, kv=False)),
  # recurrent 64 in mode "all" beside attention 16 -> checkpoints every 64 tokens, LCM 64.
  # Speculative decoding (k = 2 drafts a step through the multi-token verify kernels, per-token
  # state commits); the drafter reads no hidden state, so vLLM's non-EAGLE rules apply.
  Cell(
    "speculative",
    dict(num_speculative_tokens=2),
    RECURRENT,
    _speculated,
    engine=_ngram_drafter,
  ),
  # Profile `adaptive` (issue 28): its placement, retirement and GreedyDual eviction, every
  # group on pages of U = 64 (align mode, chunks cut at the continuation point). The prefix
  # (72) ends inside the second page: the first prompt keeps its state at 64 (its continuation
  # point), the second its branch point at 64 (the junction floored to 64).
  Cell("adaptive", _ADAPTIVE, ADAPTIVE_PRESETS, _prefix_hits(64)),
  # The same with LRU-2 eviction and its KV owners (`core/kv_owner.py`): the owners are
  # recorded at every finish, a release-time lookup of the request's own tokens.
  Cell("adaptive_lru2", dict(_ADAPTIVE, eviction="lru2"), ADAPTIVE_PRESETS, _prefix_hits(64)),
  Cell(
    "unequal_all",
    dict(mode="all", recurrent_block_size=64, max_num_batched_tokens=64),
    RECURRENT,
    _prefix_hits(64),
  ),
)
_BY_NAME = {c.name: c for c in MATRIX}

# The default slice: 4 jitted-core compilations (qwen35 and nemotron share a config, and the
# real architectures share the presets').
DEFAULT = {
  ("partial_hits", "qwen35_tiny"),
  ("partial_hits", "nemotron_h_tiny"),
  ("unequal_lcm", "hybrid3_tiny"),
  ("pinning_min_drop", "gemma3_tiny"),
  ("speculative", "hybrid3_tiny"),
  ("partial_hits", "hf_qwen3_5"),
  ("partial_hits", "hf_qwen3_next"),
  ("partial_hits", "hf_nemotron_h"),
  ("pinning_min_drop", "hf_gemma3"),
  ("adaptive", "qwen35_tiny"),
  ("adaptive", "hf_nemotron_h"),
  ("adaptive_lru2", "qwen35_tiny"),
}


def _workload() -> list[list[int]]:
  rng = np.random.RandomState(16)
  prefix = rng.randint(0, 256, PREFIX).tolist()
  first = prefix + rng.randint(0, 256, 3).tolist()
  return [first] + [prefix + rng.randint(0, 256, 21).tolist() for _ in range(3)]


def _serve(preset: str, manager: str, engine_kw: dict[str, Any], **cache: Any):
  kw = {**BASE, "max_num_batched_tokens": BUDGET, **cache}
  cfg = cache_config_for(_model(preset), **kw)
  budget = cfg.max_num_batched_tokens
  eng = Engine(
    _model(preset),
    cfg,
    seed=0,
    cache_manager=manager,
    token_buckets=(budget,),
    seq_buckets=(8,),
    max_num_seqs=4,
    **engine_kw,
  )
  return eng.generate(_workload(), MAX_NEW, return_logits=True), eng


@functools.cache
def _uncached(preset: str):
  # The oracle: prefix caching off (the plain-Python twin; no policy acts without hits).
  outs, _ = _serve(preset, "reference", {}, enable_prefix_caching=False)
  return outs


def _assert_exact(got, want):
  for g, w in zip(got, want, strict=True):
    assert g.finished and w.finished, (g.error, w.error)
    assert g.output_tokens == w.output_tokens, (g.request_id, g.output_tokens, w.output_tokens)
    rel = float(np.max(np.abs(g.logits - w.logits)) / np.max(np.abs(w.logits)))
    assert rel <= 1e-5, (g.request_id, rel)


def _params():
  out = []
  for cell in MATRIX:
    for preset in cell.presets:
      marks = () if (cell.name, preset) in DEFAULT else (pytest.mark.slow,)
      if preset in HF_MODELS and not HAS_HF:
        marks += (pytest.mark.skip(reason="needs the hf extra (transformers, torch)"),)
      out.append(pytest.param(cell.name, preset, marks=marks, id=f"{cell.name}-{preset}"))
  return out


@pytest.mark.parametrize("cell,preset", _params())
def test_cached_equals_uncached(cell, preset):
  c = _BY_NAME[cell]
  engine_kw = c.engine(preset) if callable(c.engine) else c.engine
  outs, eng = _serve(preset, "jax", engine_kw, **c.cache)
  _assert_exact(outs, _uncached(preset))
  if c.check is not None:
    c.check(outs, eng)


def test_matrix_covers_every_preset_and_the_default_slice_exists():
  assert {p for c in MATRIX for p in c.presets} == set(PRESETS)
  assert all(cell in _BY_NAME and preset in _BY_NAME[cell].presets for cell, preset in DEFAULT)
