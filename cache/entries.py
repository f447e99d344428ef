"""What a stored JSON entry must look like to be used (shared by reads, verify and bundle import).

An entry from a bundle or a shared cache is input from elsewhere, read later by `cache ls`,
`export --arch`, `prune` and the runtime, which index it by field. So every field they read is
checked here, once, for its type and a bounded length: an import refuses an entry that fails,
and a reader skips it (logged, listed by `verify`) instead of failing on it later.
"""

from typing import Any, Callable, Sequence

from .digest import is_digest
from .jsontext import loads_object

COMPILE_REQUIRED = ("digest", "symbol")
TUNING_REQUIRED = ("kernel", "arch", "compile_key")
#: Longest text field (names, fingerprints, keys, symbols; a mangled symbol is a few hundred).
MAX_TEXT = 4096


def _text(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= MAX_TEXT


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _object(value: Any) -> bool:
    return isinstance(value, dict)


def _array(value: Any) -> bool:
    return isinstance(value, list)


_Check = Callable[[Any], bool]
_WHAT: dict[_Check, str] = {_text: f"text of at most {MAX_TEXT} characters", _count: "a whole number >= 0",
                            _number: "a number", _object: "a JSON object", _array: "a JSON array"}

#: The fields readers use, by kind of entry; a field may also be null (unset), except the
#: required ones. Fields not listed (a newer writer's) are not checked, nor are a compile
#: entry's ``created`` and ``compile_seconds``: their readers take an odd one as unknown.
COMPILE_FIELDS: dict[str, _Check] = {
    **dict.fromkeys(("digest", "symbol", "kernel", "module", "kernel_fp", "arch", "toolchain", "tileir",
                     "class", "source"), _text),
    "size": _count, "format": _count, "tileir_format": _count,
    "config": _object,
}
TUNING_FIELDS: dict[str, _Check] = {
    **dict.fromkeys(("kernel", "arch", "compile_key", "module", "kernel_fp", "gpu", "toolchain", "driver",
                     "source", "tuned_at"), _text),
    **dict.fromkeys(("format", "compiled_during_tune", "compiles_during_measurement"), _count),
    **dict.fromkeys(("created", "mean_us", "ci_us", "measure_seconds", "seconds"), _number),
    **dict.fromkeys(("config", "default", "space", "phase_seconds", "choice", "runoff", "regret",
                     "refined", "by_class", "check", "fleet"), _object),
    "candidates": _array, "failures": _array,
}
#: Which fields to check, told by the required fields a caller names (stores and import name
#: `COMPILE_REQUIRED` or `TUNING_REQUIRED`; toolchain profiles, none).
_FIELDS = {COMPILE_REQUIRED: COMPILE_FIELDS, TUNING_REQUIRED: TUNING_FIELDS}


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
    """Why a parsed entry is unusable (None if it is fine): required fields missing or not str,
    a field readers use of the wrong type or too long."""
    missing = [f for f in required if not isinstance(entry.get(f), str) or not entry[f]]
    if missing:
        return f"fields {missing} missing or not str"
    if "digest" in required and not is_digest(entry["digest"]):
        return f"digest {entry['digest']!r} is malformed"
    for name, check in _FIELDS.get(tuple(required), {}).items():
        value = entry.get(name)
        if value is not None and not check(value):
            shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
            return f"field {name!r} is {shown}, not {_WHAT[check]}"
    return None
