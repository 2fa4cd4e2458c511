"""The policy registry: the names `CacheConfig` accepts, and where each policy's two twins live.

A policy is one core file `hybrid_cache/core/policies/<name>.py` + its twin
`hybrid_cache/twin/policies/<name>.py` + one line here, in the table of its seam. Names are
unique across seams (one file per name). Each seam's built-in default is vLLM 0.33's own rule
and has no file.

  eviction   core   `priority(lay, state, blocks) -> i32[NB]`
             twin `priority(config, blocks, order) -> list[int]`
             For every eviction candidate (a keyed free block that can still be hit), an integer
             priority: lower is evicted first; ties go least recently freed first.
             Default `lru`: vLLM's free queue itself (no re-ordering). The registry line says
             what the policy reads beyond `FreeBlocks`' base fields (`Reads`: cost fields,
             chain features, the eviction clock); the core keeps only what is declared.
             A policy with a clock (GreedyDual, `greedy_dual`; seam gained it in issue 28)
             reads `FreeBlocks.stamp`, the clock when each key was registered or last hit;
             the frame records the priority it ranks each candidate with and raises the clock
             to it when the block is evicted (`core.eviction`, `twin.eviction`).
             A policy with the access history (LRU-2, `lru2`) reads `FreeBlocks.penult`, the
             step of each key's access before its latest (0 = none); a retirement raises the
             superseding state's to the retired states' (`core.release.retire`).
  placement  core   `keep(lay, r, g, pos, boundaries, default) -> bool[MB]`
             twin `keep(config, i, block_size, alignment, boundaries, default) -> bool`
             Which state blocks of a recurrent group a request keeps (registers a key for): the
             positions of its recurrent checkpoints. `default` is vLLM's mask (§2.4.7: dense,
             or `retention_interval` plus the replay boundaries). Default `vllm`: that mask.
             A stateful placement (statistics across requests) also declares
             `state_size(lay) -> S` (its own columns of `policy_state`, i32[R, S], after the
             admission policy's) and its core `keep` takes and returns them:
             `keep(lay, r, g, pos, boundaries, default, table, req) -> (table, bool[MB])`,
             `req` a `core.cache_keys.PlacementRequest` (admitted, hit, spb, prompt, tokens,
             the blocks the call registers up to, their keys); called once per registration
             call and recurrent group, whether or not a block is offered. Its twin is a class
             `Placement(config)`: `start(gid, req)` (a `twin.cache_keys.PlacementRequest`)
             once per call and group, then the stateless `keep` per block. Stateless policies
             are called as before (the seam gained the state in issue 28: `adaptive`).
  admission  core   `STATE_SIZE`, `admit(lay, table, g, keys, candidates)`
                    -> (table, bool[MB])
             twin `Admission(config)` with `admit(gid, key) -> bool`
             Whether a recurrent state block that placement keeps is admitted to the cache,
             from the policy's own statistics across requests (`table`, the state's
             `policy_state` i32[R, STATE_SIZE], R = recurrent groups; the twin's object). The
             candidates of one request are offered in block order. Default `all`: every block.
  retention  core   `pin(lay, state, slot, keyed, default) -> list[bool[MB]]`
             twin `pin(config, groups, keyed, default, num_prompt, alignment)`
                    -> list[list[int]]
             With `pinning` on, which held blocks a finishing request pins (SPEC B1's pinned
             tier), per group. `default` is SPEC B1's rule (`finish_pin_mask` of each kind).
             Default `prefix`: that rule.
  retirement core   `state_size(lay) -> S` (its `policy_state` columns, after the admission's
                    and a stateful placement's),
                    `observe(lay, r, g, pos, table, req, kept) -> table` per registration call
                    and recurrent group (`req` a `core.cache_keys.PlacementRequest`, `kept`
                    bool[MB] the state blocks the call keeps),
                    `pick(lay, state, slot, table) -> (i32[R * MB], table)` at a finish
                    (the blocks, 0 = none; the columns with the slot's own cleared)
             twin `Retirement(config)` with `observe(gid, req, kept: list[int])` and
                    `pick(s, request) -> list[int]` (forgets the request)
             Which recurrent state blocks a *finished* request's own deeper checkpoints
             supersede are retired: once its blocks are freed (`core.release.retire`), each
             picked block that is free in the normal queue (ref 0: no running request holds
             it) with its key in a recurrent group loses its keys and moves to the free
             queue's head (first reused, as vLLM frees an unkeyed block); attention blocks
             are never retired. Default `none`: nothing is retired (vLLM 0.33).

`CacheConfig(eviction=..., placement=..., admission=..., retention=..., retirement=...)`
selects them; the
simulator's `--policy` runs each registered eviction policy over the `vllm_default` profile (and
`--placement` / `--admission` / `--retention-policy` pick the other seams); the differential
machines in `tests/hybrid_cache/policies_test.py` compare every registered policy's twins. This
module imports nothing heavy (the config validates names without importing jax).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import NamedTuple


class Reads(NamedTuple):
  """What an eviction policy reads besides `FreeBlocks`' base fields (candidate, group,
  token_end, recency, num_candidates); the core maintains or keeps only what is declared."""

  # the config's eviction cost fields (FLOPs, bytes per block): the compile key keeps those
  # fields (and an exact max_model_len) only for such policies
  costs: bool = False
  # the chain features `FreeBlocks.hits` / `chain_start`: the core maintains them (`block_aux`
  # fields key_hits / chain_start, `req_group` field chain) only for such policies
  # (`Layout.chain_features`; maintained on every step they cost the core ~13%, issue 14)
  chain: bool = False
  # the eviction clock (GreedyDual's L; implies `chain`): the core keeps per block the clock
  # when its key was registered or last hit (`FreeBlocks.stamp`) and the priority it was last
  # ranked with, and raises the clock to that priority when the block is evicted
  # (`block_aux` fields evict_stamp / evict_ranked, counter evict_clock; `Layout.eviction_clock`)
  clock: bool = False
  # the access history (LRU-2): the core keeps per block the step of its key's last access
  # (registration or hit) and of the one before (`FreeBlocks.penult`), and a retirement hands
  # the retired states' penultimate accesses to the state that superseded them (`block_aux`
  # fields key_last / key_penult; `Layout.access_history`)
  history: bool = False
  # the candidates' recency rank (`FreeBlocks.recency`): the frame then orders the whole free
  # queue at every step (two sorts of the pool); without it, only each pool's first
  # `eviction.order_window` blocks, the rest when a step reaches them (`eviction` module
  # docstring, "Lazy order")
  recency: bool = False


# name -> what the policy reads (`Reads`)
EVICTION: dict[str, Reads] = {
  "lru": Reads(),  # vLLM 0.33's free queue (built in: no re-ordering)
  # Marconi's FLOPs-per-byte utility with recency (SPEC B2)
  "flop_aware": Reads(costs=True, recency=True),
  "deepest_first": Reads(),  # the README's worked example: deepest prefix position first
  # Marconi-style: the KV span back to the previous kept state x (1 + hits)
  "chain_value": Reads(chain=True),
  # the simulator's chain-aware GreedyDual (sim/chain_eviction.py): stamp + (1 + hits) x FLOPs
  # saved back to the previous kept state per byte
  "greedy_dual": Reads(costs=True, chain=True, clock=True),
  # LRU-2 (O'Neil et al., SIGMOD'93; the simulator's unit cache with `penultimate=True`): the
  # step of each block's penultimate access, inherited through retirement
  "lru2": Reads(history=True),
  # `greedy_dual` or `lru2`, chosen at run time (`CacheState.eviction_weighting`) by the
  # simulator's shadow tuner (`sim/core_scan.py`, the unit cache's re-tuning): it reads both
  "tuned": Reads(costs=True, chain=True, clock=True, history=True),
}
EVICTION_POLICIES = tuple(EVICTION)
assert all(r.chain for r in EVICTION.values() if r.clock), "a clock implies the chain features"
# eviction `tuned`'s weightings, by index (`CacheState.eviction_weighting`, the twin's
# `EvictionOrder.weighting`)
TUNED_WEIGHTINGS = ("greedy_dual", "lru2")


def tuned_weighting(name: str) -> int:
  """The index of eviction `tuned`'s weighting `name`; ValueError naming the allowed ones."""
  if name not in TUNED_WEIGHTINGS:
    raise ValueError(f"weighting must be one of {TUNED_WEIGHTINGS}, got {name!r}")
  return TUNED_WEIGHTINGS.index(name)


