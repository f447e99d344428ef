"""The cold-start ledger: where a serving process's first call went, and what its cache saved.

Per phase, the first time it happens in the process (milliseconds): ``import`` (``import
ctbuild`` and the serving modules), ``cuda_context`` (the first query of the GPU, which makes
torch create the CUDA context unless the program already had), ``cache_open`` (the cache and
its toolchain), ``first_resolve`` (winner, CUBIN cover, grid and arguments of the first call),
``cubin_load`` (the first CUBIN read from the cache and verified) and ``first_launch``
(cuTile's launch of the first call, with the CUBIN read and the driver's module load in it);
``preload``: the seconds `runtime.preload` took on its thread (its resolves and CUBIN reads
are the first ones then, and a preloaded call has no first launch of its own).
Beside them, ``avoided``: the tuning seconds of the records served and the compile seconds of
the CUBINs served, as the build recorded them -- what this start did not spend.

``CTBUILD_LEDGER=path.json`` writes it after the first launch or preload and again at exit,
whole, as `ctbuild.atomic_write` writes reports (a link is followed; a device node or FIFO is
refused with one warning and the process serves on); ``ctbuild doctor --ledger path.json``
prints it (`read_ledger`: a regular file of at most `MAX_LEDGER_BYTES`).
"""
from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..atomic_write import write_json

LEDGER_ENV = "CTBUILD_LEDGER"
PHASES = ("import", "cuda_context", "cache_open", "first_resolve", "cubin_load",
          "first_launch", "preload")
#: The largest ledger file read: one is a pid, the phases and four counters (about 300 bytes).
MAX_LEDGER_BYTES = 64 * 2**10


class Ledger:
    """Phase times (first occurrence each) and the seconds the cache saved; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.phases_ms: dict[str, float] = {}
        self.avoided = {"tuning_s": 0.0, "compile_s": 0.0, "records": 0, "cubins": 0}
        self._exit_hook = False
        self._failed: str | None = None  # the path a write failed on, warned about once

    def add(self, phase: str, seconds: float) -> None:
        """Add to a phase."""
        with self._lock:
            self.phases_ms[phase] = self.phases_ms.get(phase, 0.0) + seconds * 1e3

    def once(self, phase: str, seconds: float) -> None:
        """Record a phase timed elsewhere unless it was recorded already."""
        with self._lock:
            self.phases_ms.setdefault(phase, seconds * 1e3)

    def imported(self, serving_modules_s: float) -> None:
        """The ``import`` phase, once: ``import ctbuild`` and the serving modules."""
        if "import" in self.phases_ms:
            return
        from .. import IMPORT_SECONDS
        self.add("import", IMPORT_SECONDS + serving_modules_s)

    @contextmanager
    def first(self, phase: str) -> Iterator[None]:
        """Time the block as ``phase`` unless that phase was timed already."""
        if phase in self.phases_ms:
            yield
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self.phases_ms.setdefault(phase, (time.perf_counter() - t0) * 1e3)
            if phase == "first_launch":
                self.write_env()

    def saved(self, what: str, seconds: Any) -> None:
        """A record (``tuning``) or CUBIN (``compile``) served, with what making it took."""
        with self._lock:
            self.avoided["records" if what == "tuning" else "cubins"] += 1
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
                self.avoided[f"{what}_s"] += float(seconds)

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return {"pid": os.getpid(),
                    "phases_ms": {p: round(self.phases_ms[p], 3) for p in PHASES
                                  if p in self.phases_ms},
                    "avoided": dict(self.avoided)}

    def write_env(self) -> None:
        """Write the ledger to ``CTBUILD_LEDGER`` (if set), now and at exit."""
        path = os.environ.get(LEDGER_ENV)
        if not path:
            return
        if not self._exit_hook:
            self._exit_hook = True
            atexit.register(self.write_env)
        from ctbuild.cache.errors import CacheError  # the writer's refusals (a device, a FIFO)
        try:
            write_json(path, self.to_json())
        except (OSError, CacheError) as exc:
            if path != self._failed:  # one line per path, not one per write: serving goes on
                self._failed = path
                import logging
                logging.getLogger("ctbuild.runtime").warning(
                    "ctbuild: cannot write the cold-start ledger to %s=%s: %s", LEDGER_ENV, path, exc)


#: The process's ledger.
LEDGER = Ledger()


def read_ledger(path: str) -> dict[str, Any]:
    """The ledger written to ``path``; ValueError saying what is wrong (absent, not a regular
    file, above `MAX_LEDGER_BYTES`, not a JSON object) and what to do. (Imports the reader
    here: a serving process, which only writes ledgers, does not load it.)"""
    from ctbuild.cache.user_files import FileTooLargeError, NotAFileError, read_regular
    try:
        data = json.loads(read_regular(path, limit=MAX_LEDGER_BYTES, what="a ledger"))
    except OSError as exc:
        raise ValueError(f"cannot read the ledger {path} ({exc.strerror or exc}); run the "
                         f"service once with {LEDGER_ENV}={path} to write it") from None
    except (NotAFileError, FileTooLargeError) as exc:
        raise ValueError(f"{exc}: give the path a service wrote with {LEDGER_ENV}") from None
    except ValueError as exc:
        raise ValueError(f"the ledger {path} is not JSON ({exc}); give the path a service "
                         f"wrote with {LEDGER_ENV}") from None
    if not isinstance(data, dict):
        raise ValueError(f"the ledger {path} is not a JSON object; give the path a service "
                         f"wrote with {LEDGER_ENV}")
    return data


def format_ledger(data: dict[str, Any]) -> str:
    """A ledger as text (``ctbuild doctor --ledger``)."""
    lines = ["cold start (first time each phase ran in the process):"]
    for phase in PHASES:
        ms = data.get("phases_ms", {}).get(phase)
        lines.append(f"  {phase:14} {'-' if ms is None else f'{ms:10.3f} ms'}")
    avoided = data.get("avoided", {})
    lines.append(f"  avoided: {avoided.get('tuning_s', 0):.1f} s of tuning "
                 f"({avoided.get('records', 0)} records), {avoided.get('compile_s', 0):.1f} s "
                 f"of compiling ({avoided.get('cubins', 0)} CUBINs)")
    return "\n".join(lines)
