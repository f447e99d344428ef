"""Single-flight per job key across concurrent builds into one cache: byte-range lock claims.

Every driver writing into a cache directory opens one lock file there and, before handing a job
to a worker, takes an exclusive POSIX record lock on the one byte at an offset derived from the
job's key. A second build that finds the byte locked leaves that job to the first one and
re-checks the cache later. The kernel drops a process's locks when it exits, killed or not, so a
claim's lease is exactly the life of the build that holds it: nothing to expire, nothing stale.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os

LOCK_FILE = "farm-claims.lock"


def _offset(key: str) -> int:
    """A stable 62-bit offset per key (collisions only make two keys share a claim)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") >> 2


class Claims:
    """The claims this process holds on the cache at ``cache_dir``."""

    def __init__(self, cache_dir: str) -> None:
        self._fd = os.open(os.path.join(cache_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        self.held: set[str] = set()

    def claim(self, key: str) -> bool:
        """Take ``key``'s claim; False when another process holds it."""
        if key in self.held:
            return True
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _offset(key))
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        self.held.add(key)
        return True

    def release(self, key: str) -> None:
        if key in self.held:
            self.held.discard(key)
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, _offset(key))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # drops every claim at once
            self._fd = -1
            self.held.clear()