PLACEMENT_POLICIES = (
  "vllm",  # vLLM 0.33's retention mask (§2.4.7), built in
  "junctions",  # Marconi's placement: states at the replay boundaries only (the README example)
  # the simulator's `adaptive` placement: the branch point and one continuation point on a
  # learned alignment (stateful: `policy_state` columns)
  "adaptive",
)

ADMISSION_POLICIES = (
  "all",  # vLLM 0.33: every kept state block is registered, built in
  "second_sighting",  # Marconi-style admission: a state is kept once its prefix recurs
)

RETENTION_POLICIES = (
  "prefix",  # SPEC B1: every keyed FA block, the last SWA window, the deepest state, built in
  "state_chain",  # only what a hybrid hit can use: the KV up to the deepest kept state
)

RETIREMENT_POLICIES = (
  "none",  # vLLM 0.33: nothing retired, built in
  # the simulator's retirement of superseded checkpoints (`UnitCache._retire`), decided by
  # `SupersessionStats` (stateful: `policy_state` columns)
  "superseded",
)

_DEFAULTS = {
  "eviction": "lru",
  "placement": "vllm",
  "admission": "all",
  "retention": "prefix",
  "retirement": "none",
}


def reads_costs(eviction: str) -> bool:
  """Whether `eviction` reads `CacheConfig.eviction_*` cost fields."""
  return EVICTION[eviction].costs


