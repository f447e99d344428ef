"""A diskcache ``Disk`` that stores and returns only bytes and text — never pickles.

diskcache pickles any key or value that is not bytes/str/int/float, and unpickles on read. For a
cache shared between machines and tools, unpickling is remote code execution, so this Disk
refuses to write anything but ``str`` keys and ``bytes``/``str`` values, and refuses to read a
pickled key or value (whoever planted it: an older tool, plain diskcache, an attacker).

A value file is read only when it is a regular file of at most `MAX_VALUE_FILE_BYTES`
(`ctbuild.cache.user_files.read_regular`): a FIFO in a shared cache would block every reader,
a link to ``/dev/zero`` or a ``truncate -s 1G`` blob would be read whole into memory. Such a
file is a `DamagedCacheError` naming it: the lookup is a miss and ``verify`` lists it.
"""

import contextlib
import os
import threading
from typing import Any

import diskcache
from diskcache.core import MODE_BINARY, MODE_RAW, MODE_TEXT, UNKNOWN

from .errors import DamagedCacheError, UnsafeValueError
from .user_files import FileTooLargeError, NotAFileError, read_regular

SAFE_MODES = frozenset({MODE_RAW, MODE_BINARY, MODE_TEXT})
#: The largest value file read: the default bundle member limit (``cache import
#: --max-member-size``), far above any real CUBIN; JSON entries are inline, never files.
MAX_VALUE_FILE_BYTES = 256 * 2**20


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
        if mode == MODE_RAW:
            return super().fetch(mode, filename, value, False)
        path = os.path.join(self._directory, str(filename))
        try:
            data = read_regular(path, limit=MAX_VALUE_FILE_BYTES, what="a cache value file")
            return data.decode() if mode == MODE_TEXT else data
        except (NotAFileError, FileTooLargeError) as exc:
            raise DamagedCacheError(f"{exc} (not a file the cache wrote)") from None
        except UnicodeDecodeError:
            raise DamagedCacheError(f"{path} is not UTF-8 text (not a file the cache wrote)") from None
