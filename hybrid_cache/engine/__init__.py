"""The serving engine: a continuous-batching loop over the cache core and a real hybrid model.

`engine.Engine` (the loop: intake, scheduling, one step), with its parts beside it: `records`
(`RequestOutput`, `EngineStats`, a request's state), `model_step` (the jitted model step and
its inputs), `spec_step` (speculative decoding's verify windows; `spec` has the rules),
`lifecycle` (commit, finish, preempt, drop). `config` (a model's cache configuration),
`sharding` (device mesh), `drafter` (draft proposers), `workload` (shared-prefix workloads),
`checkpoint` (Orbax save / restore of a running engine).
This is the only layer of `hybrid_cache` that imports `models/`.
"""
