"""State invariants of the jitted core, checked on the host (NumPy) after any operation.

`check_invariants(config, state)` returns a list of violations (empty when clean):
free + used = total; ref counts >= 0; every non-null block is in exactly one of
{held, free, pinned-free}; a held block's ref count equals the number of table entries naming
it, and all those entries are in one group; table entries past a row's length are null; every
index entry points at a block carrying that key (lanes, group and bucket); every keyed block is
indexed exactly once (unless the index overflowed; a block of a prompt-tail group,
`Layout.tail_groups`, may also carry one extra, partial key, and with fine keys a block of
`Layout.fine_key_groups` one per hash-block boundary inside it); the null block is never free,
keyed or indexed; queue keys are unique (with a re-keying eviction policy, `Layout.rekeys`,
so are the queued blocks' recencies, `CacheState.free_recency`); pinned-tier blocks carry the
pinned flag; the padding blocks past the real pool (`fresh_state.init_state`) are never free,
held, keyed or in a table; with two pools (`Layout.state_pool`) each group's table names only
blocks of its own pool (and with a shared byte budget the held and cached blocks fit it); and
the runtime parameters (`CacheState.params`) are the config's.
"""

from __future__ import annotations

import jax
import numpy as np

from hybrid_cache.config import CacheConfig
from hybrid_cache.core import block_index
from hybrid_cache.core import byte_budget
from hybrid_cache.core.layout import layout
from hybrid_cache.core.params import runtime_params
from hybrid_cache.core.state import BIG
from hybrid_cache.core.state import STATUS_EMPTY
from hybrid_cache.core.state import BlockAux
from hybrid_cache.core.state import CacheState
from hybrid_cache.core.state import QueueKeys
from hybrid_cache.core.state import QueueOrder


