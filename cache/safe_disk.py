"""A diskcache ``Disk`` that stores and returns only bytes and text — never pickles.

diskcache pickles any key or value that is not bytes/str/int/float, and unpickles on read. For a
cache shared between machines and tools, unpickling is remote code execution, so this Disk
refuses to write anything but ``str`` keys and ``bytes``/``str`` values, and refuses to read a
pickled key or value (whoever planted it: an older tool, plain diskcache, an attacker).
"""

from typing import Any

import diskcache
from diskcache.core import MODE_BINARY, MODE_RAW, MODE_TEXT, UNKNOWN

from .errors import UnsafeValueError

SAFE_MODES = frozenset({MODE_RAW, MODE_BINARY, MODE_TEXT})


class SafeDisk(diskcache.Disk):
    """Serialisation for the cache's diskcache instances: str keys; bytes or str values only."""

    def put(self, key: Any) -> tuple[str, bool]:
        if type(key) is not str:
            raise TypeError(f"cache keys must be str, not {type(key).__name__}")
        return key, True

    def get(self, key: Any, raw: bool) -> str:
        if not raw or type(key) is not str:
            raise UnsafeValueError("refusing a pickled or non-text key")
        return key

    def store(self, value: Any, read: bool, key: Any = UNKNOWN) -> tuple:
        if read or type(value) not in (bytes, str):
            raise TypeError(f"cache values must be bytes or str, not {type(value).__name__}")
        return super().store(value, False, key=key)

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if mode not in SAFE_MODES:
            raise UnsafeValueError(f"refusing a stored value in diskcache mode {mode} (pickle or unknown)")
        return super().fetch(mode, filename, value, False)
