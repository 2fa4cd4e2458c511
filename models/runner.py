"""Jitted forward step and host-side builders of `StepInputs`.

`nnx.split` the model once (`split_model`), then call the module-level jitted `forward` with
the graphdef (static), the parameter state, the cache (donated) and the step inputs::

  model = build_model(qwen35_tiny(), seed=0)
  graphdef, params = split_model(model)
  cache = init_cache(model.cfg, num_blocks=32, block_size=64)
  inputs = build_step_inputs(model.cfg, [SeqStep(tokens, 0, tables, state_write=3)], 64)
  logits, cache = forward(graphdef, params, cache, inputs)

The engine builds `StepInputs` from the cache core's block tables and the state slots its step
results carry (`hybrid_cache.types.RecurrentSlots`); `recurrent_state_ids` maps a bare
recurrent block table that holds every state (mode "all", vLLM §5.1, §5.4) to the same ids, for
`models.testing`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models import cpu_blas
from models.cache import ModelCache
from models.config import ModelConfig
from models.hybrid_lm import HybridLM
from models.step_inputs import StepInputs

__all__ = [
  "SeqStep",
  "StepInputs",
  "build_step_inputs",
  "padding_decode",
  "forward",
  "recurrent_state_ids",
  "split_model",
]


def split_model(model: HybridLM) -> tuple[nnx.GraphDef, nnx.State]:
  """`nnx.split` once, outside any loop; pass both halves to `forward`.

  Also makes the CPU LAPACK kernels single-threaded (`models.cpu_blas`; same results).
  """
  cpu_blas.limit_lapack_threads()
  return nnx.split(model)


@functools.partial(
  jax.jit, static_argnames=("graphdef", "implementation"), donate_argnames=("cache",)
)
def forward(
  graphdef: nnx.GraphDef,
  params: nnx.State,
  cache: ModelCache,
  inputs: StepInputs,
  implementation: str | None = None,
) -> tuple[jax.Array, ModelCache]:
  """One model step: (logits f32[T, vocab], new cache). `cache` is donated."""
  model = nnx.merge(graphdef, params)
  return model(cache, inputs, implementation=implementation)


@dataclasses.dataclass
class SeqStep:
  """One sequence's share of a step (host side).

  Attributes:
    token_ids: the new tokens of this step (positions num_computed ...).
    num_computed: tokens already in the cache (KV written, state available at state_read).
    block_tables: per cache group, block ids by block position (index j covers positions
      [j*B, (j+1)*B)); 0 = null block. Attention groups need entries for every position the
      step reads or writes; the recurrent group's table is not used by the model.
    state_read / state_write / ckpt_write: recurrent pool ids (see `StepInputs`): an int /
      an int / a sequence of ints used for every recurrent group, or, with R recurrent
      groups, a sequence of R of those (one per group, in `cfg.recurrent_groups` order).
  """

  token_ids: Sequence[int]
  num_computed: int
  block_tables: Sequence[Sequence[int]]
  state_read: int | Sequence[int] = -1
  state_write: int | Sequence[int] = -1
  ckpt_write: Sequence[int] | Sequence[Sequence[int]] = ()
  padding: bool = False  # an inert sequence (`padding_decode`): no KV writes, not validated

  def recurrent_ids(self, rows: int) -> tuple[list[int], list[int], list[list[int]]]:
    """(read[R], write[R], ckpts[R][...]) with R = `rows`; int ids apply to every group."""
    read, write, ck = self.state_read, self.state_write, self.ckpt_write
    if isinstance(read, int | np.integer):
      read = [int(read)] * rows
    if isinstance(write, int | np.integer):
      write = [int(write)] * rows
    if not len(ck):
      ck = [[] for _ in range(rows)]
    elif isinstance(ck[0], int | np.integer):
      ck = [list(ck)] * rows
    read, write, ck = list(read), list(write), [list(c) for c in ck]
    if not len(read) == len(write) == len(ck) == rows:
      raise ValueError(
        f"state_read / state_write / ckpt_write must have one entry per recurrent group "
        f"({rows}), got {len(read)} / {len(write)} / {len(ck)}"
      )
    return read, write, ck


def recurrent_state_ids(
  table: Sequence[int],
  num_computed: int,
  num_new: int,
  block_size: int,
  *,
  checkpoints: bool = False,
) -> tuple[int, int, list[int]]:
  """(state_read, state_write, ckpt_write) for a request's recurrent block table.

  The state after prefix [0, p) lives in the block holding token p - 1 (vLLM's state block):
  read = table[(num_computed - 1) // B] (-1 when num_computed == 0),
  write = table[(num_computed + num_new - 1) // B]. With `checkpoints` ("all" mode), the
  state after each full block of this step is written to that block; this needs
  num_computed % B == 0 (the kernels checkpoint every B tokens from the step's start).

  Example (B=4): table [7, 8, 9], num_computed=4, num_new=6, checkpoints=True ->
  (7, 9, [8]): read the state after 4 tokens from block 7, checkpoint after 8 tokens into 8,
  final state after 10 tokens into 9.
  """
  seq_len = num_computed + num_new
  if num_new < 1:
    raise ValueError(f"num_new must be >= 1, got {num_new}")
  if len(table) < -(-seq_len // block_size):
    raise ValueError(
      f"recurrent block table has {len(table)} entries, needs >= {-(-seq_len // block_size)} "
      f"for {seq_len} tokens at block_size={block_size}"
    )
  read = table[(num_computed - 1) // block_size] if num_computed > 0 else -1
  write = table[(seq_len - 1) // block_size]
  ckpts: list[int] = []
  if checkpoints:
    if num_computed % block_size:
      raise ValueError(
        f"num_computed must be a multiple of block_size={block_size} for checkpoints, "
        f"got {num_computed}"
      )
    first = num_computed // block_size
    ckpts = [table[first + j] for j in range(num_new // block_size)]
  return read, write, ckpts


def query_start_loc(seqs: Sequence[SeqStep]) -> np.ndarray:
  """i32[len(seqs) + 1]: where each sequence's new tokens start in the step's flat token array
  (`StepInputs.query_start_loc`), then the total; padding sequences appended after `seqs` do
  not move the entries of `seqs`."""
  return np.concatenate([[0], np.cumsum([len(s.token_ids) for s in seqs])]).astype(np.int32)


def build_step_inputs(
  cfg: ModelConfig,
  seqs: Sequence[SeqStep],
  block_size: int,
  *,
  ckpt_every: int | None = None,
  num_ckpt_cols: int | None = None,
  max_blocks: int | Sequence[int] | None = None,
  pad_tokens: int | None = None,
  pad_seqs: int | None = None,
  decode: bool | None = None,
  num_decodes: int = 0,
) -> StepInputs:
  """Packs `seqs` into a `StepInputs` (host-side numpy, then device arrays).

  Args:
    cfg: the model config (gives the cache groups).
    seqs: the sequences of the step, in order.
    block_size: tokens per block (the cache's block size).
    ckpt_every: tokens between checkpoints (required if any seq has ckpt_write).
    num_ckpt_cols: M, columns of `ckpt_write` (default: the longest ckpt list).
    max_blocks: columns of every block table (default: the longest table), or one width per
      cache group (a group of larger blocks needs fewer columns for the same length: the
      attention reads every column, so a narrower table is less attention work).
    pad_tokens: pad T to this many tokens (fixed shapes = one compilation per bucket).
    pad_seqs: pad N to this many sequences. Padding forms extra sequences (the last one
      owns every padding token, the others are empty) with null block tables, no KV
      writes (slot -1) and no state reads or writes (-1); their logits are garbage.
    decode: build a decode step (`StepInputs.decode`): every sequence has one token, and
      padding sequences get one token each (T == N == pad_seqs; pad_tokens, if given, must
      equal pad_seqs). None = decode iff every sequence has one token and no padding is
      asked for, or pad_tokens == pad_seqs.
    num_decodes: D, a mixed step's leading one-token sequences (`StepInputs.num_decodes`):
      seqs[:D] must have one token each and at least one sequence (padding included) must
      follow them; 0 with a decode step. Padding one-token sequences are the caller's to add
      (`padding_decode`).
  Raises:
    ValueError: a sequence without tokens, a table too short, or a new token whose block is
      the null block.
  """
  groups = cfg.cache_groups
  if not seqs:
    raise ValueError("seqs must contain at least one sequence")
  for i, s in enumerate(seqs):
    if len(s.token_ids) < 1:
      raise ValueError(f"seqs[{i}].token_ids must have >= 1 token, got 0")
    if len(s.block_tables) != len(groups):
      raise ValueError(
        f"seqs[{i}].block_tables must have one table per cache group {groups}, "
        f"got {len(s.block_tables)}"
      )
  if num_decodes:
    padded = pad_seqs is not None or pad_tokens is not None  # padding sequences follow
    if num_decodes < 0 or num_decodes >= len(seqs) + padded:
      raise ValueError(
        f"num_decodes must be in [0, {len(seqs)}) (sequences must follow the decodes), "
        f"got {num_decodes}"
      )
    if any(len(s.token_ids) != 1 for s in seqs[:num_decodes]):
      raise ValueError(f"num_decodes={num_decodes} needs one token in each of seqs[:{num_decodes}]")
  n_user = len(seqs)
  n_real = sum(len(s.token_ids) for s in seqs)
  one_each = all(len(s.token_ids) == 1 for s in seqs)
  if decode is None:
    decode = one_each and (
      (pad_tokens is None and pad_seqs is None) or (pad_seqs is not None and pad_tokens == pad_seqs)
    )
  if decode and num_decodes:
    raise ValueError(f"num_decodes must be 0 in a decode step, got {num_decodes}")
  if decode:
    if not one_each:
      raise ValueError("decode=True needs exactly one token in every sequence")
    if pad_seqs is not None:
      if pad_tokens is not None and pad_tokens != pad_seqs:
        raise ValueError(
          f"decode=True needs pad_tokens == pad_seqs, got {pad_tokens} != {pad_seqs}"
        )
      if pad_seqs < len(seqs):
        raise ValueError(f"pad_seqs={pad_seqs} is less than the step's {len(seqs)} sequences")
      seqs = list(seqs) + [padding_decode(cfg)] * (pad_seqs - len(seqs))
  elif pad_tokens is not None or pad_seqs is not None:
    n_pad_tok = 0 if pad_tokens is None else pad_tokens - n_real
    n_pad_seq = (len(seqs) + 1 if pad_seqs is None else pad_seqs) - len(seqs)
    if n_pad_tok < 0:
      raise ValueError(f"pad_tokens={pad_tokens} is less than the step's {n_real} tokens")
    if n_pad_seq < 1:
      raise ValueError(f"pad_seqs={pad_seqs} must exceed the step's {len(seqs)} sequences")
    empty = [[] for _ in groups]
    pad = [0] * (n_pad_seq - 1) + [n_pad_tok]
    seqs = list(seqs) + [SeqStep([0] * p, 0, empty) for p in pad]
  lens = [len(s.token_ids) for s in seqs]
  qsl = query_start_loc(seqs)
  tokens = np.concatenate([np.asarray(s.token_ids, np.int32) for s in seqs])
  positions = np.concatenate(
    [np.arange(s.num_computed, s.num_computed + n, dtype=np.int32) for s, n in zip(seqs, lens)]
  )
  seq_lens = np.asarray([s.num_computed + n for s, n in zip(seqs, lens)], np.int32)
  # A padding sequence reads (null) blocks for all its positions.
  if isinstance(max_blocks, int) or max_blocks is None:
    mbs = [
      max_blocks
      or max([-(-max(lens) // block_size)] + [len(t) for s in seqs for t in s.block_tables])
    ] * len(groups)
  else:
    mbs = list(max_blocks)
    if len(mbs) != len(groups):
      raise ValueError(f"max_blocks must have one width per cache group ({len(groups)}), got {mbs}")
  # every token's sequence, and which sequences write KV (real ones: not padding)
  owner = np.repeat(np.arange(len(seqs)), lens)
  writes = np.asarray([i < n_user and not s.padding for i, s in enumerate(seqs)])[owner]
  page, offset = positions // block_size, positions % block_size  # of each token, every group
  tables, slots = [], []
  for g, kind in enumerate(groups):
    mb = mbs[g]
    tab = np.zeros((len(seqs), mb), np.int32)
    for i, s in enumerate(seqs):
      row = s.block_tables[g]
      if len(row) > mb:
        raise ValueError(f"seqs[{i}].block_tables[{g}] has {len(row)} > max_blocks={mb} entries")
      tab[i, : len(row)] = row
      if kind == "mamba" or i >= n_user or s.padding:
        continue
      need = -(-int(seq_lens[i]) // block_size)
      if len(row) < need:
        raise ValueError(
          f"seqs[{i}].block_tables[{g}] ({kind}) has {len(row)} entries, needs >= {need} for "
          f"{int(seq_lens[i])} tokens at block_size={block_size}"
        )
    if kind == "mamba" or not writes.any():
      slots.append(np.full((len(tokens),), -1, np.int32))
    else:
      # the new tokens' slots in one numpy expression over the step (a per-token Python loop
      # took ~0.75 ms of a 4,096-token step's 1.3 ms here); a writing token's column is in
      # its table (checked above), a padding token's is clipped and not written
      blk = tab[owner, np.minimum(page, mb - 1)]
      null = np.flatnonzero(writes & (blk <= 0))
      if len(null):
        t = null[0]
        raise ValueError(
          f"seqs[{owner[t]}].block_tables[{g}][{page[t]}] is {int(blk[t])}: a new "
          f"token at position {positions[t]} needs a real block (>= 1)"
        )
      slots.append(np.where(writes, blk * block_size + offset, -1).astype(np.int32))
    tables.append(tab)
  rows = cfg.num_recurrent_rows
  ids = [s.recurrent_ids(rows) for s in seqs]
  m = num_ckpt_cols
  if m is None:
    m = max(len(c) for _, _, cks in ids for c in cks)
  if m > 0 and ckpt_every is None:
    raise ValueError("ckpt_every is required when a sequence has ckpt_write entries")
  ck = np.full((rows, len(seqs), m), -1, np.int32)
  for i, (_, _, cks) in enumerate(ids):
    for r, c in enumerate(cks):
      if len(c) > m:
        raise ValueError(f"seqs[{i}].ckpt_write has {len(c)} > {m} entries")
      ck[r, i, : len(c)] = c
  return StepInputs(
    token_ids=jnp.asarray(tokens),
    positions=jnp.asarray(positions),
    query_start_loc=jnp.asarray(qsl),
    seq_lens=jnp.asarray(seq_lens),
    block_tables=tuple(jnp.asarray(t) for t in tables),
    slot_mapping=tuple(jnp.asarray(s) for s in slots),
    state_read=jnp.asarray(np.asarray([r for r, _, _ in ids], np.int32).T),
    state_write=jnp.asarray(np.asarray([w for _, w, _ in ids], np.int32).T),
    ckpt_write=jnp.asarray(ck),
    ckpt_every=ckpt_every if m > 0 else None,
    decode=bool(decode),
    num_decodes=int(num_decodes),
  )


def padding_decode(cfg: ModelConfig) -> SeqStep:
  """A one-token padding sequence (null tables, no KV or state reads or writes): fills a mixed
  step's decode part up to its static bucket (`StepInputs.num_decodes`); its logits are
  garbage."""
  return SeqStep([0], 0, [[] for _ in cfg.cache_groups], padding=True)
