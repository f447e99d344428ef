"""``ctbuild tune --compile-missing``: compile absent CUBINs in a local process pool.

The GPU node has no Ray, so this is a plain spawn pool running `ctbuild.compile.compiler.compile_job`;
the tuner measures candidates in the order their CUBINs arrive, so measuring starts as soon as
the first one exists.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

if TYPE_CHECKING:
    from ctbuild.cache import Store

    from .plan import CompileJob

#: How often a compile worker looks whether the process that started it is still there.
PARENT_POLL_S = 0.25


def _pool_init(paths: list[str], parent: int) -> None:
    for p in reversed(paths):
        if p not in sys.path:
            sys.path.insert(0, p)
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # compile workers never touch the GPU
    threading.Thread(target=_leave_with, args=(parent,), daemon=True).start()


def _leave_with(parent: int) -> None:
    """End this worker once the process that started it is gone. A measuring process skips
    its interpreter's teardown (`ctbuild.tune.session`) and a supervisor kills a stuck one:
    its workers, blocked on a queue whose every end they hold, then lived on for ever holding
    its stderr, and ``ctbuild tune --compile-missing`` never ended for a caller reading it."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(0)


def _pool_compile(job: dict[str, Any], timeout_sec: float | None) -> dict[str, Any]:
    from .compiler import compile_job
    return compile_job(job, timeout_sec=timeout_sec)


class CompilePool:
    """A local process pool compiling jobs with `ctbuild.compile.compiler.compile_job` (no Ray).

    ``submit`` is idempotent per compile key; ``arrivals(keys)`` yields keys as their CUBINs land
    in the store (already-present ones first), and records failures in ``errors``.
    """

    def __init__(self, store: Store, *, workers: int | None = None, paths: Sequence[str] = (),
                 timeout_sec: float | None = None) -> None:
        import multiprocessing as mp
        self.store = store
        self.timeout_sec = timeout_sec
        n = workers or max(1, min(16, (os.cpu_count() or 2) - 1))
        self.executor = ProcessPoolExecutor(
            max_workers=n, mp_context=mp.get_context("spawn"), initializer=_pool_init,
            initargs=([str(p) for p in paths] or list(sys.path[:1]), os.getpid()))
        self.futures: dict[str, Future] = {}
        self.errors: dict[str, str] = {}
        self.compiled: set[str] = set()
        self.seconds = 0.0
        self._toolchain_recorded = False

    def submit(self, job: CompileJob) -> None:
        if job.key in self.futures or self.store.has_compile(job.key):
            return
        self.futures[job.key] = self.executor.submit(_pool_compile, job.to_json(),
                                                     self.timeout_sec)

    def _land(self, key: str) -> bool:
        fut = self.futures[key]
        if key in self.compiled:
            return True
        if key in self.errors:
            return False
        try:
            out = fut.result()
        except Exception as exc:  # noqa: BLE001 - any compile failure is a per-candidate result
            self.errors[key] = f"{type(exc).__name__}: {exc}".strip()
            return False
        self.store.put_compile(key, out["cubin"], symbol=out["symbol"],
                               meta={**out["meta"], "source": "ctbuild tune --compile-missing"})
        self.seconds += out["seconds"]
        self.compiled.add(key)
        if not self._toolchain_recorded:
            self._toolchain_recorded = True
            with contextlib.suppress(Exception):
                from ..toolchain import probe, record_in
                tc = probe()
                if tc.fingerprint not in self.store.toolchains():
                    record_in(self.store, tc)
        return True

    def arrivals(self, keys: Iterable[str]) -> Iterator[str]:
        keys = list(dict.fromkeys(keys))
        pending = []
        for k in keys:
            if k in self.futures:
                pending.append(k)
            elif self.store.has_compile(k):
                yield k
            else:
                self.errors[k] = "not submitted for compilation"  # pragma: no cover
        by_future = {self.futures[k]: k for k in pending}
        for fut in as_completed(by_future):
            k = by_future[fut]
            if self._land(k):
                yield k

    def close(self) -> None:
        """Cancel what has not started; the workers end after what they compile (or with this
        process: `_leave_with`)."""
        self.executor.shutdown(wait=False, cancel_futures=True)
