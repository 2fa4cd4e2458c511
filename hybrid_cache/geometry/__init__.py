"""vLLM 0.33's cache geometry for a real model: `derive(config.json, target, flags)`.

The one place that knows how vLLM builds a hybrid model's cache from its Hugging Face config, the
GPU and the serving flags (block sizes, groups, pages, budgets; `derive.py` has the rules and
their vLLM sources). The simulator (`--model-config` without `--block-size`), the engine
(`Engine.from_pretrained` without cache arguments) and the experiments use it;
`VllmGeometry.cache_config_kwargs` turns a geometry into the cache core's `CacheConfig` fields.
"""

from hybrid_cache.geometry.derive import VllmGeometry
from hybrid_cache.geometry.derive import VllmGroup
from hybrid_cache.geometry.derive import derive
from hybrid_cache.geometry.flags import VllmFlags
from hybrid_cache.geometry.model_layers import SUPPORTED_MODEL_TYPES
from hybrid_cache.geometry.model_layers import ModelLayers
from hybrid_cache.geometry.model_layers import read_model_layers
from hybrid_cache.geometry.targets import DEFAULT_TARGET
from hybrid_cache.geometry.targets import TARGETS
from hybrid_cache.geometry.targets import Target
from hybrid_cache.geometry.targets import get_target

__all__ = [
  "DEFAULT_TARGET",
  "SUPPORTED_MODEL_TYPES",
  "TARGETS",
  "ModelLayers",
  "Target",
  "VllmFlags",
  "VllmGeometry",
  "VllmGroup",
  "derive",
  "get_target",
  "read_model_layers",
]
