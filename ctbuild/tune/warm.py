"""Measuring processes started before the supervisor has planned anything.

A measuring process spends seconds before its first measurement, most of them importing torch
and creating its CUDA context; so does the supervisor (``ctbuild tune``), before it knows the
kernels, the GPU and the plan. One after the other they add up. So the supervisor starts one
process per lane it expects (from ``--gpus`` alone, no CUDA) first thing: each imports torch,
creates its context on its GPU and waits on its stdin for its spec (`ctbuild.tune.session`).
A lane takes the process started for its GPU, else starts one as before; processes no lane
took are stopped, having measured nothing; one whose supervisor died reads the end of its
stdin and exits.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

#: Where the NVIDIA driver lists this machine's GPUs (``--gpus all`` counts them there).
DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")


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
        self._procs: list[tuple[dict[str, str] | None, subprocess.Popen]] = []
        for env in envs:
            try:
                self._procs.append((env, session_process("--warm", env, stdin=subprocess.PIPE)))
            except OSError:  # no process to spare: the lane starts its own, as before
                break

    def take(self, env: dict[str, str] | None) -> subprocess.Popen | None:
        """A process started with ``env`` and still waiting, for a lane to hand its spec."""
        for i, (started, proc) in enumerate(self._procs):
            if started == env and proc.poll() is None:
                del self._procs[i]
                return proc
        return None

    def close(self) -> None:
        """Stop the processes no lane took (they hold nothing yet) and reap them."""
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


def wait_for_spec() -> str | None:
    """In a started process: import torch, create the CUDA context (a failure is the spec's
    run's to report), then wait for the spec's path (None: the supervisor sent none)."""
    try:
        import torch
        torch.empty(1, device="cuda")  # the context, on the GPU the lane's env names
    except Exception:  # noqa: BLE001 - the run itself reports a GPU it cannot use
        pass
    line = sys.stdin.readline().strip()
    return line or None