def reads_chain(eviction: str) -> bool:
  """Whether `eviction` reads the chain features `FreeBlocks.hits` / `chain_start` (only then
  does the core maintain them, `Layout.chain_features`)."""
  return EVICTION[eviction].chain


def reads_clock(eviction: str) -> bool:
  """Whether `eviction` keeps the eviction clock (`FreeBlocks.stamp`; only then does the core
  carry the stamp and ranked-priority columns, `Layout.eviction_clock`)."""
  return EVICTION[eviction].clock


def reads_history(eviction: str) -> bool:
  """Whether `eviction` reads the access history (`FreeBlocks.penult`; only then does the core
  carry the last / penultimate access columns, `Layout.access_history`)."""
  return EVICTION[eviction].history


def reads_recency(eviction: str) -> bool:
  """Whether `eviction` reads the candidates' recency rank (`FreeBlocks.recency`; only then
  does the frame order the whole free queue at every step, `Layout.ranks_all`)."""
  return EVICTION[eviction].recency


def rekeys(eviction: str) -> bool:
  """Whether `eviction` re-orders vLLM's free queue (every policy but `lru`; the state then
  carries `queue_order`, `Layout.rekeys`)."""
  return eviction != "lru"


def core_eviction(name: str) -> ModuleType | None:
  """The jitted twin of eviction policy `name` (None for `lru`)."""
  return core_policy("eviction", name)


def twin_eviction(name: str) -> ModuleType | None:
  """The plain-Python twin of eviction policy `name` (None for `lru`)."""
  return twin_policy("eviction", name)


def core_policy(seam: str, name: str) -> ModuleType | None:
  """The jitted twin of policy `name` of `seam` ("eviction", "placement", "admission",
  "retention", "retirement"); None for the seam's built-in default."""
  if name == _DEFAULTS[seam]:
    return None
  return importlib.import_module(f"hybrid_cache.core.policies.{name}")


def twin_policy(seam: str, name: str) -> ModuleType | None:
  """The plain-Python twin of policy `name` of `seam`; None for the seam's built-in default."""
  if name == _DEFAULTS[seam]:
    return None
  return importlib.import_module(f"hybrid_cache.twin.policies.{name}")
