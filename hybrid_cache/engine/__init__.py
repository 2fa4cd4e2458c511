"""The serving engine: a continuous-batching loop over the cache core and a real hybrid model.

`engine.Engine` (the loop), `config` (a model's cache configuration), `sharding` (device mesh),
`workload` (shared-prefix workloads), `checkpoint` (Orbax save / restore of a running engine).
This is the only layer of `hybrid_cache` that imports `models/`.
"""
