"""Ray for one farm: started (embedded) or joined, in the caller's thread or in the background.

A background start overlaps Ray's 3-7 s start-up with the caller's own work (planning, probing
the toolchain). Its thread stays alive until `RayStart.stop`: Ray binds the processes it starts
to the life of the starting thread (parent-death signal), so it may only end after Ray is
stopped.
"""
from __future__ import annotations

import threading
import time

from .cluster import connect, disconnect
from .options import FarmOptions
from .records import FarmError


class RayStart:
    """Starting, joining and leaving Ray for the cluster at ``address`` (None: embedded)."""

    def __init__(self, address: str | None, options: FarmOptions) -> None:
        self.address, self.options = address, options
        self.started = False     # connected: Ray is up (ours) or joined
        self.owned = False       # we started it (and stop it)
        self.reaper: int | None = None  # the watchdog's pipe for an embedded Ray
        self.cpus = 0            # CPUs of the cluster
        self.up_at = 0.0         # time.monotonic() when it was up
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._release = threading.Event()   # lets the starting thread end (after Ray stopped)
        self._error: BaseException | None = None

    @property
    def requested(self) -> bool:
        """Whether Ray is started, starting or joined."""
        return self._thread is not None or self.started

    @property
    def starting(self) -> bool:
        """Whether a background start is still under way."""
        return self._thread is not None and not self._done.is_set()

    def in_background(self, slots: int) -> None:
        """Start or join Ray in a thread, sized for ``slots`` workers (see `connect`)."""
        if self.requested:
            return
        self._done, self._release = threading.Event(), threading.Event()

        def target() -> None:
            try:
                self.connect(slots)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                self._error = exc
            finally:
                self._done.set()
            self._release.wait()

        self._thread = threading.Thread(target=target, name="farm-start", daemon=True)
        self._thread.start()

    def join(self) -> None:
        """Wait until a background start is done; re-raise its error here."""
        if self._thread is not None:
            self._done.wait()
        if self._error is not None:
            exc, self._error = self._error, None
            raise exc

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a background start to finish."""
        self._done.wait(timeout)

    def connect(self, slots: int) -> None:
        """Start an embedded Ray with ``slots`` CPUs, or join the cluster."""
        conn = connect(self.address, slots, self.options.ship, self.options.env)
        self.owned, self.reaper = conn["owned"], conn["reaper"]
        self.up_at = time.monotonic()
        self.started = True
        self.cpus = conn["cpus"]
        if self.cpus < 1:
            raise FarmError(f"the Ray cluster at {self.address} has no CPUs for workers")

    def stop(self) -> None:
        """Leave Ray, or stop it when we started it; end the starting thread."""
        if self.started:
            disconnect(self.owned, self.reaper)
        self.reaper = None
        self.started = False
        self._release.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
