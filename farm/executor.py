"""The driver side: start workers, hand out batches, collect records, handle crashes and hangs.

Scheduling: every worker slot has at most two batches queued (one running, one waiting, so it
never idles between batches); batch size shrinks as the queue drains (guided self-scheduling),
so small jobs are batched and the tail stays balanced. Records stream back per job
(``num_returns="streaming"``), which tells the driver exactly which job each worker is on:

* a worker process that dies (segfault, os._exit, OOM kill) -> the job it was on is retried on
  another worker, up to ``max_retries`` times, then recorded as failed ("WorkerDied"); the
  jobs queued behind it are re-queued without counting an attempt; the slot gets a new worker;
* no record for ``compile_timeout + grace`` seconds -> the job is recorded as failed
  ("Timeout"), the worker is killed and replaced (a Python-level hang; a hung tileiras is
  stopped earlier by the worker's own compiler timeout and reported as a compile error);
* an error whose class is named in ``fatal_errors`` (e.g. a toolchain mismatch), a worker that
  cannot set up, or a worker whose probed info differs from ``expect`` -> the build is aborted:
  nothing else would build correctly on that worker either.
"""
from __future__ import annotations

import math
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from .cluster import connect, disconnect, resolve_address
from .env import STRIPPED_ENV
from .records import CACHED, COMPILED, FAILED, FarmError, FarmResult, JobRecord
from .worker import FarmWorker, callable_ref

#: Batches queued per worker (one running + one waiting).
QUEUE_DEPTH = 2
#: How often (s) the driver wakes up with nothing finished, for progress ticks and deadlines.
TICK_SECONDS = 0.5


@dataclass
class FarmOptions:
    """How to run the farm. All optional; see `Farm`."""
    workers: int | None = None          # worker slots (default: cores here / CPUs of the cluster)
    address: str | None = None          # Ray cluster to join (default $RAY_ADDRESS, else embedded)
    compile_timeout: float | None = 300.0  # seconds per job, enforced in worker and driver
    grace: float | None = None          # extra seconds the driver waits (default 50%, 2..30 s)
    max_retries: int = 2                # re-runs of a job whose worker died
    max_batch: int = 16                 # jobs per batch at most
    setup_fn: Callable[..., Any] | str | None = None  # run once per worker; returns info dict
    setup_args: tuple = ()
    sys_paths: list[str] = field(default_factory=list)  # prepended to sys.path on workers
    ship: list[str] = field(default_factory=list)  # py_modules shipped when joining a cluster
    fatal_errors: tuple[str, ...] = ()  # exception class names that abort the build
    expect: dict[str, Any] = field(default_factory=dict)  # worker info that must match
    env: dict[str, str] = field(default_factory=dict)     # set in workers
    strip_env: tuple[str, ...] = STRIPPED_ENV             # removed in workers
    startup_timeout: float = 180.0      # seconds for all workers to start and warm up


@dataclass
class _Batch:
    jobs: list[dict[str, Any]]
    gen: Any
    done: int = 0


@dataclass
class _Slot:
    name: str
    actor: Any = None
    warm_ref: Any = None
    info: dict[str, Any] | None = None
    batches: deque = field(default_factory=deque)
    since: float = 0.0   # when the job the worker is on (as far as we know) started

    @property
    def ready(self) -> bool:
        return self.actor is not None and self.warm_ref is None


