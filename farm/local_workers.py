"""Worker processes on the driver's own machine that compile while an embedded Ray starts.

An embedded Ray takes 3-7 s to come up on a big host (its GCS, raylet, agents and the driver's
connect), and no Ray worker can exist before that. The driver's cores sit idle meanwhile, so
the farm starts a few plain processes right after planning: each runs the very `FarmWorker` a
Ray actor runs (same environment cleaning, temp directory, setup hook and compile function),
driven over a socket instead of Ray's object store, behind the same worker interface
(`ctbuild.farm.worker_handle`). They take jobs from the same longest-first
queue and send the same records back; the driver checks and stores them like any other. Each
Ray worker that warms up retires one of them (it finishes what it holds, then exits), so the
build ends on Ray alone and never runs more compiles at once than it has worker slots for long.
With ``local_only`` (no Ray installed, or a build too small to wait for Ray) they are the farm.

The child is started as ``python -m ctbuild.farm.local_workers FD`` (not with `multiprocessing`, which
would re-import the caller's ``__main__``). It dies with the driver: it exits when the socket
closes, and the farm's reaper kills it (and the compiler it runs) when the driver is SIGKILLed.
Records travel pickled over a private socket pair between the driver and its own child; nothing
is ever unpickled from disk.
"""
from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as connection_wait
from pathlib import Path
from typing import Any, Sequence

from .reaper import freeze_tree, kill_frozen
from .worker import FarmWorker, error_text
from .worker_handle import BATCH_END, DIED, RECORD, SETUP_FAILED, WARM, Event, WorkerHandle

# Messages a local worker sends: (WARM, info) | (SETUP_FAILED, error) | (RECORD, record) |
# (BATCH_END, None) after each batch: the `Event`s of the worker interface. The driver sends
# (jobs, timeout) per batch, None to stop.


class LocalWorker(WorkerHandle):
    """The driver's handle on one local worker process."""

    local = True

    def __init__(self, name: str, spec: dict[str, Any]) -> None:
        super().__init__(name)
        ours, theirs = socket.socketpair()
        # Where the `ctbuild` package lives (this file is ctbuild/farm/local_workers.py there;
        # not resolved: in a source tree ctbuild/farm is a link to ../farm).
        root = str(Path(__file__).parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ctbuild.farm.local_workers", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # errors come back in records
        theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.send((name, spec))
        self._open_batches = 0  # sent and not yet ended
        self._stopping = False

    def waitable(self) -> Any | None:
        owes = not self.warm or self._open_batches > 0
        return self.conn if owes and not self.gone else None

    def send(self, jobs: list[dict[str, Any]], timeout: float | None) -> None:
        self._open_batches += 1
        try:
            self.conn.send((jobs, timeout))
        except OSError:  # it died: its next event says so
            pass

    def receive(self) -> Event:
        try:
            kind, payload = self.conn.recv()
        except (EOFError, OSError):
            what = "the local worker process exited" if self.warm else \
                f"local worker {self.name} exited while setting up"
            return Event(DIED, f"{what} (code {self.proc.poll()})")
        if kind == WARM:
            self.info = payload
        elif kind == BATCH_END:
            self._open_batches -= 1
        return Event(kind, payload)

    def leave(self) -> None:
        """Ask it to clean up and exit once it has sent what it holds (no waiting here)."""
        if not self._stopping:
            self._stopping = True
            try:
                self.conn.send(None)
            except OSError:  # gone already
                pass

    def kill(self) -> bool:
        """Kill it now (a dead, hung or no longer needed worker) with the compiler it runs; its
        temp directory is swept by the next worker that warms up or closes here
        (`ctbuild.farm.worker.sweep_orphans`)."""
        if self.gone:
            return False
        self.gone = True
        alive = self.proc.poll() is None
        if alive:
            kill_frozen(freeze_tree(self.proc.pid))
        self.proc.kill()
        self.proc.wait()
        self.conn.close()
        return alive

    def _wait_exit(self, seconds: float) -> None:
        """Wait up to ``seconds`` for it to exit after `leave`; kill it if it has not."""
        try:
            self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.kill()
            return
        self.gone = True
        self.conn.close()

    @classmethod
    def wait_ready(cls, workers: Sequence[WorkerHandle], timeout: float) -> list[WorkerHandle]:
        by_conn: dict[Any, WorkerHandle] = {w.waitable(): w for w in workers}
        return [by_conn[conn] for conn in connection_wait(list(by_conn), timeout=timeout)]

    @classmethod
    def stop_all(cls, workers: Sequence[WorkerHandle], seconds: float, abort: bool) -> None:
        """Ask each to clean up and exit, then reap it, killing the ones still there after
        ``seconds``. Killed at once: one still warming up, and with ``abort`` one that was not
        leaving already (it may be on a job)."""
        live = [w for w in workers if isinstance(w, LocalWorker) and not w.gone]
        for worker in live:
            if not worker.warm or (abort and not worker._stopping):
                worker.kill()
            else:
                worker.leave()
        deadline = time.monotonic() + seconds
        for worker in live:
            if not worker.gone:
                worker._wait_exit(max(0.0, deadline - time.monotonic()))


def serve(fd: int) -> None:
    """The child's loop: warm up, then compile each batch sent, one record per job."""
    conn = Connection(fd)
    slot, spec = conn.recv()
    worker = FarmWorker(slot, spec)
    try:
        try:
            info = worker.warm()
        except BaseException as exc:  # noqa: BLE001 - reported to the driver, which stops
            conn.send((SETUP_FAILED, error_text(exc)))
            return
        conn.send((WARM, info))
        while (msg := conn.recv()) is not None:
            jobs, timeout = msg
            for rec in worker.run_batch(jobs, timeout):
                conn.send((RECORD, rec))
            conn.send((BATCH_END, None))
    except (EOFError, OSError, pickle.PickleError):  # the driver is gone
        pass
    finally:
        worker.close()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
