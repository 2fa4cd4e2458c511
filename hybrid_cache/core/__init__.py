"""The jitted cache core: pure functions over one `CacheState` pytree (vLLM 0.33 rules).

Modules: `state` (the pytree and its layout), `block_pool` (free queue, ref counts),
`block_index` (hash -> block), `coordinator` (prefix lookup across groups), `scheduler` (one
schedule step: split, allocate, copy-on-write, key caching), `admission`, `eviction` and
`eviction_costs`, `release` (free / pin), `invariants`, `groups/` (per-kind rules),
`compile_cache` (compile keys and buckets), `alpha_tuning` (Marconi's online alpha).
The plain-Python twin of every rule lives in `hybrid_cache.twin`.
"""
