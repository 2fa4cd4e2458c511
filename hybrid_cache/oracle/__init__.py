"""The plain-Python reference of the cache core (vLLM 0.33 semantics), obviously correct.

`reference_policy.ReferencePolicy` is the whole manager; `rules` holds its pure helper rules;
`eviction` the free-list order of the eviction policies, whose twins live in `policies/`.
Differential tests compare it with the jitted core (`hybrid_cache.core`) and with vLLM's real
manager (`tests/hybrid_cache/vllm_diff`).
"""
