"""Chained prefix hashes per hash block, as two uint32 lanes (host side, NumPy).

`h_i = H(h_{i-1}, tokens[i*HBS:(i+1)*HBS], extra_keys_i)` over full hash blocks only,
with H = blake2b-64 over a canonical byte encoding. Extra keys (SPEC A2, vLLM §1.4), in
this order: the LoRA name (every block), for each multimodal item overlapping the block
`(identifier, item_offset - block_start)`, and `cache_salt` on the block starting at token 0
only. A group whose block size is k*HBS uses the fine hash at its block's end
(`group_view`). Hashes are computed at the edge (request intake, appended tokens) and
enter jitted code as `uint32[n, 2]`.

Example::

  h = block_hashes([0, 1, 2, 3, 4, 5, 6, 7, 8], hash_block_size=4)
  h.shape  # (2, 2): two full blocks, (lo, hi) lanes each

The simulator hashes token prefixes two other ways, on purpose; no value of one scheme is ever
compared with a value of another, and each is fixed across runs (seeded), so dumps stay
reproducible. Only `mix64` (splitmix64's finaliser) is shared.

- `sim.core_scan._prefix_hashes` gives the jitted core the keys of whole traces at once: a
  position-weighted sum over each prefix (mod 2^64, then `mix64`), so a Mooncake symbol (a run
  of consecutive token ids) costs O(1) and no per-token Python runs. Its values differ from
  `block_hashes` but identify the same prefixes (collision probability ~2^-64 per pair), which
  is all the core compares; traces carry no extra keys, so blake2b's encoding buys nothing there.
- `sim.seen_trie.unit_hashes` names a unit of the checkpoint policies' trie (`SeenTrie`): a hash
  of its U tokens only (a random linear form, then `mix64`), not of the prefix: the trie keys a
  node by (parent node, unit hash), so the chaining is the trie's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Sequence

import numpy as np

_ROOT = b"hybrid-cache/none-hash/v1"


@dataclasses.dataclass(frozen=True)
class MultiModalItem:
  """A multimodal placeholder span: `length` tokens starting at `offset`."""

  identifier: str
  offset: int
  length: int


@dataclasses.dataclass(frozen=True)
class RequestExtras:
  """Extra hash keys of a request (all optional)."""

  lora_name: str | None = None
  mm_items: tuple[MultiModalItem, ...] = ()
  cache_salt: str | None = None


NO_EXTRAS = RequestExtras()


def _extra_bytes(extras: RequestExtras, start: int, end: int) -> bytes:
  parts = []
  if extras.lora_name is not None:
    parts.append(b"L" + extras.lora_name.encode())
  for item in extras.mm_items:
    if item.offset < end and item.offset + item.length > start:
      parts.append(b"M" + item.identifier.encode() + struct.pack("<q", item.offset - start))
  if extras.cache_salt is not None and start == 0:
    parts.append(b"S" + extras.cache_salt.encode())
  return b"\x00".join(parts)


def validate_tokens(tokens: Sequence[int], field: str = "tokens") -> np.ndarray:
  """Returns tokens as int64 array; ValueError for non-integers or negatives."""
  arr = np.asarray(tokens)
  if arr.ndim != 1:
    raise ValueError(f"{field} must be a 1-D sequence of integers >= 0, got shape {arr.shape}")
  if arr.size and not np.issubdtype(arr.dtype, np.integer):
    bad = next(
      (t for t in tokens if isinstance(t, bool) or not isinstance(t, int | np.integer)), None
    )
    raise ValueError(f"{field} must contain integers >= 0, got {bad!r}")
  if arr.size and arr.min() < 0:
    raise ValueError(f"{field} must contain integers >= 0, got {int(arr.min())}")
  if arr.size and arr.max() >= 2**31:
    raise ValueError(f"{field} must contain integers < 2**31, got {int(arr.max())}")
  return arr.astype(np.int64)


def extend_block_hashes(
  prev: np.ndarray | None,
  tokens: Sequence[int],
  hash_block_size: int,
  extras: RequestExtras = NO_EXTRAS,
) -> np.ndarray:
  """Extends the chain `prev` (uint32[k, 2]) to cover every full block of `tokens`.

  `tokens` is the request's whole token list; blocks already in `prev` are kept.
  Returns uint32[len(tokens) // hash_block_size, 2] (lanes: low, high 32 bits).
  """
  n = len(tokens) // hash_block_size
  k = 0 if prev is None else len(prev)
  out = np.zeros((n, 2), np.uint32)
  if k:
    out[: min(k, n)] = prev[: min(k, n)]
  if n <= k:
    return out
  toks = np.asarray(tokens, dtype=np.int64)
  parent = _ROOT if k == 0 else struct.pack("<II", int(out[k - 1, 0]), int(out[k - 1, 1]))
  for i in range(k, n):
    start, end = i * hash_block_size, (i + 1) * hash_block_size
    h = hashlib.blake2b(digest_size=8)
    h.update(parent)
    h.update(toks[start:end].astype("<i8").tobytes())
    h.update(b"|")
    h.update(_extra_bytes(extras, start, end))
    digest = h.digest()
    out[i, 0], out[i, 1] = struct.unpack("<II", digest)
    parent = digest
  return out


def block_hashes(
  tokens: Sequence[int], hash_block_size: int, extras: RequestExtras = NO_EXTRAS
) -> np.ndarray:
  """uint32[len(tokens)//hash_block_size, 2]: the chained hash of every full hash block."""
  return extend_block_hashes(None, tokens, hash_block_size, extras)


def group_view(fine: np.ndarray, group_block_size: int, hash_block_size: int) -> np.ndarray:
  """Hashes of a group's blocks: the fine hash at each group block's end."""
  k = group_block_size // hash_block_size
  n = len(fine) // k
  return fine[k - 1 : n * k : k] if n else fine[:0]


def mix64(x: np.ndarray) -> np.ndarray:
  """splitmix64's finaliser on uint64 (wrapping arithmetic): the simulator's hashes' last step
  (`sim.core_scan._prefix_hashes`, `sim.seen_trie.unit_hashes`)."""
  x = x ^ (x >> np.uint64(30))
  x = x * np.uint64(0xBF58476D1CE4E5B9)
  x = x ^ (x >> np.uint64(27))
  x = x * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


def as_u64(h: np.ndarray) -> np.ndarray:
  """Packs uint32[..., 2] lanes into uint64 (host-side keys for dicts)."""
  h = np.asarray(h, np.uint64)
  return h[..., 0] | (h[..., 1] << np.uint64(32))
