"""Re-derive the TileIR digests of cached entries, in this process and in helper processes.

A derivation is cuTile's front end only (`ctbuild.tileir`, no tileiras): about 10 ms per entry.
Into a build with many entries to check, helper processes (``python -m
ctbuild.compile.ir_derive``, one per spare core) take chunks of jobs over a pipe while this
process derives chunks itself, so a short list costs no start-up and a long one uses every core.
A helper that dies hands its chunk back to this process.

Protocol (JSON lines): the first line to a helper is its setup ``{"paths", "modules",
"toolchain", "bytecode_version"}``; it answers ``"ready"``; then each line it reads is a list of
jobs and it answers with a list of results, one per job.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Sequence

#: Jobs per chunk: about 0.1 s of front end, so the tail stays short.
CHUNK = 8
#: Jobs per helper process: fewer are derived here sooner than a helper starts (~0.5 s).
JOBS_PER_HELPER = 32


@dataclass(frozen=True)
class Setup:
    """What a derivation needs besides the job: where the project's modules are, which to
    import, the toolchain fingerprint its keys use, the TileIR bytecode version."""
    paths: list[str]
    modules: list[str]
    toolchain: str
    bytecode_version: str | None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def derive_job(job: dict[str, Any], setup: Setup) -> dict[str, Any]:
    """``{"key", "digest"}``; ``"stale": True`` when these sources no longer derive the job's
    key (nothing to compare); ``"error"`` when the front end fails on them."""
    from ..signature_classes import Weakening
    from ..space import Config
    from ..specs import Workload, spec_from_json
    from ..tileir import digest
    from .compiler import find_kernel
    from .plan import job_and_signature

    key = job["key"]
    try:
        kernel = find_kernel(job["module"], job["kernel"])
        cfg = Config(job["config"], kernel.name)
        w = Workload({k: spec_from_json(v) for k, v in job["workload"].items()})
        mine, signature = job_and_signature(kernel, cfg, w, job["arch"], setup.toolchain,
                                            Weakening.from_json(job.get("weaken")))
        if mine.key != key:
            return {"key": key, "stale": True}
        return {"key": key, "digest": digest(kernel, cfg, signature, job["arch"],
                                             setup.bytecode_version)}
    except Exception as exc:  # noqa: BLE001 - the front end refusing these sources is a finding
        return {"key": key, "error": f"{type(exc).__name__}: {exc}"[:500]}


class _Helper:
    """One helper process and the chunk it is working on."""

    def __init__(self, setup: Setup) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ctbuild.compile.ir_derive"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.ready = False
        self.chunk: list[dict[str, Any]] | None = None
        self.send(setup.to_json())

    def send(self, obj: Any) -> bool:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def drop(self, chunks: deque) -> None:
        """Stop using this helper; the chunk it was on goes back to ``chunks``."""
        if self.chunk is not None:
            chunks.append(self.chunk)
        self.chunk, self.ready = None, False
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def helpers_for(n_jobs: int, workers: int | None) -> int:
    """Helper processes for ``n_jobs``: one per `JOBS_PER_HELPER`, at most one per spare core
    (``workers`` counts this process)."""
    cores = workers if workers is not None else (os.cpu_count() or 1)
    return max(0, min(cores - 1, n_jobs // JOBS_PER_HELPER))


def derive_all(jobs: Sequence[dict[str, Any]], setup: Setup, workers: int | None = None
               ) -> tuple[dict[str, dict[str, Any]], int]:
    """Results by key for every job, and how many helper processes ran."""
    chunks = deque(list(jobs[i:i + CHUNK]) for i in range(0, len(jobs), CHUNK))
    helpers = [_Helper(setup) for _ in range(helpers_for(len(jobs), workers))]
    results: dict[str, dict[str, Any]] = {}
    try:
        while chunks or any(h.chunk is not None for h in helpers):
            for h in helpers:
                if h.ready and h.chunk is None and chunks:
                    h.chunk = chunks.popleft()
                    if not h.send(h.chunk):
                        chunks.appendleft(h.chunk)
                        h.chunk, h.ready = None, False
            if chunks:
                for job in chunks.popleft():
                    results[job["key"]] = derive_job(job, setup)
            _collect(helpers, chunks, results, 0.0 if chunks else 1.0)
    finally:
        for h in helpers:
            h.close()
    return results, len(helpers)


def _collect(helpers: list[_Helper], chunks: deque, results: dict[str, dict[str, Any]],
             timeout: float) -> None:
    """Read what helpers have answered; a dead helper's chunk goes back to ``chunks``."""
    live = {h.proc.stdout.fileno(): h for h in helpers if h.proc.stdout is not None
            and not h.proc.stdout.closed and (h.chunk is not None or not h.ready)}
    if not live:
        return
    for fd in wait(list(live), timeout):
        h = live[fd]  # type: ignore[index]
        assert h.proc.stdout is not None
        line = h.proc.stdout.readline()
        try:
            answer = json.loads(line) if line else None
        except ValueError:
            answer = None
        if answer != "ready" and not isinstance(answer, list):
            h.drop(chunks)  # it died, could not set up, or said something not ours
            continue
        if answer == "ready":
            h.ready = True
        elif h.chunk is not None:
            results.update({r["key"]: r for r in answer})
            h.chunk = None


def _helper_main() -> None:
    """A helper: set up, then derive each chunk read from stdin until it closes. Answers go to
    the real stdout; whatever the project's modules print goes to stderr."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr
    setup = Setup(**json.loads(sys.stdin.readline()))
    sys.path[:0] = [p for p in setup.paths if p not in sys.path]
    import importlib
    for module in setup.modules:
        importlib.import_module(module)
    from ..cutile import load_compiler_without_torch
    load_compiler_without_torch()  # after the kernel modules: a body may name torch dtypes
    print(json.dumps("ready"), file=answers, flush=True)
    for line in sys.stdin:
        print(json.dumps([derive_job(job, setup) for job in json.loads(line)]), file=answers,
              flush=True)


if __name__ == "__main__":
    _helper_main()
