"""A naive host-side driver of the model for tests and notebooks (not the engine).

`ToyDriver` hands out fresh block ids (never freed, no hashing), one block per block position
in every cache group, builds `StepInputs` with `runner.build_step_inputs` and runs the jitted
`runner.forward`. It lets tests express "chunked", "cached prefix" and "decode" runs in a few
lines. Recurrent ids follow vLLM: the state after prefix [0, p) is in the recurrent table's
block (p - 1) // B (`runner.recurrent_state_ids`).

Example::

  drv = ToyDriver(build_model(qwen35_tiny()), num_blocks=64, block_size=64)
  a = drv.new_request(prompt)
  logits = drv.step([(a, 64)])[0]      # first chunk: tokens [0, 64)
  logits = drv.step([(a, 86)])[0]      # rest of the prompt
  b = drv.new_request(other, prefix_from=a, prefix_len=128)  # reuses a's blocks + state
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from models import cache as cache_lib
from models import runner
from models.hybrid_lm import HybridLM


@dataclasses.dataclass
class ToyRequest:
  """A request: all its known tokens, its block table per group, tokens computed so far."""

  tokens: list[int]
  tables: list[list[int]]
  num_computed: int = 0


class ToyDriver:
  """Runs requests step by step on one model and one cache (see module docstring)."""

  def __init__(
    self,
    model: HybridLM,
    *,
    num_blocks: int,
    block_size: int,
    implementation: str | None = "xla",
    poison_value: float | None = None,
    pad_tokens: int | None = 256,
    pad_seqs: int = 4,
    max_blocks: int = 16,
    ckpt_cols: int = 0,
  ):
    """Args:
    poison_value: if set, the null block and every SWA block a step drops from the window
      are filled with this value in the SWA layers' pages, so reading them would show.
    pad_tokens, pad_seqs, max_blocks: fixed step shapes (tokens, sequences incl. one
      padding sequence, block table columns), so every step reuses one compilation.
    ckpt_cols: if > 0, every step passes a checkpoint table of this many columns (all -1
      unless `step(checkpoints=True)`), so steps with and without checkpoints share one
      compilation; needs block_size to be a multiple of 64.
    """
    self.cfg = model.cfg
    self.graphdef, self.params = runner.split_model(model)
    self.block_size = block_size
    self.num_blocks = num_blocks
    self.cache = cache_lib.init_cache(self.cfg, num_blocks, block_size)
    self.implementation = implementation
    self.poison_value = poison_value
    self.pad_tokens, self.pad_seqs, self.max_blocks = pad_tokens, pad_seqs, max_blocks
    self.ckpt_cols = ckpt_cols
    self._next = 1
    kinds = self.cfg.layer_kinds
    slots = self.cfg.layer_slot
    self._swa_slots = [s for k, s in zip(kinds, slots) if k == "S"]
    if poison_value is not None:
      self._poison([0])

  def alloc(self) -> int:
    if self._next >= self.num_blocks:
      raise ValueError(f"num_blocks={self.num_blocks} exhausted")
    self._next += 1
    return self._next - 1

  def new_request(
    self, tokens: Sequence[int], *, prefix_from: ToyRequest | None = None, prefix_len: int = 0
  ) -> ToyRequest:
    """A request; with `prefix_from`, its first `prefix_len` tokens (a block multiple) are a
    cache hit on `prefix_from`'s blocks and recurrent state."""
    req = ToyRequest(list(tokens), [[] for _ in self.cfg.cache_groups])
    if prefix_from is not None:
      if prefix_len % self.block_size or prefix_len > prefix_from.num_computed:
        raise ValueError(
          f"prefix_len={prefix_len} must be a multiple of block_size={self.block_size} and "
          f"<= the source's computed tokens {prefix_from.num_computed}"
        )
      if list(tokens[:prefix_len]) != prefix_from.tokens[:prefix_len]:
        raise ValueError("prefix tokens differ from the source request's")
      nblk = prefix_len // self.block_size
      req.tables = [list(t[:nblk]) for t in prefix_from.tables]
      req.num_computed = prefix_len
    return req

  def _poison(self, blocks: Sequence[int]) -> None:
    if not blocks or not self._swa_slots:
      return
    idx = (np.asarray(self._swa_slots)[:, None], np.asarray(blocks)[None, :])
    c = self.cache
    self.cache = c.replace(
      k=c.k.at[idx].set(self.poison_value), v=c.v.at[idx].set(self.poison_value)
    )

  def step(
    self,
    work: Sequence[tuple[ToyRequest, int]],
    *,
    checkpoints: bool = False,
    decode: bool = False,
  ) -> list[np.ndarray]:
    """Runs one step: each (request, n) computes its next n tokens. Returns logits [n, V]
    per request. With `checkpoints`, recurrent states at every block boundary are written
    ("all" mode; steps must start block-aligned). With `decode` (every n == 1), the step is
    a `StepInputs.decode` step (recurrent decode kernels, T == N == pad_seqs)."""
    bs = self.block_size
    groups = self.cfg.cache_groups
    seqs, dropped = [], []
    for req, n in work:
      start, end = req.num_computed, req.num_computed + n
      if end > len(req.tokens):
        raise ValueError(f"request has {len(req.tokens)} tokens, step needs {end}")
      need = -(-end // bs)
      for t in req.tables:
        while len(t) < need:
          t.append(self.alloc())
      tables = []
      for g, kind in enumerate(groups):
        row = list(req.tables[g])
        if kind == "swa":
          # Keys visible to the first query: positions >= start - W + 1.
          first_needed = max(0, start - self.cfg.window + 1) // bs
          dropped += [b for b in row[:first_needed] if b]
          row = [0] * first_needed + row[first_needed:]
        tables.append(row)
      ids = [
        runner.recurrent_state_ids(req.tables[g], start, n, bs, checkpoints=checkpoints)
        for g in self.cfg.recurrent_groups
      ] or [(-1, -1, [])]
      seqs.append(
        runner.SeqStep(
          req.tokens[start:end],
          start,
          tables,
          tuple(i[0] for i in ids),
          tuple(i[1] for i in ids),
          tuple(tuple(i[2]) for i in ids),
        )
      )
    if self.poison_value is not None:
      # A block dropped by one request may still be in another's window (shared prefix).
      live = {b for s in seqs for t in s.block_tables for b in t}
      self._poison(sorted(set(dropped) - live))
    inputs = runner.build_step_inputs(
      self.cfg,
      seqs,
      bs,
      ckpt_every=bs if (checkpoints or self.ckpt_cols) and not decode else None,
      num_ckpt_cols=0 if decode else self.ckpt_cols or (None if checkpoints else 0),
      max_blocks=self.max_blocks,
      pad_tokens=self.pad_seqs if decode else self.pad_tokens,
      pad_seqs=self.pad_seqs,
      decode=decode,
    )
    logits, self.cache = runner.forward(
      self.graphdef, self.params, self.cache, inputs, implementation=self.implementation
    )
    logits = np.asarray(logits)
    out, off = [], 0
    for req, n in work:
      out.append(logits[off : off + n])
      off += n
      req.num_computed += n
    return out


def max_rel_diff(got: np.ndarray, want: np.ndarray) -> float:
  """max |got - want| / max |want| (the exactness metric of SPEC D)."""
  want = np.asarray(want, np.float64)
  return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))
