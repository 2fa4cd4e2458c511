"""Seeded generator of random but meaningful replay scenarios for differential testing.

Each scenario is a scenario-format document (`shared/reference/scenario_format.md`) that vLLM
0.33.0's real cache manager (the oracle in `shared/vllm_oracle/`) can replay: groups in `align`
mode only, no EAGLE, no pinning (the oracle drives neither). `generate(seed)` is a pure
function of the seed.

Configurations come from a few *compile families* (`FAMILIES`): a family fixes what shapes the
jitted core's programs (the groups and their block sizes, the hash block, the pool and model-
length buckets); everything else varies per scenario (pool size inside the family's bucket,
token budget, retention, watermark, `full_sequence_must_fit`, `max_model_len`), so a large
suite compiles a handful of programs per family only.

What the scenarios exercise (issue 13): shared system prompts, chats with decodes, identical
replays, interleaved lifecycles of several requests, one or two sliding windows, mixed block
sizes, partial hits with and without sliding windows (window block equal to or different from
the hash block), divergence at every offset inside a block, repeated-token runs, retention
null / 0 / k*B, small budgets, eviction pressure, watermark, `max_model_len` edges, several
requests per `schedule` step, preemption, `reset_prefix_cache`, `full_sequence_must_fit: false`
and long decodes.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any


@dataclasses.dataclass(frozen=True)
class Family:
  """A compile family: fixed groups and block sizes, a pool and model-length range.

  `groups`: (type, block_size, window) triples; a window is static in the compiled programs, so
  each family fixes its own (families differ: W below, at and above the block, 2 and 3 blocks
  of need); a `window` of 0 on an swa group means "drawn per scenario" from `windows`.
  `num_blocks` and `max_model_len`: inclusive ranges drawn from (each inside one bucket).
  """

  name: str
  groups: tuple[tuple[str, int, int], ...]
  hash_block_size: int | None = None
  num_blocks: tuple[int, int] = (33, 64)  # one pool bucket (64): one set of programs
  max_model_len: tuple[int, int] = (72, 128)  # one table-width bucket
  windows: tuple[int, ...] = (2, 3, 4, 5, 7, 8, 9, 12, 16)


FAMILIES: tuple[Family, ...] = (
  Family("full_mamba", (("full", 4, 0), ("mamba", 4, 0))),
  Family("full_swa_mamba", (("full", 4, 0), ("swa", 4, 7), ("mamba", 4, 0))),
  Family("two_windows", (("full", 4, 0), ("swa", 4, 3), ("swa", 4, 9), ("mamba", 4, 0))),
  # two equal windows: one spec group (vLLM looks them up together)
  Family("equal_windows", (("full", 4, 0), ("swa", 4, 5), ("swa", 4, 5), ("mamba", 4, 0))),
  Family("full_swa", (("full", 4, 0), ("swa", 4, 4))),
  # mixed block sizes without partial hits: scheduler block 8, hash block 4, recurrent block 4
  Family("mixed_sizes", (("full", 4, 0), ("swa", 8, 12), ("mamba", 4, 0))),
  # partial (fine-grained) hits, vLLM §2.5: recurrent block 8 > hash block 4
  Family("partial", (("full", 4, 0), ("mamba", 8, 0))),
  # partial hits with a window whose block equals the hash block (vLLM keeps them on)
  Family("partial_swa_eq", (("full", 4, 0), ("swa", 4, 6), ("mamba", 8, 0))),
  # a window whose block differs from the hash block turns partial hits off (vLLM)
  Family("partial_swa_ne", (("full", 4, 0), ("swa", 8, 9), ("mamba", 8, 0))),
  # equal group blocks, finer hash block: partial hits with the full group looked up finely
  Family("partial_hbs", (("full", 8, 0), ("mamba", 8, 0)), hash_block_size=4),
)
FAMILY_NAMES = tuple(f.name for f in FAMILIES)


def family(name: str) -> Family:
  for f in FAMILIES:
    if f.name == name:
      return f
  raise ValueError(f"family must be one of {FAMILY_NAMES}, got {name!r}")


class _Tokens:
  """Fresh token ids (so that unrelated prompt parts never share a block by accident)."""

  def __init__(self, rng: random.Random):
    self.rng = rng
    self.next = 1000 + rng.randrange(1000)

  def fresh(self, n: int) -> list[int]:
    out = list(range(self.next, self.next + n))
    self.next += n + self.rng.randrange(1, 50)
    return out


def _config(rng: random.Random, fam: Family) -> dict[str, Any]:
  groups = []
  for kind, bs, window in fam.groups:
    g: dict[str, Any] = {"type": kind, "block_size": bs}
    if kind == "swa":
      g["window"] = window or rng.choice(fam.windows)
    groups.append(g)
  sizes = [bs for _, bs, _ in fam.groups]
  sbs = math.lcm(*sizes)
  cfg: dict[str, Any] = {
    "block_size": sizes[0],
    "num_blocks": rng.randint(*fam.num_blocks),
    "groups": groups,
  }
  if fam.hash_block_size is not None:
    cfg["hash_block_size"] = fam.hash_block_size
  has_state = any(k in ("swa", "mamba") for k, _, _ in fam.groups)
  cfg["retention_interval"] = (
    rng.choice([None, None, 0, 0, sbs, 2 * sbs, 3 * sbs]) if has_state else None
  )
  cfg["max_num_batched_tokens"] = rng.choice([8, 16, 24, 32, 48, 64, 8192, 8192])
  if cfg["max_num_batched_tokens"] < max(sizes):
    cfg["max_num_batched_tokens"] = 8192
  cfg["max_model_len"] = rng.randint(*fam.max_model_len)
  if rng.random() < 0.25:
    cfg["full_sequence_must_fit"] = False
  if rng.random() < 0.2:
    cfg["watermark"] = rng.choice([0.05, 0.1, 0.2])
  return cfg


def _prompts(rng: random.Random, toks: _Tokens, cfg: dict[str, Any], sbs: int, hbs: int):
  """Named prompts: system prompts, user turns and chats that extend earlier prompts."""
  mml = cfg["max_model_len"]
  prompts: dict[str, Any] = {}
  # one or two shared system prompts ending at a random offset inside a block
  systems = []
  for s in range(rng.choice([1, 1, 2])):
    n = rng.randint(0, 6) * sbs + rng.randrange(sbs)
    n = max(1, min(n, mml // 2))
    if rng.random() < 0.15:  # a repeated-token run (hashes repeat block after block)
      body: Any = {"repeat": [rng.randrange(1, 50), n]}
    else:
      body = toks.fresh(n)
    prompts[f"S{s}"] = body
    systems.append((f"S{s}", n))
  lengths: dict[str, int] = dict(systems)
  names = []
  for i in range(rng.randint(3, 7)):
    name = f"R{i}"
    kind = rng.random()
    if kind < 0.15 and names:  # identical replay of an earlier prompt
      src = rng.choice(names)
      prompts[name] = src
      lengths[name] = lengths[src]
    elif kind < 0.45 and names:  # a chat turn: an earlier prompt + its answer + a new question
      src = rng.choice(names)
      add = rng.randint(1, 3 * sbs)
      if lengths[src] + add > mml:
        add = max(0, mml - lengths[src])
      if add == 0:
        prompts[name] = src
        lengths[name] = lengths[src]
      else:
        tail: Any = toks.fresh(add)
        if rng.random() < 0.2:
          tail = {"repeat": [rng.randrange(1, 50), add]}
        prompts[name] = {"concat": [src, tail]}
        lengths[name] = lengths[src] + add
    else:  # system prompt + a user part, diverging at any offset inside a block
      sys_name, sys_len = rng.choice(systems)
      room = mml - sys_len
      if rng.random() < 0.1:  # a max_model_len edge: exactly max_model_len tokens
        add = room
      else:
        add = rng.randint(1, max(1, min(room, rng.choice([hbs, sbs, 3 * sbs, 6 * sbs]))))
      add = max(0, min(add, room))
      parts: list[Any] = [sys_name]
      if add:
        parts.append(toks.fresh(add))
      prompts[name] = {"concat": parts} if len(parts) > 1 else sys_name
      lengths[name] = sys_len + add
    names.append(name)
  return prompts, lengths, names


def generate(seed: int, family_name: str | None = None) -> dict[str, Any]:
  """One scenario (a JSON-able dict) from `seed`; the family is drawn unless named."""
  rng = random.Random(seed)
  fam = family(family_name) if family_name else rng.choice(FAMILIES)
  cfg = _config(rng, fam)
  sizes = [g["block_size"] for g in cfg["groups"]]
  sbs = math.lcm(*sizes)
  hbs = cfg.get("hash_block_size", math.gcd(*sizes))
  toks = _Tokens(rng)
  prompts, lengths, names = _prompts(rng, toks, cfg, sbs, hbs)
  mml = cfg["max_model_len"]

  # request lifecycle, tracked as the replay sees it
  active: dict[str, dict[str, int]] = {}  # added, not freed: name -> {"tokens": n}
  actions: list[dict[str, Any]] = []
  uses = 0

  def chunk():
    return rng.choice([None, None, None, rng.choice([1, 2, 3, sbs - 1, sbs, sbs + 1, 2 * sbs, 13])])

  def new_entry() -> dict[str, Any]:
    nonlocal uses
    uses += 1
    prompt = rng.choice(names)
    req = f"{prompt}_{uses}"
    active[req] = {"tokens": lengths[prompt]}
    return {"req": req, "prompt": prompt}

  def put(a: dict[str, Any]) -> None:
    c = chunk()
    if c is not None and c > 0:
      a["chunk"] = c
    actions.append(a)

  for _ in range(rng.randint(6, 22)):
    r = rng.random()
    # a schedule entry of an active request continues it when it runs, or (re)admits it when
    # its admission failed or it was preempted: every active request may join a step
    running = list(active)
    if r < 0.30 or not active:
      e = new_entry()
      put({"op": "prefill", "req": e["req"], "prompt": e["prompt"]})
    elif r < 0.45:
      k = rng.randint(2, 4)
      entries, seen = [], set()
      for _ in range(k):
        if running and rng.random() < 0.4:
          n = rng.choice(running)
          if n in seen:
            continue
          seen.add(n)
          ent: dict[str, Any] = {"req": n}
        else:
          e = new_entry()
          seen.add(e["req"])
          ent = {"req": e["req"], "prompt": e["prompt"]}
        if rng.random() < 0.4:
          ent["chunk"] = rng.choice([1, 3, sbs, 2 * sbs, 5])
        entries.append(ent)
      actions.append({"op": "schedule", "entries": entries})
    elif r < 0.55 and active:
      n = rng.choice(list(active))
      put({"op": "prefill", "req": n})
    elif r < 0.63 and active:
      n = rng.choice(list(active))
      st = active[n]
      # decode only makes sense once the prompt is computed; the replay checks that itself,
      # so a decode is always preceded by a prefill of the same request
      put({"op": "prefill", "req": n})
      room = mml - st["tokens"]
      if room > 0:
        m = rng.randint(1, min(room, rng.choice([2, 5, 2 * sbs + 1, 40])))
        if rng.random() < 0.3:
          dt: Any = {"repeat": [rng.randrange(1, 50), m]}
        else:
          dt = toks.fresh(m)
        actions.append({"op": "decode", "req": n, "tokens": dt})
        st["tokens"] += m
    elif r < 0.80 and active:
      n = rng.choice(list(active))
      actions.append({"op": rng.choice(["free", "free", "finish"]), "req": n})
      del active[n]
    elif r < 0.86 and active:
      n = rng.choice(list(active))
      actions.append({"op": "preempt", "req": n})
    elif r < 0.92:
      actions.append({"op": "lookup", "req": "L", "prompt": rng.choice(names)})
    elif r < 0.96:
      actions.append({"op": "reset_prefix_cache"})
    else:
      actions.append({"op": "state"})
  # finish everything, then look every prompt up once more (what stayed cached)
  for n in list(active):
    actions.append({"op": "free", "req": n})
  actions.append({"op": "state"})
  for p in rng.sample(names, k=min(3, len(names))):
    actions.append({"op": "lookup", "req": "L", "prompt": p})
  return {
    "name": f"gen_{fam.name}_{seed}",
    "description": f"generated (tests/hybrid_cache/vllm_diff/generator.py), seed {seed}",
    "config": cfg,
    "prompts": prompts,
    "actions": actions,
  }