class Farm:
    """Compile jobs on Ray workers into the cache at ``cache_dir``.

    ``compile_fn(job, *, timeout_sec) -> {"cubin": bytes, "symbol": str, "seconds"?: float,
    "toolchain"?: str, "meta"?: dict}`` runs on the workers; pass a top-level function (or a
    ``"module:name"`` string). Use as a context manager; `start` is implicit in `run` (and is
    skipped entirely when every job is already cached).
    """

    def __init__(self, cache_dir: str | os.PathLike, compile_fn: Callable[..., Any] | str,
                 options: FarmOptions | None = None, **overrides: Any) -> None:
        self.cache_dir = os.fspath(os.path.abspath(cache_dir))
        self.options = options or FarmOptions()
        for k, v in overrides.items():
            if not hasattr(self.options, k):
                raise TypeError(f"unknown farm option {k!r}")
            setattr(self.options, k, v)
        if self.options.workers is not None and self.options.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.options.workers}")
        if self.options.compile_timeout is not None and self.options.compile_timeout <= 0:
            raise ValueError(f"compile_timeout must be > 0, got {self.options.compile_timeout}")
        self.compile_ref = callable_ref(compile_fn)
        self.address = resolve_address(self.options.address)
        self.slots: list[_Slot] = []
        self.started = False
        self.startup_seconds = 0.0
        self.restarts = 0
        self.fatal: str | None = None
        self._owned = False
        self._remote: Any = None
        self._ray: Any = None

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> "Farm":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self, n_jobs: int | None = None) -> float:
        """Start or join Ray and warm the workers; returns the seconds it took."""
        if self.started:
            return 0.0
        t0 = time.perf_counter()
        wanted = self.options.workers or (os.cpu_count() or 1) if self.address is None \
            else self.options.workers
        if n_jobs is not None and wanted is not None:
            wanted = max(1, min(wanted, n_jobs))
        conn = connect(self.address, wanted or 1, self.options.ship, self.options.env)
        self._owned = conn["owned"]
        self.started = True
        import ray
        self._ray = ray
        cpus = conn["cpus"]
        if cpus < 1:
            raise FarmError(f"the Ray cluster at {self.address} has no CPUs for workers")
        n = min(wanted or cpus, cpus)
        if n_jobs is not None:
            n = max(1, min(n, n_jobs))
        opts: dict[str, Any] = dict(num_cpus=1, num_gpus=0, max_restarts=0, max_task_retries=0,
                                    max_concurrency=1)
        if self.address is not None:
            opts["scheduling_strategy"] = "SPREAD"
        self._remote = ray.remote(FarmWorker).options(**opts)
        self.slots = [_Slot(f"w{i}") for i in range(n)]
        for slot in self.slots:
            self._spawn(slot)
        deadline = time.monotonic() + self.options.startup_timeout
        while any(s.warm_ref is not None for s in self.slots) and not self.fatal:
            refs = [s.warm_ref for s in self.slots if s.warm_ref is not None]
            left = deadline - time.monotonic()
            if left <= 0:
                raise FarmError(
                    f"{len(refs)} of {n} workers did not start within "
                    f"{self.options.startup_timeout:.0f}s (cluster CPUs: {cpus}; are the nodes "
                    "busy, or is the runtime_env failing to install?)")
            ready, _ = ray.wait(refs, num_returns=1, timeout=left)
            for ref in ready:
                self._warmed(next(s for s in self.slots if s.warm_ref is ref))
        if self.fatal:
            raise FarmError(self.fatal)
        self.startup_seconds = time.perf_counter() - t0
        return self.startup_seconds

    def close(self) -> None:
        ray = self._ray
        if ray is not None and ray.is_initialized():
            for slot in self.slots:
                if slot.actor is not None:
                    try:
                        ray.kill(slot.actor, no_restart=True)
                    except Exception:  # noqa: BLE001 - already gone
                        pass
        self.slots = []
        if self.started:
            disconnect(self._owned)
        self.started = False

    def _spec(self) -> dict[str, Any]:
        o = self.options
        return {"cache_dir": self.cache_dir, "compile_fn": self.compile_ref,
                "setup_fn": callable_ref(o.setup_fn), "setup_args": list(o.setup_args),
                "sys_paths": [str(p) for p in o.sys_paths] if self.address is None else [],
                "fatal_errors": list(o.fatal_errors), "env": dict(o.env),
                "strip_env": list(o.strip_env)}

    def _spawn(self, slot: _Slot) -> None:
        slot.actor = self._remote.remote(slot.name, self._spec())
        slot.warm_ref = slot.actor.warm.remote()
        slot.batches.clear()
        slot.info = None

    def _warmed(self, slot: _Slot) -> None:
        ray = self._ray
        try:
            info = ray.get(slot.warm_ref)
        except Exception as exc:  # noqa: BLE001
            self.fatal = f"worker {slot.name} could not set up: {_cause(exc)}"
            return
        finally:
            slot.warm_ref = None
        slot.info = info
        for k, want in self.options.expect.items():
            if info.get(k) != want:
                self.fatal = (f"worker {info.get('worker', slot.name)} has {k} "
                              f"{info.get(k)!r} but the driver has {want!r}: every worker must "
                              "run the same cuda-tile/tileiras and kernel sources as the driver")

    def _restart(self, slot: _Slot) -> None:
        if slot.actor is not None:
            try:
                self._ray.kill(slot.actor, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self.restarts += 1
        self._spawn(slot)

    # ---- running ---------------------------------------------------------------------------
    def run(self, jobs: Iterable[dict[str, Any]],
            on_record: Callable[[JobRecord], None] | None = None,
            on_tick: Callable[[], None] | None = None,
            on_start: Callable[[int], None] | None = None) -> FarmResult:
        """Compile every job not yet in the cache; return one record per (distinct) job.

        ``on_record(JobRecord)`` is called as each job finishes (cached ones first),
        ``on_tick()`` about twice a second while waiting, ``on_start(n_to_compile)`` before
        Ray is started (never, when everything is cached)."""
        from cache import Store

        unique: dict[str, dict[str, Any]] = {}
        for job in jobs:
            if not isinstance(job, dict) or not isinstance(job.get("key"), str):
                raise ValueError(f"a farm job must be a dict with a str 'key', got {job!r:.200}")
            unique.setdefault(job["key"], job)
        records: dict[str, JobRecord] = {}
        with Store(self.cache_dir, readonly=False) as store:
            todo = []
            for key, job in unique.items():
                if store.has_compile(key):
                    records[key] = JobRecord(key, CACHED)
                    if on_record:
                        on_record(records[key])
                else:
                    todo.append(job)
        result = FarmResult(address=self.address)
        if todo:
            if on_start:
                on_start(len(todo))
            self.start(len(todo))
            result.startup_seconds = self.startup_seconds
            t0 = time.perf_counter()
            self._loop(todo, records, on_record, on_tick)
            result.run_seconds = time.perf_counter() - t0
            result.workers = len(self.slots)
            result.worker_info = [s.info for s in self.slots if s.info]
        result.records = [records[k] for k in unique]
        result.restarts = self.restarts
        result.fatal = self.fatal
        return result

    def _limit(self) -> float | None:
        t = self.options.compile_timeout
        if t is None:
            return None
        grace = self.options.grace if self.options.grace is not None else min(30.0, max(2.0, t / 2))
        return t + grace

    def _loop(self, todo: list[dict[str, Any]], records: dict[str, JobRecord],
              on_record: Callable[[JobRecord], None] | None,
              on_tick: Callable[[], None] | None) -> None:
        ray = self._ray
        o = self.options
        pending: deque = deque(todo)
        attempts: dict[str, int] = {}
        limit = self._limit()

        def finish(job: dict[str, Any], status: str, *, seconds: float = 0.0,
                   error: str | None = None, error_type: str | None = None,
                   worker: str | None = None) -> None:
            rec = JobRecord(job["key"], status, seconds, error, error_type,
                            attempts.get(job["key"], 0), worker)
            records[job["key"]] = rec
            if on_record:
                on_record(rec)

        def requeue(slot: _Slot, blame: str | None, why: str) -> None:
            """The slot's worker is gone: blame its current job (retry or fail), re-queue the rest."""
            rest: list[dict[str, Any]] = []
            current = None
            # An actor runs its batches one after another, so the job it was on is the first
            # without a result: possibly in the second batch, when the first has delivered all
            # its records but its generator's end has not been seen yet.
            for b in slot.batches:
                left = b.jobs[b.done:]
                if current is None and left:
                    current, left = left[0], left[1:]
                rest.extend(left)
            slot.batches.clear()
            pending.extendleft(reversed(rest))
            if current is not None:
                key = current["key"]
                attempts[key] = attempts.get(key, 0) + 1
                worker = (slot.info or {}).get("worker", slot.name)
                if blame == "Timeout":
                    finish(current, FAILED, error=why, error_type="Timeout", worker=worker)
                elif attempts[key] > o.max_retries:
                    finish(current, FAILED, error_type="WorkerDied", worker=worker,
                           error=f"worker died while compiling this job, {attempts[key]} times "
                                 f"(retries exhausted); last: {why}")
                else:
                    pending.appendleft(current)
            self._restart(slot)

        def submit(slot: _Slot) -> None:
            while slot.ready and len(slot.batches) < QUEUE_DEPTH and pending:
                size = max(1, min(o.max_batch, math.ceil(len(pending) / (len(self.slots) * 4))))
                batch = [pending.popleft() for _ in range(min(size, len(pending)))]
                gen = slot.actor.run_batch.options(num_returns="streaming").remote(
                    batch, o.compile_timeout)
                if not slot.batches:
                    slot.since = time.monotonic()
                slot.batches.append(_Batch(batch, gen))

        while (pending or any(s.batches for s in self.slots)) and not self.fatal:
            for slot in self.slots:
                submit(slot)
            waiting: dict[Any, tuple[_Slot, str]] = {}
            for s in self.slots:
                if s.warm_ref is not None:
                    waiting[s.warm_ref] = (s, "warm")
                elif s.batches:
                    waiting[s.batches[0].gen] = (s, "batch")
            if not waiting:
                raise FarmError("no live worker and jobs left (internal error)")
            now = time.monotonic()
            timeout = TICK_SECONDS
            if limit is not None:
                for s in self.slots:
                    if s.batches:
                        timeout = min(timeout, s.since + limit - now)
            ready, _ = ray.wait(list(waiting), num_returns=1, timeout=max(0.0, timeout))
            for obj in ready:
                slot, what = waiting[obj]
                if what == "warm":
                    self._warmed(slot)
                    continue
                batch = slot.batches[0]
                try:
                    ref = next(batch.gen)
                except StopIteration:
                    slot.batches.popleft()
                    slot.since = time.monotonic()
                    continue
                except ray.exceptions.RayError as exc:
                    requeue(slot, None, _cause(exc))
                    continue
                try:
                    rec = ray.get(ref)
                except ray.exceptions.RayError as exc:  # died, or the generator itself raised
                    requeue(slot, None, _cause(exc))
                    continue
                job = batch.jobs[batch.done]
                batch.done += 1
                slot.since = time.monotonic()
                attempts[job["key"]] = attempts.get(job["key"], 0) + 1
                if rec.get("fatal"):
                    self.fatal = rec.get("error") or rec.get("error_type") or "fatal error"
                finish(job, rec["status"], seconds=rec.get("seconds", 0.0),
                       error=rec.get("error"), error_type=rec.get("error_type"),
                       worker=rec.get("worker"))
            if limit is not None:
                now = time.monotonic()
                for slot in self.slots:
                    if slot.batches and now - slot.since > limit:
                        requeue(slot, "Timeout",
                                f"no result after {limit:.0f}s (compile timeout "
                                f"{o.compile_timeout:g}s plus grace): the compile hung; its "
                                "worker was killed and replaced")
            if on_tick and not ready:
                on_tick()
        if self.fatal:
            left = list(pending) + [j for s in self.slots for i, b in enumerate(s.batches)
                                    for j in (b.jobs[b.done:] if i == 0 else b.jobs)]
            self._stop_workers()  # nothing may land in the cache behind the driver's back
            from cache import Store
            with Store(self.cache_dir, readonly=False) as store:
                for job in left:
                    if job["key"] in records:
                        continue
                    if store.has_compile(job["key"]):  # finished before its worker stopped
                        finish(job, COMPILED)
                    else:
                        finish(job, FAILED, error_type="Aborted",
                               error=f"not built: the build was aborted: {self.fatal}")

    def _stop_workers(self) -> None:
        """Kill every worker and wait until each is really gone."""
        ray = self._ray
        probes = []
        for slot in self.slots:
            slot.batches.clear()
            if slot.actor is not None:
                try:
                    ray.kill(slot.actor, no_restart=True)
                    probes.append(slot.actor.ping.remote())
                except Exception:  # noqa: BLE001 - already gone
                    pass
                slot.actor = None
        if probes:
            ray.wait(probes, num_returns=len(probes), timeout=30)


def _cause(exc: BaseException) -> str:
    """The useful line of a Ray error (the remote exception, not Ray's wrapping)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and not isinstance(cause, type(exc)):
        return f"{type(cause).__name__}: {cause}".strip()
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return f"{type(exc).__name__}: " + (lines[-1] if lines else "")


def run_jobs(jobs: Iterable[dict[str, Any]], cache_dir: str | os.PathLike,
             compile_fn: Callable[..., Any] | str, **options: Any) -> FarmResult:
    """One-shot: start the farm, run ``jobs``, shut down. ``options`` as in `FarmOptions`."""
    with Farm(cache_dir, compile_fn, FarmOptions(**options)) as farm:
        return farm.run(jobs)
