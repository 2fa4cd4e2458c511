"""`StepInputs`: everything the model needs for one step of packed sequences.

The engine builds one `StepInputs` per step from the cache core's block tables. The model
never sees hashes or policies: attention layers read/write KV through block tables and slot
mappings, recurrent layers read an initial state from one pool block and write their final
state (and optional per-block checkpoints) to others.

Shapes (T packed tokens, N sequences, G cache groups, MB_g blocks per row of group g):

* token_ids       int32[T]
* positions       int32[T]       absolute position of each token in its sequence
* query_start_loc int32[N+1]     sequence n owns tokens [qsl[n], qsl[n+1]); qsl[N] == T
* seq_lens        int32[N]       tokens of sequence n after this step (computed + new)
* block_tables    tuple over groups of int32[N, MB_g]; entry j = block holding positions
                  [j*B, (j+1)*B); 0 (the null block) where not held (e.g. out-of-window SWA
                  blocks). The recurrent group's table is not read by the model.
* slot_mapping    tuple over groups of int32[T]: block * B + offset where the token's K/V is
                  written; -1 = do not write. Ignored for the recurrent group.
* state_read      int32[R, N]  per recurrent group r (R = `cfg.num_recurrent_rows`, rows in
                  `cfg.recurrent_groups` order): pool block holding the recurrent (+conv)
                  state of that group's layers after the sequence's first `seq_len - q_len`
                  tokens; -1 = no initial state (zeros), used when nothing is computed yet.
* state_write     int32[R, N]  pool block receiving the state after all of this step's
                  tokens; -1 = discard.
* ckpt_write      int32[R, N, M]  pool block receiving the state after the first
                  (j+1) * ckpt_every tokens of this step's tokens of sequence n ("all" mode
                  checkpoints); -1 = none. M may be 0.
* ckpt_every      static int (a multiple of the kernels' chunk, 64) or None; required when
                  M > 0.
* decode          static bool: every sequence (padding included) has exactly one token
                  (T == N, query_start_loc == 0..N). Recurrent layers then run the decode
                  kernels (one recurrence step per sequence) instead of the chunked ones.
* num_decodes     static int D (0 <= D < N; 0 with `decode`): a mixed step whose first D
                  sequences own one token each (query_start_loc[:D+1] == 0..D). Recurrent
                  layers run those through the decode kernels and the rest through the
                  chunked ones (`models.decode_split`); D > 0 must leave >= 1 sequence after.

Reading and writing different blocks replaces vLLM's pre-forward state copy (§5.2): the
engine passes the previous state block as `state_read` and the new one as `state_write`.
Reading and writing the same block is allowed (continuing inside one block).
"""

from __future__ import annotations

import flax.struct
import jax


@flax.struct.dataclass
class StepInputs:
  """One step's packed inputs (see module docstring for shapes and semantics)."""

  token_ids: jax.Array
  positions: jax.Array
  query_start_loc: jax.Array
  seq_lens: jax.Array
  block_tables: tuple[jax.Array, ...]
  slot_mapping: tuple[jax.Array, ...]
  state_read: jax.Array
  state_write: jax.Array
  ckpt_write: jax.Array
  ckpt_every: int | None = flax.struct.field(pytree_node=False, default=None)
  decode: bool = flax.struct.field(pytree_node=False, default=False)
  num_decodes: int = flax.struct.field(pytree_node=False, default=0)

  @property
  def num_tokens(self) -> int:
    return self.token_ids.shape[0]

  @property
  def num_seqs(self) -> int:
    return self.seq_lens.shape[0]
