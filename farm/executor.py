"""The driver side: start workers, hand out batches, store what comes back, handle failures.

The driver owns the cache: workers send each CUBIN back with its digest; the driver checks the
digest, stores the entry, reads it back, and only then counts the job as compiled. Nothing needs
a shared filesystem, and a killed build keeps every entry stored before it died.

Start-up: with an embedded Ray started in the background (`Farm.start_in_background`), a few
local worker processes (`ctbuild.farm.local_workers`) compile from the first job on while Ray comes up;
each Ray worker that warms up retires one of them.

Scheduling: jobs go out longest first (by the caller's ``estimate``, re-ranked whenever its
``learn`` says a finished job changed it), each worker as soon as it is warm (no waiting for
the others). Every worker slot has at most two batches queued (one running, one waiting, so it
never idles between batches), but nothing waits behind a long batch (over a batch's share) and
a long job only goes to a worker with nothing queued: work queued behind a long job on one
worker, while others idle, sets the finish time. A batch holds about 1/(4 x workers) of the
estimated work left (guided self-scheduling), so small jobs are batched and the tail stays
balanced. Records stream back per job (``num_returns="streaming"``), which
tells the driver exactly which job each worker is on:

* a worker process that dies (segfault, os._exit, OOM kill) -> the job it was on is retried on
  another worker, up to ``max_retries`` times, then recorded as failed ("WorkerDied"); the
  jobs queued behind it are re-queued without counting an attempt; the slot gets a new worker;
* no record for ``compile_timeout + grace`` seconds -> the job is recorded as failed
  ("Timeout"), the worker is killed and replaced (a Python-level hang; a hung tileiras is
  stopped earlier by the worker's own compiler timeout and reported as a compile error);
* an error whose class is named in ``fatal_errors`` (e.g. a toolchain mismatch), a worker that
  cannot set up, a worker whose probed info differs from ``expect``, or a cache that cannot be
  written (a full disk) -> the build stops: nothing else would land correctly either.

Concurrent builds into one cache do not compile a key twice: a job is dispatched only under its
claim (`ctbuild.farm.claims`); a job claimed by another build waits until that build stores it (then it
counts as cached) or gives the claim up (then this build compiles it).
"""
from __future__ import annotations

import errno
import os
import sqlite3
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait as connection_wait
from typing import Any, Callable, Iterable

from .claims import Claims
from .cluster import connect, disconnect, resolve_address, start_reaper, stop_reaper
from .local_workers import END, FAILED_SETUP, RECORD, WARM, LocalWorker
from .reaper import freeze_tree, kill_frozen
from .records import CACHED, COMPILED, FAILED, FarmError, FarmResult, JobRecord
from .worker import FarmWorker, callable_ref

#: Batches queued per worker (one running + one waiting).
QUEUE_DEPTH = 2
#: How often (s) the driver wakes up with nothing finished, for progress ticks and deadlines.
TICK_SECONDS = 0.5
#: Seconds a closing worker gets to remove its temp directory before it is killed.
CLOSE_SECONDS = 5.0
#: How often (s) the driver looks at local workers and at Ray's start while both may answer.
POLL_SECONDS = 0.02
#: Cores an embedded Ray's own start-up keeps busy (its GCS, raylet, agents and prestarted
#: workers start at once); local workers get the rest.
RAY_START_CORES = 2


def default_early_workers(slots: int) -> int:
    """Local workers to start while an embedded Ray starts: one per worker slot, leaving
    `RAY_START_CORES` to Ray's own start-up. None on 2 cores: there Ray's start-up fills the
    machine, and a local worker beside it only moved that CPU time into the compile phase
    (measured: throughput 0.72-0.87x a warm pool's against 0.91-0.97x without, end to end
    within this VM's noise). On 64 cores one per slot kept the run within 1.17x the floor.
    Each holds the memory of one worker (the kernel modules it imports) while it lives."""
    return max(0, min(slots, (os.cpu_count() or 1) - RAY_START_CORES))


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
    strip_env: tuple[str, ...] = ()                       # removed in workers
    startup_timeout: float = 180.0      # seconds until the first worker is warm
    estimate: Callable[[dict[str, Any]], float] | None = None  # a job's expected seconds
    # told each compiled job's seconds; True: estimates changed, re-rank the jobs not sent yet
    learn: Callable[[dict[str, Any], float], bool] | None = None
    # local processes that compile while an embedded Ray starts in the background (None:
    # `default_early_workers`; 0: none); a joined cluster or a Ray already up never uses them
    early_workers: int | None = None
    # run every job on local worker processes and never start Ray: where Ray is not installed,
    # or for a build that would be over before an embedded Ray is up
    local_only: bool = False


