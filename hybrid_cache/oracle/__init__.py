"""The plain-Python reference of the cache core (vLLM 0.33 semantics), obviously correct.

`reference_policy.ReferencePolicy` is the whole manager; `rules` holds its pure helper rules;
`flop_eviction` the FLOP-aware eviction order. Differential tests compare it with the jitted
core (`hybrid_cache.core`) and with vLLM's real manager (`tests/hybrid_cache/vllm_diff`).
"""
