"""The plain-Python twin of the cache core (vLLM 0.33 semantics), obviously correct.

`python_manager.PythonCacheManager` is the whole manager: a thin host edge (validation, request
names) over one `state.TwinState`. Each rule is a set of free functions over that state in
the module named after its jitted twin in `hybrid_cache.core`: `block_pool`, `coordinator`,
`admission`, `byte_budget`, `allocate`, `cache_keys`, `release`, `step`, `scheduler`. `rules`
holds the pure per-kind helper rules over ints and lists; `eviction` the free-list order of the
eviction policies, whose twins live in `policies/`.
Differential tests compare it with the jitted core (`hybrid_cache.core`) and with vLLM's real
manager (`tests/hybrid_cache/vllm_diff`).
"""
