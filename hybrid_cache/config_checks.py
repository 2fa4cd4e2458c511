"""Field checks of the static configurations: a bad value raises `ValueError` naming the field.

Shared by `config.CacheConfig` and `group_spec.GroupSpec` (the message names the field, the
value and the allowed range, so the scenario format's errors point at the offending key).
"""

from __future__ import annotations

from typing import Any


def _check_int(field: str, value: Any, *, minimum: int, maximum: int | None = None) -> int:
  """Returns `value` as int, or raises ValueError naming `field` and the range."""
  if isinstance(value, bool) or not isinstance(value, int):
    raise ValueError(f"{field} must be an integer >= {minimum}, got {value!r}")
  if value < minimum or (maximum is not None and value > maximum):
    rng = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
    raise ValueError(f"{field} must be {rng}, got {value}")
  return value


def _json_bool(field: str, value: Any) -> bool:
  if not isinstance(value, bool):
    raise ValueError(f"{field} must be true or false, got {value!r}")
  return value