@dataclass
class _Batch:
    jobs: list[dict[str, Any]]
    gen: Any            # Ray's record stream (None on a local worker, whose records come in order)
    cost: float = 0.0   # estimated seconds
    done: int = 0


@dataclass(eq=False)  # slots are compared by identity
class _Slot:
    name: str
    actor: Any = None
    warm_ref: Any = None
    info: dict[str, Any] | None = None
    batches: deque = field(default_factory=deque)
    since: float = 0.0   # when the job the worker is on (as far as we know) started
    local: LocalWorker | None = None  # a local worker's process, instead of a Ray actor
    retiring: bool = False  # a local worker a Ray worker replaces: no more batches
    waits_for: _Slot | None = None  # the local worker this Ray worker replaces, until it left
    open_since: float | None = None  # when it could first take jobs (None: not yet, or gone)

    @property
    def ready(self) -> bool:
        return (self.actor is not None or self.local is not None) and self.warm_ref is None


def _disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(exc, sqlite3.OperationalError) and "full" in str(exc).lower()


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
        if self.options.workers is not None and self.options.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.options.workers}")
        if self.options.compile_timeout is not None and self.options.compile_timeout <= 0:
            raise ValueError(f"compile_timeout must be > 0, got {self.options.compile_timeout}")
        self.compile_ref = callable_ref(compile_fn)
        self.address = resolve_address(self.options.address)
        self.slots: list[_Slot] = []
        self.started = False
        self.startup_seconds = 0.0
        #: Where the start-up went, seconds after Ray's start began: Ray up (``ray``), workers
        #: spawned (``spawned``: once the caller has planned), the first one warm (``ready``).
        self.startup_steps: dict[str, float] = {}
        self.restarts = 0
        #: Seconds workers could take jobs, summed over workers (`FarmResult.worker_seconds`).
        self.worker_seconds = 0.0
        self.fatal: str | None = None
        self._t_start = 0.0                  # time.monotonic() when Ray's start began
        self._first_ready: float | None = None  # time.monotonic() when the first was warm
        self._owned = False
        self._reaper: int | None = None
        self._remote: Any = None
        self._ray: Any = None
        self._cpus = 0
        self._thread: threading.Thread | None = None
        self._start_done = threading.Event()
        self._release = threading.Event()   # lets the starting thread end (after Ray stopped)
        self._start_error: BaseException | None = None
        self._ray_slots = 0                  # Ray workers spawned (0: not yet)
        self._planned = 0                    # worker slots this run is to have
        self._leaving: list[LocalWorker] = []   # retired local workers, reaped at close
        self.early_workers = 0               # local workers started while Ray started
        self._local_seq = 0                  # names local workers uniquely (e0, e1, ...)
        self.early_info: list[dict[str, Any]] = []  # what each of them reported when warm

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> Farm:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start_in_background(self) -> None:
        """Start or join Ray in a thread; `run` spawns the workers (or `close` stops Ray).

        Only Ray starts here: workers are spawned by `start`, so they get the options the
        caller settles while Ray starts (``setup_args`` holding the driver's probe, say).
        The thread stays alive until `close`: Ray binds the processes it starts to the life of
        the starting thread (parent-death signal), so it may only end after Ray is stopped."""
        if self.started or self._thread is not None:
            return
        self._t_start = time.monotonic()

        def target() -> None:
            try:
                self._connect(None)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                self._start_error = exc
            finally:
                self._start_done.set()
            self._release.wait()

        self._thread = threading.Thread(target=target, name="farm-start", daemon=True)
        self._thread.start()

    @property
    def ray_requested(self) -> bool:
        """Whether Ray is started, starting or joined (then this run uses Ray's workers)."""
        return self._thread is not None or self.started

    def _join_start(self) -> None:
        """Wait until a background start is done; re-raise its error here."""
        if self._thread is not None:
            self._start_done.wait()
        if self._start_error is not None:
            exc, self._start_error = self._start_error, None
            raise exc

    def start(self, n_jobs: int | None = None) -> None:
        """Start or join Ray (unless a background start did) and spawn the workers, at most
        ``n_jobs`` (each warms up on its own; `run` hands jobs to each as soon as it is warm)."""
        self._join_start()
        if not self.started:
            self._connect(n_jobs)
        if not self._ray_slots:
            self._spawn_all(n_jobs)

    def _begin(self, n_jobs: int) -> None:
        """Get workers going for ``n_jobs`` jobs: local ones while an embedded Ray is still
        starting in the background (Ray's follow from `_poll_start`), else Ray's now."""
        starting = self._thread is not None and not self._start_done.is_set()
        wanted = self._wanted(n_jobs) or 1
        self._planned = wanted
        self.early_workers, self.early_info = 0, []
        if self.options.local_only:  # no Ray at all: one local worker per slot
            self._t_start = time.monotonic()
            if self._reaper is None:  # a SIGKILLed driver takes its workers (and tileiras) along
                self._reaper = start_reaper()
            self._add_local(wanted)
            return
        early = self.options.early_workers
        early = default_early_workers(wanted) if early is None else min(early, wanted)
        if not (starting and self.address is None and early > 0):
            self.start(n_jobs)
            return
        self.startup_steps["early"] = time.monotonic() - self._t_start
        self._add_local(early)

    def _add_local(self, n: int, count: bool = True) -> None:
        """Start ``n`` local worker processes (fewer where the system refuses more: then Ray's
        workers, or the local ones that did start, do the work)."""
        spec = self._spec()
        for _ in range(n):
            name = f"e{self._local_seq}"
            self._local_seq += 1
            try:
                slot = _Slot(name, local=LocalWorker(name, spec))
            except OSError:
                break
            slot.warm_ref = slot.local  # until it says it is warm
            self.slots.append(slot)
            self.early_workers += int(count)

    def _poll_start(self, n_jobs: int) -> bool:
        """Spawn Ray's workers once a background start is done; True while it is not."""
        if self._ray_slots or self.options.local_only:
            return False
        if self._thread is not None and not self._start_done.is_set():
            return True
        self.start(n_jobs)
        return False

    def _wanted(self, n_jobs: int | None) -> int | None:
        """Worker slots asked for: the option, else this machine's cores when Ray is embedded,
        else (a cluster) None: all its CPUs; never more than ``n_jobs``."""
        wanted = self.options.workers or (os.cpu_count() or 1) if self.address is None \
            else self.options.workers
        if n_jobs is not None and wanted is not None:
            wanted = max(1, min(wanted, n_jobs))
        return wanted

    def _connect(self, n_jobs: int | None) -> None:
        self._t_start = self._t_start or time.monotonic()
        conn = connect(self.address, self._wanted(n_jobs) or 1, self.options.ship,
                       self.options.env)
        self._owned, self._reaper = conn["owned"], conn["reaper"]
        self.startup_steps["ray"] = time.monotonic() - self._t_start
        self.started = True
        import ray
        self._ray = ray
        self._cpus = conn["cpus"]
        if self._cpus < 1:
            raise FarmError(f"the Ray cluster at {self.address} has no CPUs for workers")

    def _spawn_all(self, n_jobs: int | None) -> None:
        ray, cpus = self._ray, self._cpus
        n = min(self._wanted(n_jobs) or cpus, cpus)
        opts: dict[str, Any] = dict(num_cpus=1, num_gpus=0, max_restarts=0, max_task_retries=0,
                                    max_concurrency=1)
        if self.address is not None:
            opts["scheduling_strategy"] = "SPREAD"
        self._remote = ray.remote(FarmWorker).options(**opts)
        slots = [_Slot(f"w{i}") for i in range(n)]
        self.startup_steps["spawned"] = time.monotonic() - self._t_start
        for slot in slots:
            self._spawn(slot)
        self.slots += slots
        self._ray_slots = self._planned = n

    def close(self) -> None:
        """Let every worker remove its temp directory, stop the workers, leave or stop Ray."""
        try:
            self._join_start()
        except BaseException:  # noqa: BLE001 - a failed start has nothing more to report here
            pass
        self._stop_local(CLOSE_SECONDS)
        ray = self._ray
        if ray is not None and ray.is_initialized():
            live = [s.actor for s in self.slots if s.actor is not None]
            if live:
                refs = [a.close.remote() for a in live]
                ray.wait(refs, num_returns=len(refs), timeout=CLOSE_SECONDS)
            for slot in self.slots:
                if slot.actor is not None:
                    self._kill_actor(slot)
        self.slots = []
        self._ray_slots = 0
        self._t_start = 0.0
        self.startup_steps = {}
        if self.started:
            disconnect(self._owned, self._reaper)
        elif self._reaper is not None:  # local workers only: they are stopped by now
            stop_reaper(self._reaper)
        self._reaper = None
        self.started = False
        self._release.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _spec(self) -> dict[str, Any]:
        o = self.options
        return {"compile_fn": self.compile_ref,
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
        self._took_info(slot, info)
        if not self.fatal:
            self._retire_one_local(slot)

    def _took_info(self, slot: _Slot, info: dict[str, Any]) -> None:
        """A worker is warm: check what it reported; the first one ends the start-up."""
        slot.warm_ref = None
        slot.info = info
        if slot.local is not None:
            self.early_info.append(info)
        for k, want in self.options.expect.items():
            if info.get(k) != want:
                self.fatal = (f"worker {info.get('worker', slot.name)} has {k} "
                              f"{info.get(k)!r} but the driver has {want!r}: every worker must "
                              "run the same toolchain and sources as the driver")
        if slot.waits_for is None and not self.fatal:
            slot.open_since = time.monotonic()
        if self._first_ready is None and not self.fatal:
            self._first_ready = time.monotonic()
            self.startup_seconds = self._first_ready - self._t_start
            self.startup_steps["ready"] = self.startup_seconds

    def _retire_one_local(self, ray_slot: _Slot) -> None:
        """A Ray worker is warm: one local worker stops taking jobs (one still warming up or
        idle leaves at once, else the one with the least estimated work left) and leaves when it
        has delivered what it holds. Until then the Ray worker waits for it, so no more compiles
        run at once than there are worker slots."""
        local = [s for s in self.slots if s.local is not None and not s.retiring]
        if not local:
            return

        def work_left(s: _Slot) -> float:
            return sum(b.cost * (1 - b.done / len(b.jobs)) for b in s.batches)

        slot = min(local, key=lambda s: (s.warm_ref is None and bool(s.batches), work_left(s)))
        slot.retiring = True
        if slot.warm_ref is not None or not slot.batches:
            self._drop_local(slot)
        else:
            ray_slot.waits_for = slot
            self._closed(ray_slot)  # open once the local worker has left

    def _closed(self, slot: _Slot) -> None:
        """A worker takes no more jobs (gone, replaced, waiting, or the run is over): its time
        open to jobs counts into `worker_seconds`."""
        if slot.open_since is not None:
            self.worker_seconds += time.monotonic() - slot.open_since
            slot.open_since = None

    def _drop_local(self, slot: _Slot, kill: bool = False) -> None:
        """Take a local worker out of the farm: asked to clean up and exit (reaped at close),
        or killed (a dead, hung or still-warming one)."""
        self._closed(slot)
        if slot in self.slots:
            self.slots.remove(slot)
        if slot.local is None:
            return
        if kill or slot.warm_ref is not None:
            slot.local.kill()
        else:
            try:
                slot.local.send_stop()
            except OSError:
                pass
            self._leaving.append(slot.local)
        slot.batches.clear()

    def _stop_local(self, wait: float, kill: bool = False) -> None:
        """Stop every local worker: the live ones (killed with ``kill``: nothing more they
        compile would land) and those retired earlier."""
        for slot in [s for s in self.slots if s.local is not None]:
            self._drop_local(slot, kill=kill)
        leaving, self._leaving = self._leaving, []
        deadline = time.monotonic() + wait
        for worker in leaving:
            worker.stop(max(0.0, deadline - time.monotonic()))

    def _stop_workers(self) -> None:
        """Kill every worker (after letting it clean up) and wait until each is really gone."""
        self._stop_local(CLOSE_SECONDS, kill=True)
        ray = self._ray
        live = [s.actor for s in self.slots if s.actor is not None]
        for slot in self.slots:
            slot.batches.clear()
            self._closed(slot)
        if not live:
            return
        ray.wait([a.close.remote() for a in live], num_returns=len(live), timeout=CLOSE_SECONDS)
        probes = []
        for slot in self.slots:
            if slot.actor is not None and self._kill_actor(slot):
                probes.append(slot.actor.ping.remote())
        for slot in self.slots:
            slot.actor = None
        if probes:
            ray.wait(probes, num_returns=len(probes), timeout=30)

    def _restart(self, slot: _Slot) -> None:
        self.restarts += 1
        self._closed(slot)
        if slot.local is not None:  # Ray's workers take over; with no Ray, a new local one
            self._drop_local(slot, kill=True)
            if self.options.local_only:
                self._add_local(1, count=False)
            return
        if slot.actor is not None:
            self._kill_actor(slot)
        self._spawn(slot)

    def _kill_actor(self, slot: _Slot) -> bool:
        """``ray.kill`` the slot's actor; on an embedded Ray, with every process below it (the
        compiler it runs would outlive it). False when it was gone already."""
        pid = (slot.info or {}).get("pid") if self._owned and self.address is None else None
        if not isinstance(pid, int):
            pid = None
        frozen = freeze_tree(pid, with_root=False) if pid is not None else {}
        try:
            self._ray.kill(slot.actor, no_restart=True)
            return True
        except Exception:  # noqa: BLE001 - already gone
            return False
        finally:
            kill_frozen(frozen, after=pid if frozen else None)

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
        from ctbuild.cache import Store

        unique: dict[str, dict[str, Any]] = {}
        for job in jobs:
            if not isinstance(job, dict) or not isinstance(job.get("key"), str):
                raise ValueError(f"a farm job must be a dict with a str 'key', got {job!r:.200}")
            unique.setdefault(job["key"], job)
        records: dict[str, JobRecord] = {}
        result = FarmResult(address=self.address)
        with Store(self.cache_dir, readonly=False) as store:
            claims = Claims(self.cache_dir)
            try:
                todo = []
                for key, job in unique.items():
                    if store.has_compile(key):
                        records[key] = JobRecord(key, CACHED)
                        if on_record:
                            on_record(records[key])
                    else:
                        todo.append(job)
                if todo:
                    if on_start:
                        on_start(len(todo))
                    self.worker_seconds = 0.0
                    self._begin(len(todo))
                    t0 = time.monotonic()
                    for slot in self.slots:  # warm from an earlier run
                        if slot.ready and slot.waits_for is None:
                            slot.open_since = t0
                    _Run(self, store, claims, records, on_record, on_tick, on_ready).loop(todo)
                    result.startup_seconds = self.startup_seconds
                    result.startup_steps = {k: round(v, 3) for k, v in self.startup_steps.items()}
                    result.run_seconds = time.monotonic() - (self._first_ready or t0)
                    for slot in self.slots:
                        self._closed(slot)
                    result.worker_seconds = self.worker_seconds
                    result.workers = self._ray_slots
                    result.early_workers = self.early_workers
                    result.local_only = self.options.local_only
                    result.worker_info = self.early_info + [
                        s.info for s in self.slots if s.info and s.local is None]
            finally:
                claims.close()
            for key, rec in records.items():  # never report what did not land
                if rec.status != FAILED and not store.has_compile(key):
                    records[key] = JobRecord(key, FAILED, rec.seconds, "reported built but not "
                                             "found in the cache afterwards", "NotInCache",
                                             rec.attempts, rec.worker)
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


class _Run:
    """One `Farm.run`'s dispatch loop and the bookkeeping it shares."""

    def __init__(self, farm: Farm, store: Any, claims: Claims, records: dict[str, JobRecord],
                 on_record: Callable[[JobRecord], None] | None,
                 on_tick: Callable[[], None] | None, on_ready: Callable[[], None] | None) -> None:
        self.farm, self.store, self.claims, self.records = farm, store, claims, records
        self.on_record, self.on_tick, self.on_ready = on_record, on_tick, on_ready
        self.pending: deque = deque()
        self.deferred: list[dict[str, Any]] = []   # claimed by another build
        self.attempts: dict[str, int] = {}
        self.began: dict[str, float] = {}   # key -> when its worker started it (monotonic)
        self.cost: dict[str, float] = {}
        self.left_cost = 0.0

    # -- outcomes --
    def finish(self, job: dict[str, Any], status: str, *, seconds: float = 0.0,
               error: str | None = None, error_type: str | None = None,
               worker: str | None = None) -> None:
        key = job["key"]
        self.claims.release(key)
        rec = JobRecord(key, status, seconds, error, error_type, self.attempts.get(key, 0), worker)
        began, origin = self.began.pop(key, None), self.farm._first_ready
        if began is not None and origin is not None:  # when it ran, as the driver saw it
            rec.started = round(max(0.0, began - origin), 3)
            rec.finished = round(time.monotonic() - origin, 3)
        self.records[key] = rec
        if self.on_record:
            self.on_record(rec)

    def land(self, job: dict[str, Any], rec: dict[str, Any]) -> None:
        """Check the CUBIN that came back, store it, read it back; only then is it compiled."""
        from ctbuild.cache.digest import digest_of
        key, worker, seconds = job["key"], rec.get("worker"), rec.get("seconds", 0.0)
        cubin = rec.get("cubin")
        if not isinstance(cubin, bytes) or digest_of(cubin) != rec.get("digest"):
            self.finish(job, FAILED, seconds=seconds, worker=worker, error_type="BadTransfer",
                        error="the CUBIN that came back does not match the digest the worker "
                              "computed; not stored")
            return
        try:
            self.store.put_compile(key, cubin, symbol=rec["symbol"], meta=rec.get("meta") or {})
            hit = self.store.get_compile(key)
        except Exception as exc:  # noqa: BLE001 - a cache that cannot be written stops the build
            where = self.farm.cache_dir
            why = (f"the disk holding the cache {where} is full" if _disk_full(exc)
                   else f"cannot write to the cache {where}: {type(exc).__name__}: {exc}")
            self.farm.fatal = (f"{why}; stopped (every CUBIN stored before this one is kept); "
                               "free space or use another --cache, then run again")
            self.finish(job, FAILED, seconds=seconds, worker=worker, error_type="CacheWriteError",
                        error=why)
            return
        if hit is None or hit.meta.get("digest") != rec["digest"]:
            self.finish(job, FAILED, seconds=seconds, worker=worker, error_type="NotStored",
                        error="the CUBIN did not read back from the cache after storing it")
            return
        self.finish(job, COMPILED, seconds=seconds, worker=worker)
        learn = self.farm.options.learn
        if learn is not None and learn(job, seconds):
            self.rerank()

    def rerank(self) -> None:
        """Estimate the jobs not handed out yet (again), longest first."""
        estimate = self.farm.options.estimate or (lambda job: 1.0)
        for job in (*self.pending, *self.deferred):
            self.cost[job["key"]] = max(0.0, float(estimate(job)))
        self.pending = deque(sorted(self.pending, key=lambda j: -self.cost[j["key"]]))
        self.left_cost = sum(self.cost[j["key"]] for j in (*self.pending, *self.deferred))

    # -- dispatch --
    def take(self) -> dict[str, Any] | None:
        """The next job this build may compile now (claimed), or None."""
        while self.pending:
            job = self.pending.popleft()
            key = job["key"]
            if key in self.records:
                continue
            if not self.claims.claim(key):
                self.deferred.append(job)
                continue
            if self.store.has_compile(key):  # another build stored it since we planned
                self.finish(job, CACHED)
                continue
            return job
        return None

    def recheck_deferred(self) -> None:
        """Jobs another build claimed: cached once it stored them; ours if it let go."""
        still = []
        for job in self.deferred:
            if self.store.has_compile(job["key"]):
                self.finish(job, CACHED)
            elif self.claims.claim(job["key"]):
                self.pending.append(job)
            else:
                still.append(job)
        self.deferred = still

    def submit(self, slot: _Slot) -> None:
        # batches are sized for the slots the build will have, local workers meanwhile or not
        o, n_slots = self.farm.options, max(len(self.farm.slots), self.farm._planned)
        if slot.retiring:
            return
        if slot.waits_for is not None:
            if slot.waits_for in self.farm.slots:
                return
            slot.waits_for = None
            slot.open_since = time.monotonic()
        # A second batch queued behind a running one keeps a worker busy between batches, but
        # at the tail it would hold jobs that an idle worker could start now: prefetch only
        # while every slot can still get a full queue. A local worker gets one batch at a
        # time, so it can leave soon after a Ray worker is there to replace it.
        depth = QUEUE_DEPTH if len(self.pending) >= n_slots * QUEUE_DEPTH and \
            slot.local is None else 1
        while slot.ready and len(slot.batches) < depth:
            target = self.left_cost / (n_slots * 4)
            if slot.batches and (slot.batches[-1].cost > target or (
                    self.pending and self.cost[self.pending[0]["key"]] > target)):
                return  # nothing queues behind a long batch, no long job behind another
            batch: list[dict[str, Any]] = []
            size = 0.0
            while len(batch) < o.max_batch and (not batch or size < target):
                job = self.take()
                if job is None:
                    break
                batch.append(job)
                size += self.cost[job["key"]]
            if not batch:
                return
            self.left_cost = max(0.0, self.left_cost - size)
            if slot.local is not None:
                gen = None
                try:
                    slot.local.send(batch, o.compile_timeout)
                except OSError:  # it died: found out (and the batch re-queued) on its receive
                    pass
            else:
                gen = slot.actor.run_batch.options(num_returns="streaming").remote(
                    batch, o.compile_timeout)
            if not slot.batches:
                slot.since = time.monotonic()
            slot.batches.append(_Batch(batch, gen, size))

    def requeue(self, slot: _Slot, blame: str | None, why: str) -> None:
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
        self.pending.extendleft(reversed(rest))
        self.left_cost += sum(self.cost[j["key"]] for j in rest)
        if current is not None:
            key = current["key"]
            self.attempts[key] = self.attempts.get(key, 0) + 1
            worker = (slot.info or {}).get("worker", slot.name)
            self.began[key] = slot.since
            if blame == "Timeout":
                self.finish(current, FAILED, error=why, error_type="Timeout", worker=worker)
            elif self.attempts[key] > self.farm.options.max_retries:
                self.finish(current, FAILED, error_type="WorkerDied", worker=worker,
                            error=f"worker died while compiling this job, {self.attempts[key]} "
                                  f"times (retries exhausted); last: {why}")
            else:
                self.pending.appendleft(current)
                self.left_cost += self.cost[key]
        self.farm._restart(slot)

    def loop(self, todo: list[dict[str, Any]]) -> None:
        farm, o = self.farm, self.farm.options
        # Longest first: the finish time nears max(total / workers, longest job).
        self.pending = deque(todo)
        self.rerank()
        limit = farm._limit()
        deadline = time.monotonic() + o.startup_timeout
        while (self.pending or self.deferred or any(s.batches for s in farm.slots)) \
                and not farm.fatal:
            ray_starting = farm._poll_start(len(todo))
            if self.deferred:
                self.recheck_deferred()
            for slot in list(farm.slots):
                self.submit(slot)
            waiting: dict[Any, tuple[_Slot, str]] = {}
            local: dict[Any, _Slot] = {}
            for s in farm.slots:
                if s.local is not None:
                    if s.warm_ref is not None or s.batches:
                        local[s.local.conn] = s
                elif s.warm_ref is not None:
                    waiting[s.warm_ref] = (s, "warm")
                elif s.batches:
                    waiting[s.batches[0].gen] = (s, "batch")
            if farm._first_ready is None and time.monotonic() > deadline:
                raise FarmError(
                    f"no worker was ready within {o.startup_timeout:.0f}s (are the nodes busy, "
                    "or is the runtime_env failing to install?)")
            if not waiting and not local and not ray_starting:
                if not self.pending:  # done, or only jobs another build is on: wait for those
                    if self.deferred:
                        time.sleep(TICK_SECONDS)
                        if self.on_tick:
                            self.on_tick()
                    continue
                raise FarmError("no live worker and jobs left (internal error)")
            now = time.monotonic()
            timeout = TICK_SECONDS
            if limit is not None:
                for s in farm.slots:
                    if s.batches:
                        timeout = min(timeout, s.since + limit - now)
            if local or ray_starting:  # more than Ray's objects to watch: poll in turns
                timeout = min(timeout, POLL_SECONDS)
            got = self.wait_any(waiting, local, max(0.0, timeout))
            if limit is not None:
                now = time.monotonic()
                for slot in list(farm.slots):
                    if slot.batches and now - slot.since > limit:
                        self.requeue(slot, "Timeout",
                                     f"no result after {limit:.0f}s (compile timeout "
                                     f"{o.compile_timeout:g}s plus grace): the compile hung; its "
                                     "worker was killed and replaced")
            if self.on_tick and not got:
                self.on_tick()
        if farm.fatal:
            left = list(self.pending) + self.deferred + [
                j for s in farm.slots for i, b in enumerate(s.batches)
                for j in (b.jobs[b.done:] if i == 0 else b.jobs)]
            farm._stop_workers()  # the driver is the only writer: nothing more will land
            for job in left:
                if job["key"] not in self.records:
                    self.finish(job, FAILED, error_type="Aborted",
                                error=f"not built: the build was aborted: {farm.fatal}")

    def wait_any(self, waiting: dict[Any, tuple[_Slot, str]], local: dict[Any, _Slot],
                 timeout: float) -> bool:
        """Receive from whichever workers are ready (Ray's, local ones), waiting at most
        ``timeout`` seconds; whether anything came."""
        if local:
            got = connection_wait(list(local), timeout=0 if waiting else timeout)
            for conn in got:
                self.receive_local(local[conn])
            if got or not waiting:
                return bool(got)
        if waiting:
            ready, _ = self.farm._ray.wait(list(waiting), num_returns=1, timeout=timeout)
            for obj in ready:
                self.receive(*waiting[obj])
            return bool(ready)
        self.farm._start_done.wait(timeout)  # nothing to hear from until Ray is up
        return False

    def warmed(self, slot: _Slot, info: dict[str, Any] | None = None) -> None:
        """A worker is warm (a Ray worker's info is fetched, a local one's given)."""
        first = self.farm._first_ready is None
        if info is None:
            self.farm._warmed(slot)
        else:
            self.farm._took_info(slot, info)
        if self.farm.fatal:  # a worker that cannot set up or differs: the farm cannot run
            raise FarmError(self.farm.fatal)
        if first and self.farm._first_ready is not None and self.on_ready:
            self.on_ready()

    def receive_local(self, slot: _Slot) -> None:
        """The next message of a local worker: warm, a record, a batch's end, or its death."""
        assert slot.local is not None
        try:
            kind, payload = slot.local.recv()
        except (EOFError, OSError):
            if slot.warm_ref is not None:  # died setting up: Ray's workers will do its work
                self.farm._drop_local(slot, kill=True)
                if self.farm.options.local_only:  # ... but there is no Ray
                    self.farm.fatal = (f"local worker {slot.name} exited while setting up "
                                       f"(code {slot.local.proc.poll()})")
                    raise FarmError(self.farm.fatal) from None
            else:
                self.requeue(slot, None, "the local worker process exited "
                                         f"(code {slot.local.proc.poll()})")
            return
        if kind == WARM:
            self.warmed(slot, payload)
        elif kind == FAILED_SETUP:
            self.farm.fatal = f"worker {slot.name} could not set up: {payload}"
            raise FarmError(self.farm.fatal)
        elif kind == RECORD:
            self.record(slot, slot.batches[0], payload)
        elif kind == END:
            slot.batches.popleft()
            slot.since = time.monotonic()
            if slot.retiring and not slot.batches:
                self.farm._drop_local(slot)

    def receive(self, slot: _Slot, what: str) -> None:
        ray = self.farm._ray
        if what == "warm":
            self.warmed(slot)
            return
        batch = slot.batches[0]
        try:
            ref = next(batch.gen)
        except StopIteration:
            slot.batches.popleft()
            slot.since = time.monotonic()
            return
        except ray.exceptions.RayError as exc:
            self.requeue(slot, None, _cause(exc))
            return
        try:
            rec = ray.get(ref)
        except ray.exceptions.RayError as exc:  # died, or the generator itself raised
            self.requeue(slot, None, _cause(exc))
            return
        self.record(slot, batch, rec)

    def record(self, slot: _Slot, batch: _Batch, rec: dict[str, Any]) -> None:
        """A job's record from the worker of ``slot``: land it or record its failure."""
        job = batch.jobs[batch.done]
        batch.done += 1
        self.began[job["key"]], slot.since = slot.since, time.monotonic()
        self.attempts[job["key"]] = self.attempts.get(job["key"], 0) + 1
        if rec["status"] == COMPILED:
            self.land(job, rec)
            return
        if rec.get("fatal"):
            self.farm.fatal = rec.get("error") or rec.get("error_type") or "fatal error"
        self.finish(job, rec["status"], seconds=rec.get("seconds", 0.0), error=rec.get("error"),
                    error_type=rec.get("error_type"), worker=rec.get("worker"))


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
