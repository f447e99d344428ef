"""Measuring processes started before the supervisor has planned anything.

A measuring process spends seconds before its first measurement, most of them importing torch
and creating its CUDA context; so does the supervisor (``ctbuild tune``), before it knows the
kernels, the GPU and the plan. One after the other they add up. So the supervisor starts one
process per lane it expects (from ``--gpus`` alone, no CUDA) first thing: each imports torch,
creates its context on its GPU and waits on its stdin for its spec (`ctbuild.tune.session`).
A lane takes the process started for its GPU, else starts one as before; processes no lane
took are stopped, having measured nothing; one whose supervisor died reads the end of its
stdin and exits.

Each started process also reports its GPU (`ctbuild.tune.tuner.current_device`: arch, name,
driver) on a pipe once its context is made (`WarmLanes.gpus`), so the supervisor starts no CUDA
of its own: its start (every GPU of the node) held up the measuring process's context on a 4x
H200 host, 0.47 s alone and 1.23-1.26 s beside it, on the path to the first measurement. Where a
process cannot report, the supervisor asks torch as before, which also names what is wrong.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

#: Where the NVIDIA driver lists this machine's GPUs (``--gpus all`` counts them there).
DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")
#: The environment variable naming the pipe a started process reports its GPU on.
REPORT_FD = "CTBUILD_WARM_REPORT_FD"
#: Seconds the supervisor waits for every started process's report (import and context).
REPORT_WAIT_S = 120.0
#: The most bytes of one report read (a GPU's arch, name and driver).
REPORT_MAX = 4096


def visible_ids() -> list[str] | None:
    """This process's ``CUDA_VISIBLE_DEVICES`` as a list (None: not set, every GPU; set but
    empty: none)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return None if visible is None else [v.strip() for v in visible.split(",") if v.strip()]


def lane_env(gpu: int) -> dict[str, str] | None:
    """The ``CUDA_VISIBLE_DEVICES`` of a lane on GPU ``gpu``: that GPU, through this
    process's own list (None: this process sees no such GPU, and no lane may be shown one
    it hides)."""
    ids = visible_ids()
    if gpu < 0 or ids is not None and gpu >= len(ids):
        return None
    return {"CUDA_VISIBLE_DEVICES": str(gpu) if ids is None else ids[gpu]}


def expected_gpus(text: str | None) -> list[int] | None:
    """The GPUs ``--gpus text`` will name, as far as known without CUDA (None: no ``--gpus``,
    one lane on the current GPU; []: not known)."""
    if text is None:
        return None
    if text.strip() == "all":
        ids = visible_ids()
        try:
            count = len(ids) if ids is not None else len(os.listdir(DRIVER_GPUS))
        except OSError:
            return []
        return list(range(count))
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        return []


