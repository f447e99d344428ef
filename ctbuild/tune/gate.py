"""Where a tune's measuring processes wait for their supervisor: at the start, while the TileIR
identity check runs; with several GPUs, again after their keys, for the fleet's finals.

A measuring process spends seconds before its first measurement (Python, torch and cuTile
imports, the project, the CUDA context); the identity check (`ctbuild.commands.tune.
check_identity`) spends seconds in the supervising process, and removes the cached entries it
finds stale. Run one after the other they add up; at the same time, a process must not measure
a CUBIN the check is about to remove. So the processes start at once and wait at the gate, a
file the supervisor writes once the check is done: ``go``, or ``stop`` when it raised.

The finals (`ctbuild.tune.fleet`) wait the same way: a lane that has tuned its keys keeps its
process (its CUDA context, its loaded CUBINs) until the supervisor posts the keys every GPU
re-measures, rather than a second process per GPU paying the start-up again.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable

from ..atomic_write import write_text

#: How often a waiting process looks at the gate, in seconds.
POLL_S = 0.02


class Gate:
    """A file in a directory of the supervisor's own: absent (closed), or the text posted."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def post(self, text: str) -> None:
        """Write ``text`` in one rename (`ctbuild.atomic_write`), so a waiting process never
        reads half of it."""
        write_text(self.path, text)

    def open(self, go: bool) -> None:
        self.post("go" if go else "stop")

    def after(self, check: Callable[[], None]) -> Gate:
        """Run ``check`` in a thread of this process, then open the gate: ``go`` when it
        returned, ``stop`` when it raised (`finish` raises it again)."""
        def run() -> None:
            try:
                check()
            except BaseException as exc:  # noqa: BLE001 - re-raised by finish()
                self.error = exc
            self.open(self.error is None)
        self._thread = threading.Thread(target=run, name="ctbuild-identity-check", daemon=True)
        self._thread.start()
        return self

    def finish(self) -> None:
        """Wait for the check; raise what it raised."""
        if self._thread is not None:
            self._thread.join()
        if self.error is not None:
            raise self.error

    def stopped(self) -> bool:
        """Whether the gate says stop (the processes measure nothing)."""
        try:
            return self.path.read_text() != "go"
        except FileNotFoundError:
            return False

    def wait(self, supervisor: int) -> bool:
        """In a measuring process: wait until the gate opens; whether it says go."""
        return self.read(supervisor) == "go"

    def read(self, supervisor: int) -> str | None:
        """In a measuring process started by the process ``supervisor`` (its pid, passed
        down: a parent read here could already be the one a dead supervisor's child is
        re-parented to): wait until something is posted, and return it; None once the
        supervisor is no longer this process's parent (it died)."""
        while True:
            try:
                return self.path.read_text()
            except FileNotFoundError:
                if os.getppid() != supervisor:
                    return None
                time.sleep(POLL_S)
