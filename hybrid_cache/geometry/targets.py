"""Hardware targets: the GPU facts vLLM 0.33 reads when it sizes a hybrid model's cache.

vLLM derives the cache from three device queries (`vllm/platforms/cuda.py`): the compute
capability (which attention backend and which GDN prefill kernel run, hence the kernel block
sizes and the 64-token FlashInfer checkpoint alignment), the device name and its total memory
(the scheduler's default budgets, `EngineArgs.get_batch_defaults`: an "a100" in the name keeps
the small defaults whatever the memory), plus the CUDA runtime's major version (FlashInfer's GDN
prefill on Blackwell needs CUDA >= 13). A `Target` names one such device.

  name     capability  device                        memory     vLLM's GDN prefill / backend
  sm80     8.0         NVIDIA A100-SXM4-80GB         80 GiB     Triton / FLASH_ATTN
  sm90     9.0         NVIDIA H100 80GB HBM3         80 GiB     FlashInfer (64-token alignment) /
                                                                FLASH_ATTN
  sm100    10.0        NVIDIA B200                   178 GiB    FlashInfer (head_k_dim 128) /
                                                                FLASHINFER

`a100`, `h100`, `h200` and `b200` are the same families under their product names (`h200`:
the 141 GB H100 successor, the same 9.0 capability). Example::

  get_target("sm90").capability         # (9, 0)
  get_target("h200").total_memory       # 150_754_820_096
"""

from __future__ import annotations

import dataclasses

_GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Target:
  """One GPU as vLLM's platform layer sees it.

  Attributes:
    name: the key in `TARGETS` ("sm80", "sm90", "sm100", or a product name).
    capability: CUDA compute capability (major, minor).
    device_name: `torch.cuda.get_device_name()` of the device.
    total_memory: bytes of device memory.
    cuda_runtime_major: the CUDA runtime vLLM runs on (13 for the vLLM 0.33 wheels).
  """

  name: str
  capability: tuple[int, int]
  device_name: str
  total_memory: int
  cuda_runtime_major: int = 13

  @property
  def family(self) -> int:
    """`major * 10`: vLLM's `is_device_capability_family` (90 Hopper, 100 Blackwell)."""
    return self.capability[0] * 10


def _target(name, capability, device, memory) -> Target:
  return Target(name=name, capability=capability, device_name=device, total_memory=memory)


TARGETS: dict[str, Target] = {
  t.name: t
  for t in (
    _target("sm80", (8, 0), "NVIDIA A100-SXM4-80GB", 80 * _GIB),
    _target("sm90", (9, 0), "NVIDIA H100 80GB HBM3", 80 * _GIB),
    _target("sm100", (10, 0), "NVIDIA B200", 178 * _GIB),
    _target("a100", (8, 0), "NVIDIA A100-SXM4-80GB", 80 * _GIB),
    _target("h100", (9, 0), "NVIDIA H100 80GB HBM3", 80 * _GIB),
    _target("h200", (9, 0), "NVIDIA H200", 150_754_820_096),
    _target("b200", (10, 0), "NVIDIA B200", 178 * _GIB),
  )
}
DEFAULT_TARGET = "sm90"


def get_target(target: str | Target) -> Target:
  """`target` itself, or the registered target of that name (ValueError listing them)."""
  if isinstance(target, Target):
    return target
  if target not in TARGETS:
    raise ValueError(f"target must be one of {sorted(TARGETS)}, got {target!r}")
  return TARGETS[target]
