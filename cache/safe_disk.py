"""A diskcache ``Disk`` that stores and returns only bytes and text — never pickles.

diskcache pickles any key or value that is not bytes/str/int/float, and unpickles on read. For a
cache shared between machines and tools, unpickling is remote code execution, so this Disk
refuses to write anything but ``str`` keys and ``bytes``/``str`` values, and refuses to read a
pickled key or value (whoever planted it: an older tool, plain diskcache, an attacker).
"""

import contextlib
import os
import threading
from typing import Any

import diskcache
from diskcache.core import MODE_BINARY, MODE_RAW, MODE_TEXT, UNKNOWN

from .errors import UnsafeValueError

SAFE_MODES = frozenset({MODE_RAW, MODE_BINARY, MODE_TEXT})


class SafeDisk(diskcache.Disk):
    """Serialisation for the cache's diskcache instances: str keys; bytes or str values only."""

    def __init__(self, directory: str, **settings: Any) -> None:
        super().__init__(directory, **settings)
        self._local = threading.local()

    def put(self, key: Any) -> tuple[str, bool]:
        if type(key) is not str:
            raise TypeError(f"cache keys must be str, not {type(key).__name__}")
        return key, True

    def get(self, key: Any, raw: bool) -> str:
        if not raw or type(key) is not str:
            raise UnsafeValueError("refusing a pickled or non-text key")
        return key

    def store(self, value: Any, read: bool, key: Any = UNKNOWN) -> tuple:
        """Store bytes, text, or (``read=True``) the bytes of a binary stream, copied in chunks.

        A write that fails part-way (a full disk) removes its value file: nothing half-written stays.
        """
        if not read and type(value) not in (bytes, str):
            raise TypeError(f"cache values must be bytes or str, not {type(value).__name__}")
        self._local.path = None
        try:
            return super().store(value, read, key=key)
        except BaseException:
            if self._local.path is not None:
                with contextlib.suppress(OSError):
                    os.unlink(self._local.path)
                    os.removedirs(os.path.dirname(self._local.path))  # the empty ab/cd/ dirs; stops at a non-empty one
            raise

    def filename(self, key: Any = UNKNOWN, value: Any = UNKNOWN) -> tuple[str, str]:
        name, full_path = super().filename(key, value)
        self._local.path = full_path  # remembered so a failed write can remove it
        return name, full_path

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if mode not in SAFE_MODES:
            raise UnsafeValueError(f"refusing a stored value in diskcache mode {mode} (pickle or unknown)")
        return super().fetch(mode, filename, value, False)
