"""Test setup: 8 virtual CPU devices, markers, hypothesis profile."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck  # noqa: E402
from hypothesis import settings  # noqa: E402

from hybrid_cache import persistent_cache  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
persistent_cache.enable()  # $HYBRID_CACHE_JAX_CACHE or ~/.cache/hybrid_cache_jax; "off" = none

settings.register_profile(
  "ci",
  deadline=None,
  max_examples=25,
  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
  del config
  if jax.default_backend() in ("gpu", "cuda", "rocm", "tpu"):
    return
  skip_gpu = pytest.mark.skip(reason="needs a GPU/TPU backend (running on CPU)")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip_gpu)


@pytest.fixture(autouse=True, scope="module")
def _clear_jax_caches_between_modules():
  """Drops compiled executables after each test module.

  One process otherwise accumulates thousands of executables over the suite; a full cold run
  in one process once segfaulted inside XLA compilation after ~550 tests (not reproducible in
  isolation). The persistent compilation cache keeps recompiles cheap.
  """
  yield
  jax.clear_caches()
