"""Import stubs that let vLLM 0.33's model and backend modules import in the CPU oracle env.

Loaded (as `sitecustomize`) only by `oracle_geometry.py`'s interpreter, never by the project.
The oracle venv (shared/vllm_oracle/setup_oracle.sh) lacks three things vLLM imports here:
torchvision (Qwen3.5's model module imports transformers' Qwen2-VL image processor, which
imports it), FlashInfer (vLLM's FlashInfer attention backend imports it; on sm100 it is vLLM's
first choice) and vLLM's compiled CUDA kernels (`vllm/platforms/cuda.py` imports
`vllm._C_stable_libtorch`; FlashAttention checks its FA2 / FA3 builds by importing
`vllm.vllm_flash_attn._vllm_fa2_C` / `_vllm_fa3_C`). They are stood in for by empty modules whose
attributes are mocks: nothing of them is called for the geometry, the imports only have to
succeed, as they do on a GPU machine with vLLM installed.
"""

import importlib.abc
import importlib.machinery
import sys
import types
from unittest import mock

_STUBBED = (
  "torchvision",
  "flashinfer",
  "vllm._C_stable_libtorch",
  "vllm.vllm_flash_attn._vllm_fa2_C",
  "vllm.vllm_flash_attn._vllm_fa3_C",
)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  def find_spec(self, name, path, target=None):
    if any(name == p or name.startswith(p + ".") for p in _STUBBED):
      return importlib.machinery.ModuleSpec(name, self, is_package=True)
    return None

  def create_module(self, spec):
    module = types.ModuleType(spec.name)
    module.__path__ = []
    module.__getattr__ = lambda attr: mock.MagicMock(name=f"{spec.name}.{attr}")
    return module

  def exec_module(self, module):
    pass


sys.meta_path.insert(0, _StubFinder())
