"""What a stored JSON entry must look like to be used (shared by reads, verify and bundle import)."""

from typing import Any, Sequence

from .digest import is_digest
from .jsontext import loads_object

COMPILE_REQUIRED = ("digest", "symbol")
TUNING_REQUIRED = ("kernel", "arch", "compile_key")


def entry_problem(value: bytes | str, required: Sequence[str]) -> str | None:
    """Why a stored JSON value is unusable (None if it is fine): not text, not an object, fields missing."""
    if type(value) is not str:
        return "value is bytes, not JSON text"
    try:
        entry = loads_object(value)
    except ValueError as exc:
        return f"value is not a JSON object ({exc})"
    return fields_problem(entry, required)


def fields_problem(entry: dict[str, Any], required: Sequence[str]) -> str | None:
    """Why a parsed entry is unusable (None if it is fine): required fields missing or not str."""
    missing = [f for f in required if not isinstance(entry.get(f), str) or not entry[f]]
    if missing:
        return f"fields {missing} missing or not str"
    if "digest" in required and not is_digest(entry["digest"]):
        return f"digest {entry['digest']!r} is malformed"
    return None