def check_invariants(config: CacheConfig, state: CacheState) -> list[str]:
  """Violations of the state invariants (see module docstring); [] when clean."""
  lay = layout(config)
  s = jax.device_get(state)
  errs: list[str] = []
  params = np.asarray(s.params)
  if not np.array_equal(params, runtime_params(config)):
    errs.append(f"runtime params {params.tolist()} differ from the config's")
  nb = int(s.num_real_blocks)  # the real pool; [nb, lay.num_blocks) is padding
  ref = np.asarray(s.ref_cnt)
  qk = np.asarray(s.queue_key)
  pad_ref, pad_qk = ref[nb:], qk[:, nb:]
  pad_keyed = np.asarray(s.block_group)[nb:] >= 0
  if (pad_ref != 0).any() or (pad_qk < BIG).any() or pad_keyed.any():
    errs.append("a padding block past the real pool is held, free or keyed")
  ref, qk = ref[:nb], qk[:, :nb]
  queues = QueueKeys(qk)
  in_free = queues.free < BIG
  in_pin = queues.pinned < BIG
  held = ref > 0
  if (ref < 0).any():
    errs.append(f"negative ref counts at blocks {np.nonzero(ref < 0)[0].tolist()}")
  if in_free[0] or in_pin[0] or s.block_group[0] >= 0:
    errs.append("null block 0 is free or keyed")
  membership = held.astype(int) + in_free + in_pin
  bad = np.nonzero(membership[1:] != 1)[0] + 1
  if bad.size:
    errs.append(f"blocks not in exactly one of held/free/pinned-free: {bad.tolist()[:10]}")
  num_free = int(in_free[1:].sum() + in_pin[1:].sum())
  num_used = int(held[1:].sum())
  if num_free + num_used != nb - 1:
    errs.append(f"free {num_free} + used {num_used} != total {nb - 1}")
  for row_name, keys in (("free", queues.free[in_free]), ("pinned", queues.pinned[in_pin])):
    if len(np.unique(keys)) != len(keys):
      errs.append(f"duplicate {row_name}-queue keys")
  if lay.rekeys:  # a re-keying policy's recency row (`eviction`: lazy order)
    rec = QueueOrder(np.asarray(s.queue_order)[:, :nb]).recency[in_free]
    if (rec >= BIG).any():
      errs.append("a block in the free queue has no recency")
    elif len(np.unique(rec)) != len(rec):
      errs.append("duplicate free-queue recencies")
  aux = np.asarray(s.block_aux)[:nb]
  if (BlockAux(aux)[in_pin].pinned == 0).any():
    errs.append("a pinned-tier block lacks the pinned flag")
  # tables
  tables = np.asarray(s.tables)
  if lay.state_pool:  # each group's blocks come from its pool (pages, state slots)
    first_slot = int(s.first_slot)
    for g, p in enumerate(lay.group_pool):
      ids = tables[:, g][tables[:, g] > 0]
      if ((ids >= first_slot) != bool(p)).any():
        errs.append(f"group {g} holds blocks outside its pool ({'slots' if p else 'pages'})")
  if lay.byte_budget:  # the held and cached blocks fit the shared byte budget
    occupied = int(byte_budget.occupied_bytes(s))
    if occupied > int(s.byte_budget):
      errs.append(f"held and cached blocks occupy {occupied} > byte_budget {int(s.byte_budget)}")
  status = np.asarray(s.req_status)
  lens = np.asarray(s.group_len)
  count = np.zeros(lay.num_blocks, np.int64)
  owner = np.full(lay.num_blocks, -1)
  pos = np.arange(lay.max_blocks)
  for r in range(lay.max_requests):
    if status[r] == STATUS_EMPTY and tables[r].any():
      errs.append(f"empty slot {r} has a non-null table")
    for g in range(lay.num_groups):
      row = tables[r, g]
      if row[pos >= lens[r, g]].any():
        errs.append(f"slot {r} group {g}: non-null entries past the row length")
      ids = row[row > 0]
      np.add.at(count, ids, 1)
      clash = (owner[ids] >= 0) & (owner[ids] != g)
      if clash.any():
        errs.append(f"blocks {ids[clash].tolist()} held by two groups")
      owner[ids] = g
  if count[nb:].any():
    errs.append(f"tables name padding blocks {np.nonzero(count[nb:])[0] + nb}")
  count = count[:nb]
  mism = np.nonzero(count[1:] != ref[1:])[0] + 1
  if mism.size:
    errs.append(f"ref counts differ from table references at blocks {mism.tolist()[:10]}")
  grp = np.asarray(s.block_group)
  wrong_group = (owner >= 0) & (grp >= 0) & (owner != grp)
  if wrong_group.any():
    errs.append(f"blocks keyed for one group but held by another: {np.nonzero(wrong_group)[0]}")
  # index
  ih = np.asarray(s.index_hash)
  bh = np.asarray(s.block_hash)
  blk = np.asarray(s.index_block)
  used = blk >= 0
  b_ids = blk[used]
  if (b_ids == 0).any():
    errs.append("null block is indexed")
  if (grp[b_ids] < 0).any():
    errs.append("index entry points at a block without a key")
  own = np.all(ih[used] == bh[b_ids], axis=-1)
  if lay.extra_keys:
    # vLLM §2.5: a block of a prompt-tail group may also carry one extra (partial) key
    extra_ok = np.isin(grp[b_ids], np.asarray(lay.tail_groups, np.int32))
    if (~own & ~extra_ok).any():
      errs.append("index entry lanes differ from the block's key")
    # beyond vLLM (`CacheConfig.fine_keys`): a fine-key group's block carries one extra key
    # per hash-block boundary inside it
    most = np.ones(lay.num_groups + 1, np.int64)
    for g in lay.fine_key_groups:
      most[g] = lay.groups[g].block_size // lay.hash_block_size - 1
    if (np.bincount(b_ids[~own], minlength=lay.num_blocks) > most[grp]).any():
      errs.append("a block carries more extra keys than its group allows")
  elif (~own).any():
    errs.append("index entry lanes differ from the block's key")
  buckets = np.asarray(block_index.bucket_of(ih[used], np.maximum(grp[b_ids], 0), lay.buckets))
  where_b = np.nonzero(used)[0]
  if (buckets != where_b).any():
    errs.append("index entry in the wrong bucket")
  per_block = np.bincount(b_ids[own], minlength=lay.num_blocks)
  if (per_block > 1).any():
    errs.append("a block is indexed twice")
  keyed = np.nonzero(grp >= 0)[0]
  missing = keyed[per_block[keyed] == 0]
  if missing.size and int(s.index_overflows) == 0:
    errs.append(f"keyed blocks missing from the index: {missing.tolist()[:10]}")
  return errs


def assert_invariants(config: CacheConfig, state: CacheState) -> None:
  """Raises AssertionError listing every violated invariant."""
  errs = check_invariants(config, state)
  if errs:
    raise AssertionError("cache state invariants violated:\n  " + "\n  ".join(errs))
