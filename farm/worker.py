"""The worker actor: set up once (env, temp dir, imports, toolchain probe), then compile batches.

`FarmWorker` is a plain class; the executor wraps it with ``ray.remote``. ``run_batch`` is a
generator: Ray streams one record per job back to the driver as soon as it is done, so the
driver knows which job a worker is on (to blame the right job for a crash or a hang). A compiled
job's record carries the CUBIN bytes and their digest through Ray's object store: the worker
never touches the cache, and writes nowhere but its own temp directory, which it removes when
the driver closes it. A worker that was killed cannot remove its own: the next worker to warm up or
close on that node does (`sweep_orphans`).
"""
from __future__ import annotations

import fcntl
import importlib
import os
import pickle
import shutil
import socket
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

from ctbuild.cache.digest import digest_of

from .env import clean_worker_env
from .records import COMPILED, FAILED

#: At most this much error text is kept per failed job.
MAX_ERROR_CHARS = 8000
#: Prefix of each worker's private temp directory (TMPDIR inside the worker).
TEMP_PREFIX = "farm-worker-"
#: The file in a worker's temp directory that the worker holds locked as long as it lives.
LOCK_NAME = ".alive"
#: A temp directory whose lock file is missing or empty is only swept once it is this old
#: (seconds): its worker may be between creating the directory and holding the lock.
UNLOCKED_GRACE = 60.0


def hold_temp_dir(path: str) -> int:
    """Mark ``path`` as a live worker's: lock its lock file, then write our PID into it. The
    PID comes after the lock, so a lock file with content whose lock is free was held by a
    worker that has died (`sweep_orphans`). Returns the fd to keep open while we live."""
    fd = os.open(os.path.join(path, LOCK_NAME), os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, str(os.getpid()).encode())
    return fd


def sweep_orphans(parent: str, own: str | None = None) -> int:
    """Remove the temp directories under ``parent`` of workers that are gone (killed: a hang
    cut off, an OOM kill, a killed driver's workers). A live worker holds its directory's lock
    file locked (`fcntl.flock`, released by the kernel when the process dies, in any PID
    namespace): a directory whose lock can be taken and whose lock file names a PID has no
    owner any more. Returns how many went."""
    removed = 0
    try:
        names = [n for n in os.listdir(parent) if n.startswith(TEMP_PREFIX)]
    except OSError:
        return 0
    for name in names:
        path = os.path.join(parent, name)
        if path != own and _orphaned(path):
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed


def _orphaned(path: str) -> bool:
    """Whether no live worker holds ``path`` (see `hold_temp_dir`)."""
    try:
        fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDONLY)
    except FileNotFoundError:
        return _older_than_grace(path)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its worker is alive
            return False
        # The lock is free: a dead worker's, or one that has just created the file and is
        # about to lock it (no PID written yet).
        return bool(os.read(fd, 32)) or _older_than_grace(path)
    finally:
        os.close(fd)


def _older_than_grace(path: str) -> bool:
    try:
        return time.time() - os.stat(path).st_mtime > UNLOCKED_GRACE
    except OSError:
        return False


def callable_ref(fn: Callable[..., Any] | str | None) -> str | bytes | None:
    """A reference a worker can resolve: ``"module:qualname"`` for importable top-level
    functions (pickled by reference, imported on the worker), else cloudpickled bytes."""
    if fn is None or isinstance(fn, str):
        return fn
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module and module != "__main__" and "<" not in qualname:
        return f"{module}:{qualname}"
    import cloudpickle  # shipped with Ray
    return cloudpickle.dumps(fn)


def resolve_callable(ref: str | bytes | None) -> Callable[..., Any] | None:
    if ref is None:
        return None
    if isinstance(ref, bytes):
        return pickle.loads(ref)  # noqa: S301 - produced by our own driver, never read from disk
    module, _, qualname = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    if not str(exc).strip():  # a bare exception: the traceback is the only clue
        text += "\n" + "".join(traceback.format_exception(exc))[-2000:]
    return text[:MAX_ERROR_CHARS]


def _is_fatal(exc: BaseException, fatal: tuple[str, ...]) -> bool:
    return any(cls.__name__ in fatal for cls in type(exc).__mro__)


class FarmWorker:
    """One worker slot. ``spec`` is a JSON-able dict built by the executor."""

    def __init__(self, slot: str, spec: dict[str, Any]) -> None:
        self.slot = slot
        self.spec = spec
        self.compile_fn: Callable[..., dict[str, Any]] | None = None
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.temp: str | None = None
        self._alive: int | None = None  # the locked fd of our temp dir's lock file

    def warm(self) -> dict[str, Any]:
        """Environment, private temp dir, sys.path, imports and setup hook, once per process."""
        start = time.perf_counter()
        removed = clean_worker_env(self.slot, tuple(self.spec.get("strip_env", ())),
                                   self.spec.get("env"))
        # Everything the compiler writes goes below one directory of ours, removed by close().
        self.temp = tempfile.mkdtemp(prefix=TEMP_PREFIX)
        self._alive = hold_temp_dir(self.temp)
        sweep_orphans(os.path.dirname(self.temp), own=self.temp)
        os.environ["TMPDIR"] = self.temp
        tempfile.tempdir = self.temp
        for path in reversed(self.spec.get("sys_paths", [])):
            if path not in sys.path:
                sys.path.insert(0, path)
        self.compile_fn = resolve_callable(self.spec["compile_fn"])
        setup = resolve_callable(self.spec.get("setup_fn"))
        info = dict(setup(*self.spec.get("setup_args", [])) or {}) if setup else {}
        return {"slot": self.slot, "worker": self.name, "pid": os.getpid(),
                "node": socket.gethostname(), "temp": self.temp, "warm_seconds": round(time.perf_counter() - start, 3),
                "stripped_env": sorted(removed), **info}

    def ping(self) -> int:
        return os.getpid()

    def close(self) -> bool:
        """Remove this worker's temp directory (the driver calls this before killing it), and
        those of workers killed meanwhile (their locks are free by now)."""
        if self.temp:
            shutil.rmtree(self.temp, ignore_errors=True)
            sweep_orphans(os.path.dirname(self.temp))
            self.temp = None
        if self._alive is not None:
            os.close(self._alive)
            self._alive = None
        return True

    def run_batch(self, jobs: list[dict[str, Any]], timeout_sec: float | None):
        for job in jobs:
            yield self.run_one(job, timeout_sec)

    def run_one(self, job: dict[str, Any], timeout_sec: float | None) -> dict[str, Any]:
        rec: dict[str, Any] = {"key": job["key"], "worker": self.name, "seconds": 0.0}
        if self.compile_fn is None:
            return {**rec, "status": FAILED, "error_type": "FarmError",
                    "error": "worker was not set up (warm() did not run)"}
        try:
            start = time.perf_counter()
            out = self.compile_fn(job, timeout_sec=timeout_sec)
            seconds = float(out.get("seconds", time.perf_counter() - start))
            cubin = out["cubin"]
            if not isinstance(cubin, (bytes, bytearray)) or not cubin:
                raise ValueError("the compile produced no output (empty CUBIN)")
            cubin = bytes(cubin)
            meta = {**(out.get("meta") or {}), "compile_seconds": round(seconds, 4)}
            return {**rec, "status": COMPILED, "seconds": seconds, "cubin": cubin,
                    "digest": digest_of(cubin), "symbol": out["symbol"], "meta": meta}
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - every failure is a record
            return {**rec, "status": FAILED, "error": error_text(exc),
                    "error_type": type(exc).__name__,
                    "fatal": _is_fatal(exc, tuple(self.spec.get("fatal_errors", ())))}