class WarmLanes:
    """The processes started for the lanes, by the environment each was started with."""

    @classmethod
    def for_gpus(cls, text: str | None) -> WarmLanes | None:
        """The processes ``--gpus text`` will want (None: no NVIDIA driver here, so no GPU to
        tune on: nothing is started)."""
        return cls(expected_gpus(text)) if DRIVER_GPUS.parent.is_dir() else None

    def __init__(self, gpus: Sequence[int] | None) -> None:
        envs = [None] if gpus is None else [e for g in gpus if (e := lane_env(g)) is not None]
        self.complete = len(envs) == (1 if gpus is None else len(gpus))
        self._procs: list[tuple[dict[str, str] | None, subprocess.Popen]] = []
        self._reports: list[int] = []
        for env in envs:
            read, write = os.pipe()
            try:
                proc = session_process("--warm", {**(env or {}), REPORT_FD: str(write)},
                                       stdin=subprocess.PIPE, pass_fds=(write,))
            except OSError:  # no process to spare: the lane starts its own, as before
                os.close(read)
                self.complete = False
                break
            finally:
                os.close(write)
            self._procs.append((env, proc))
            self._reports.append(read)

    def gpus(self, wait_s: float = REPORT_WAIT_S) -> list[dict[str, Any]] | None:
        """What every started process reported of its GPU (the fields of its
        `ctbuild.tune.tuner.Device`: ``arch``, ``name``, ``driver``), in the order of the lanes;
        None where one was not started, or could not report in ``wait_s`` (no GPU, a context
        that failed: the caller asks torch, which says why). Read once."""
        reports, self._reports = self._reports, []
        if not self.complete:  # torch answers, and says which GPU is not there
            for fd in reports:
                os.close(fd)
            return None
        deadline = time.monotonic() + wait_s
        found = [_report(fd, deadline) for fd in reports]
        if not found or any(r is None for r in found):
            return None
        return [r for r in found if r is not None]

    def take(self, env: dict[str, str] | None) -> subprocess.Popen | None:
        """A process started with ``env`` and still waiting, for a lane to hand its spec."""
        for i, (started, proc) in enumerate(self._procs):
            if started == env and proc.poll() is None:
                del self._procs[i]
                return proc
        return None

    def close(self) -> None:
        """Stop the processes no lane took (they hold nothing yet) and reap them."""
        for fd in self._reports:
            os.close(fd)
        self._reports.clear()
        for _, proc in self._procs:
            proc.kill()
            proc.wait()
            proc.stdin.close()  # type: ignore[union-attr]
        self._procs.clear()


def session_process(arg: str, env: Mapping[str, str] | None, **popen: Any) -> subprocess.Popen:
    """A measuring process, ``python -m ctbuild.tune.session ARG`` (a spec's path, or
    ``--warm``), with ``env`` added to this process's environment and its output on stderr."""
    return subprocess.Popen([sys.executable, "-m", "ctbuild.tune.session", arg],
                            stdout=sys.stderr, env={**os.environ, **(env or {})}, **popen)


def hand(proc: subprocess.Popen, spec_path: Path) -> bool:
    """Give a waiting process its spec; whether it took it (False: it is gone)."""
    try:
        proc.stdin.write(f"{spec_path}\n".encode())  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]
        return True
    except OSError:
        return False


def _report(fd: int, deadline: float) -> dict[str, Any] | None:
    """One process's report from the pipe ``fd`` (closed after): None where it wrote none
    before the deadline, or not one this module writes."""
    data = b""
    try:
        while len(data) <= REPORT_MAX:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(fd, REPORT_MAX + 1) if ready else b""
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    try:
        found = json.loads(data) if len(data) <= REPORT_MAX else None
    except ValueError:
        return None
    fields = ("arch", "name", "driver")
    ok = isinstance(found, dict) and set(found) == set(fields) and \
        all(isinstance(found[f], str) for f in fields)
    return found if ok else None


def gpu_report() -> bytes:
    """This process's GPU as `WarmLanes.gpus` reads it: its `ctbuild.tune.tuner.Device` but
    the index (which the supervisor knows, and the lane sees as 0)."""
    from .tuner import current_device
    device = current_device()
    return json.dumps({"arch": device.arch, "name": device.name,
                       "driver": device.driver}).encode()


def wait_for_spec() -> str | None:
    """In a started process: import torch, create the CUDA context (a failure is the spec's
    run's to report) and report the GPU on the supervisor's pipe (`WarmLanes.gpus`; nothing
    where it failed), then wait for the spec's path (None: the supervisor sent none)."""
    fd = os.environ.pop(REPORT_FD, None)
    report = b""
    try:
        import torch
        torch.empty(1, device="cuda")  # the context, on the GPU the lane's env names
        report = gpu_report()
    except Exception:  # noqa: BLE001 - the run itself reports a GPU it cannot use
        pass
    if fd is not None and fd.isdigit():
        try:
            os.write(int(fd), report)
            os.close(int(fd))
        except OSError:  # the supervisor is gone, or closed its end
            pass
    line = sys.stdin.readline().strip()
    return line or None
