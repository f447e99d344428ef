"""Undoing a failed or interrupted bundle import, so that an import either lands whole or
leaves the cache as it was: what it added is removed and what it replaced is put back.

An import notes each change *before* making it (a blob it is about to add, an entry's previous
value), so a write interrupted half-way (a full disk, Ctrl-C) is undone too. The undo itself runs
with SIGINT and SIGTERM held off: a second Ctrl-C during it would leave replaced entries lost.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from .errors import CacheError

if TYPE_CHECKING:
    from .namespace import Namespace
    from .store import Store


class ImportUndo:
    """What a failed or interrupted import must undo: the blobs it added and, per entry it
    wrote, the value it replaced (None: added). Previous values are kept in memory, bounded
    (``budget`` bytes, the import's JSON size limit): an import that would replace more refuses
    to go on, and is undone like any failure."""

    def __init__(self, store: Store, budget: int) -> None:
        self.store = store
        self.budget = budget
        self.blobs: list[str] = []
        self.entries: list[tuple[Namespace, str, tuple[str, str | None] | None]] = []
        self.first_error = ""

    def note(self, namespace: Namespace, key: str, previous: tuple[str, str | None] | None) -> None:
        """Remember ``key``'s value (text, tag) before it is written; noted before the write, so
        an interruption mid-write is undone too."""
        if previous is not None:
            self.budget -= len(previous[0])
            if self.budget < 0:
                raise CacheError("the bundle replaces more existing entries than an import keeps for undoing "
                                 "(--max-json-size)")
        self.entries.append((namespace, key, previous))

    def run(self) -> int:
        """Put back every replaced entry, remove every added entry and blob; how many could not
        be. Ctrl-C is held off meanwhile: a half-undone import would lose the entries it replaced."""
        failed = 0
        with _signals_held():
            for namespace, key, previous in reversed(self.entries):
                try:
                    if previous is None:
                        namespace.delete(key)
                    else:
                        namespace.set(key, previous[0], tag=previous[1])
                except (CacheError, OSError) as exc:
                    failed += self._failed(exc)
            for digest in self.blobs:
                try:
                    self.store.delete_blob(digest)
                except (CacheError, OSError) as exc:
                    failed += self._failed(exc)
        return failed

    def outcome(self) -> str:
        """Run the undo and say, for the import's error, what state it left the cache in."""
        failed = self.run()
        if not failed:
            return ("the cache was restored to what it held before (replaced entries put back, added ones "
                    "removed); nothing was imported")
        return (f"{failed} of its changes could not be undone ({self.first_error}): run "
                f"`ctbuild cache verify --cache {self.store.path}` and re-import")

    def _failed(self, exc: Exception) -> int:
        self.first_error = self.first_error or str(exc)
        return 1


@contextmanager
def _signals_held() -> Iterator[None]:
    """Run the block with SIGINT and SIGTERM blocked (main thread only). One arriving meanwhile
    is dropped: the block is an import's undo, which ends in the import's error anyway."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        while signal.sigtimedwait(held, 0) is not None:
            pass
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
