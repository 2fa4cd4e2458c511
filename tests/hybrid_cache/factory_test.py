"""The public API (`hybrid_cache/__init__.py`): the module docstring's example on both backends."""

import pytest

import hybrid_cache
from hybrid_cache import CacheConfig
from hybrid_cache import GroupSpec
from hybrid_cache import ScheduleEntry
from hybrid_cache import make_manager


def _config():
  return CacheConfig(
    groups=(GroupSpec("full"), GroupSpec("mamba", mode="align")), num_blocks=64, block_size=16
  )


def _serve_twice(backend):
  """r0 (42 tokens) runs one step and is freed; r1 shares its first 40 tokens."""
  m = make_manager(_config(), backend=backend)
  prefix = list(range(1, 41))
  m.add_request("r0", prefix + [100, 101])
  first = m.schedule([ScheduleEntry("r0")])
  m.free("r0")
  m.add_request("r1", prefix + [200, 201, 202])
  second = m.schedule([ScheduleEntry("r1")])
  return first, second


def test_docstring_example_agrees_on_both_backends():
  ref_first, ref_second = _serve_twice("reference")
  jax_first, jax_second = _serve_twice("jax")
  assert ref_first == jax_first
  assert ref_second == jax_second
  # align, block 16: r0's first chunk stops at its checkpoint position floor(41 / 16) * 16 = 32
  # (vLLM's _mamba_block_aligned_split); that state is kept and r1 hits it.
  assert ref_second.entries[0].hit.hit_tokens == 32


def test_unknown_backend_names_the_field():
  with pytest.raises(ValueError, match=r"backend must be one of \('jax', 'reference'\), got 'tpu'"):
    make_manager(_config(), backend="tpu")


def test_curated_api_lists_what_it_exports():
  for name in hybrid_cache.__all__:
    assert hasattr(hybrid_cache, name), name
