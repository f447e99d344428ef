"""The farm's public face: `Farm` (start, run, close) and the one-shot `run_jobs`.

A `Farm` is its worker pool (`ctbuild.farm.pool`: Ray, the workers, their start-up) and, per `run`, a
driver (`ctbuild.farm.driver`: the loop that feeds the workers and alone writes the cache) with its
scheduler (`ctbuild.farm.scheduler`: which jobs go out next, in what batches). Workers are reached
through one interface (`ctbuild.farm.worker_handle`), as Ray actors (`ctbuild.farm.ray_workers`) or local
processes (`ctbuild.farm.local_workers`).
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterable

from .cluster import resolve_address
from .driver import Driver, Hooks
from .options import FarmOptions
from .pool import WorkerPool
from .records import FarmResult, JobRecord
from .worker import callable_ref

__all__ = ["Farm", "FarmOptions", "run_jobs"]


def _from_pool(name: str, doc: str) -> property:
    return property(lambda self: getattr(self.pool, name), doc=doc)


class Farm:
    """Compile jobs on Ray workers; the driver stores the CUBINs into the cache at ``cache_dir``.

    ``compile_fn(job, *, timeout_sec) -> {"cubin": bytes, "symbol": str, "seconds"?: float,
    "meta"?: dict}`` runs on the workers; pass a top-level function (or a ``"module:name"``
    string). ``meta`` is stored with the entry (plus ``compile_seconds``). Use as a context
    manager; `start` is implicit in `run` (and skipped when every job is already cached);
    `start_in_background` overlaps Ray's start-up with the caller's own work.
    """

    def __init__(self, cache_dir: str | os.PathLike, compile_fn: Callable[..., Any] | str,
                 options: FarmOptions | None = None, **overrides: Any) -> None:
        self.cache_dir = os.fspath(os.path.abspath(cache_dir))
        self.options = options or FarmOptions()
        for k, v in overrides.items():
            if not hasattr(self.options, k):
                raise TypeError(f"unknown farm option {k!r}")
            setattr(self.options, k, v)
        self.options.check()
        self.compile_ref = callable_ref(compile_fn)
        self.address = resolve_address(self.options.address)
        self.pool = WorkerPool(self.options, self.address, self.compile_ref)
        #: Why the farm stopped (then every later run stops at once too), or None.
        self.fatal: str | None = None

    started = _from_pool("started", "Whether Ray is up (started or joined).")
    slots = _from_pool("slots", "The worker slots (`ctbuild.farm.pool.Slot`).")
    startup_seconds = _from_pool("startup_seconds", "Start-up until the first worker was warm.")
    startup_steps = _from_pool("startup_steps", "Where the start-up went (`WorkerPool`).")
    restarts = _from_pool("restarts", "Workers lost to a crash or a hang.")
    worker_seconds = _from_pool("worker_seconds", "Seconds workers could take jobs.")
    early_workers = _from_pool("early_workers", "Local workers started while Ray started.")
    early_info = _from_pool("early_info", "What each local worker reported when warm.")
    reaper = _from_pool("reaper", "The watchdog's pipe while this farm has processes.")

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> Farm:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start_in_background(self) -> None:
        """Start or join Ray in a thread; `run` spawns the workers (or `close` stops Ray).

        Only Ray starts here: workers are spawned by `start`, so they get the options the
        caller settles while Ray starts (``setup_args`` holding the driver's probe, say)."""
        self.pool.start_in_background()

    @property
    def ray_requested(self) -> bool:
        """Whether Ray is started, starting or joined (then this run uses Ray's workers)."""
        return self.pool.ray_requested

    def start(self, n_jobs: int | None = None) -> None:
        """Start or join Ray (unless a background start did) and spawn the workers, at most
        ``n_jobs`` (each warms up on its own; `run` hands jobs to each as soon as it is warm)."""
        self.pool.start(n_jobs)

    def close(self) -> None:
        """Let every worker remove its temp directory, stop the workers, leave or stop Ray."""
        self.pool.close()

    # ---- running ---------------------------------------------------------------------------
    def run(self, jobs: Iterable[dict[str, Any]],
            on_record: Callable[[JobRecord], None] | None = None,
            on_tick: Callable[[], None] | None = None,
            on_start: Callable[[int], None] | None = None,
            on_ready: Callable[[], None] | None = None) -> FarmResult:
        """Compile every job not yet in the cache; return one record per (distinct) job.

        ``on_record(JobRecord)`` is called as each job finishes (cached ones first),
        ``on_tick()`` about twice a second while waiting, ``on_start(n_to_compile)`` before
        Ray is started (never, when everything is cached), ``on_ready()`` when the first worker
        is warm. At the end every job counted as compiled or cached is checked in the cache."""
        unique = _unique(jobs)
        driver = Driver(self.pool, self.cache_dir, self.options,
                        Hooks(on_record, on_tick, on_ready), self.fatal)
        result = FarmResult(address=self.address)
        try:
            with driver.session():
                todo = driver.skip_cached(unique.values())
                if todo:
                    if on_start:
                        on_start(len(todo))
                    self._compile(driver, todo, result)
        finally:
            self.fatal = driver.fatal
        result.records = [driver.records[k] for k in unique]
        result.restarts = self.pool.restarts
        result.fatal = self.fatal
        return result

    def _compile(self, driver: Driver, todo: list[dict[str, Any]], result: FarmResult) -> None:
        """Get workers going, run the driver over ``todo``, and say how it went."""
        pool = self.pool
        began = pool.begin(len(todo))
        driver.run(todo)
        result.startup_seconds = pool.startup_seconds
        result.startup_steps = {k: round(v, 3) for k, v in pool.startup_steps.items()}
        pool.end_run()  # closes the slots first: no worker-second is counted after the run ends
        result.run_seconds = time.monotonic() - (pool.first_ready or began)
        result.worker_seconds = pool.worker_seconds
        result.workers = pool.ray_slots
        result.early_workers = pool.early_workers
        result.local_only = self.options.local_only
        result.worker_info = pool.worker_info()


def _unique(jobs: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The jobs by key, the first of each key kept; a job without a str key is refused."""
    unique: dict[str, dict[str, Any]] = {}
    for job in jobs:
        if not isinstance(job, dict) or not isinstance(job.get("key"), str):
            raise ValueError(f"a farm job must be a dict with a str 'key', got {job!r:.200}")
        unique.setdefault(job["key"], job)
    return unique


def run_jobs(jobs: Iterable[dict[str, Any]], cache_dir: str | os.PathLike,
             compile_fn: Callable[..., Any] | str, **options: Any) -> FarmResult:
    """One-shot: start the farm, run ``jobs``, shut down. ``options`` as in `FarmOptions`."""
    with Farm(cache_dir, compile_fn, FarmOptions(**options)) as farm:
        return farm.run(jobs)
