"""Worker processes on the driver's own machine that compile while an embedded Ray starts.

An embedded Ray takes 3-7 s to come up on a big host (its GCS, raylet, agents and the driver's
connect), and no Ray worker can exist before that. The driver's cores sit idle meanwhile, so
the farm starts a few plain processes right after planning: each runs the very `FarmWorker` a
Ray actor runs (same environment cleaning, temp directory, setup hook and compile function),
driven over a socket instead of Ray's object store. They take jobs from the same longest-first
queue and send the same records back; the driver checks and stores them like any other. Each
Ray worker that warms up retires one of them (it finishes what it holds, then exits), so the
build ends on Ray alone and never runs more compiles at once than it has worker slots for long.

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
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from .reaper import freeze_tree, kill_frozen
from .worker import FarmWorker, error_text

#: Messages a local worker sends: ("warm", info) | ("failed", error) | ("rec", record) |
#: ("end", None) after each batch. The driver sends (jobs, timeout) per batch, None to stop.
WARM, FAILED_SETUP, RECORD, END = "warm", "failed", "rec", "end"


class LocalWorker:
    """The driver's handle on one local worker process."""

    def __init__(self, slot: str, spec: dict[str, Any]) -> None:
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
        self.conn.send((slot, spec))
        self._stopping = False

    def send(self, jobs: list[dict[str, Any]], timeout: float | None) -> None:
        self.conn.send((jobs, timeout))

    def recv(self) -> tuple[str, Any]:
        """The next message; raises EOFError/OSError when the process is gone."""
        return self.conn.recv()

    def send_stop(self) -> None:
        """Ask it to clean up and exit once it has sent what it holds (no waiting here)."""
        if not self._stopping:
            self._stopping = True
            self.conn.send(None)

    def stop(self, wait: float) -> None:
        """Ask it to exit and wait up to ``wait`` seconds for it; kill it if it has not."""
        try:
            self.send_stop()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            self.kill()
        self.conn.close()

    def kill(self) -> None:
        """Kill it now (a dead, hung or no longer needed worker) with the compiler it runs; its
        temp directory is swept by the next worker that warms up or closes here
        (`ctbuild.farm.worker.sweep_orphans`)."""
        if self.proc.poll() is None:
            kill_frozen(freeze_tree(self.proc.pid))
        self.proc.kill()
        self.proc.wait()
        self.conn.close()


def serve(fd: int) -> None:
    """The child's loop: warm up, then compile each batch sent, one record per job."""
    conn = Connection(fd)
    slot, spec = conn.recv()
    worker = FarmWorker(slot, spec)
    try:
        try:
            info = worker.warm()
        except BaseException as exc:  # noqa: BLE001 - reported to the driver, which stops
            conn.send((FAILED_SETUP, error_text(exc)))
            return
        conn.send((WARM, info))
        while (msg := conn.recv()) is not None:
            jobs, timeout = msg
            for rec in worker.run_batch(jobs, timeout):
                conn.send((RECORD, rec))
            conn.send((END, None))
    except (EOFError, OSError, pickle.PickleError):  # the driver is gone
        pass
    finally:
        worker.close()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
