"""Canonical JSON text: the only structured value format the cache stores.

One spelling per value (sorted keys, no spaces, no NaN) makes stored entries comparable byte for
byte, so an import can tell "identical" from "different" and bundles round-trip exactly.
"""

import json
from typing import Any


def dumps(value: Any, *, what: str) -> str:
    """Serialise ``value`` canonically; ``what`` names it in the error if it is not JSON-able."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be JSON-serialisable (str/int/float/bool/None/list/dict): {exc}") from None


def loads_object(text: str) -> dict[str, Any]:
    """Parse JSON text that must hold an object; raises ValueError otherwise."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return value
