"""The driver: hands batches to the workers, takes each job's record back, and alone writes the
cache.

Workers send each CUBIN back with its digest; the driver checks the digest, stores the entry,
reads it back, and only then counts the job as compiled. Nothing needs a shared filesystem, and
a killed build keeps every entry stored before it died. Records come back one per job, so the
driver knows which job each worker is on:

* a worker process that dies (segfault, os._exit, OOM kill) -> the job it was on is retried on
  another worker, up to ``max_retries`` times, then recorded as failed ("WorkerDied"); the
  jobs queued behind it are re-queued without counting an attempt; the slot gets a new worker;
* no record for ``compile_timeout + grace`` seconds -> the job is recorded as failed
  ("Timeout"), the worker is killed and replaced (a Python-level hang; a hung tileiras is
  stopped earlier by the worker's own compiler timeout and reported as a compile error);
* an error whose class is named in ``fatal_errors`` (e.g. a toolchain mismatch), a worker that
  cannot set up, a worker whose probed info differs from ``expect``, or a cache that cannot be
  written (a full disk) -> the build stops: nothing else would land correctly either.

What goes out when is the scheduler's (`ctbuild.farm.scheduler`); the workers are the pool's
(`ctbuild.farm.pool`).
"""
from __future__ import annotations

import errno
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from .claims import Claims
from .options import FarmOptions
from .pool import Slot, WorkerPool
from .records import CACHED, COMPILED, FAILED, FarmError, JobRecord
from .scheduler import Scheduler
from .worker_handle import BATCH_END, RECORD, SETUP_FAILED, WARM, ready_workers

#: How often (s) the driver wakes up with nothing finished, for progress ticks and deadlines.
TICK_SECONDS = 0.5
#: How often (s) the driver looks at local workers and at Ray's start while both may answer.
POLL_SECONDS = 0.02


@dataclass
class Hooks:
    """What the caller of `Farm.run` is told as the run goes (see there)."""
    on_record: Callable[[JobRecord], None] | None = None
    on_tick: Callable[[], None] | None = None
    on_ready: Callable[[], None] | None = None


def disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(exc, sqlite3.OperationalError) and "full" in str(exc).lower()


class Driver:
    """One run of the farm: its records, the cache it writes, the loop that feeds the workers.
    ``fatal``: why the farm stopped (carried over from an earlier run of the same farm)."""

    store: Any            # the cache, open for writing during `session`
    claims: Claims        # this build's claims, during `session`
    scheduler: Scheduler  # the jobs not handed out, during `run`

    def __init__(self, pool: WorkerPool, cache_dir: str, options: FarmOptions, hooks: Hooks,
                 fatal: str | None = None) -> None:
        self.pool, self.cache_dir, self.options, self.hooks = pool, cache_dir, options, hooks
        self.fatal = fatal
        self.records: dict[str, JobRecord] = {}
        self.attempts: dict[str, int] = {}
        self.began: dict[str, float] = {}   # key -> when its worker started it (monotonic)
        self.next_look = 0.0   # when to tell ``options.running`` of the running jobs next

    # ---- the cache -------------------------------------------------------------------------
    @contextmanager
    def session(self) -> Iterator[None]:
        """The cache open for writing and this build's claims, for one run; at its end every
        job counted as compiled or cached is checked in the cache."""
        from ctbuild.cache import Store
        with Store(self.cache_dir, readonly=False) as store:
            self.store = store
            self.claims = Claims(self.cache_dir)
            try:
                yield
            finally:
                self.claims.close()
            self._check_landed()

    def _check_landed(self) -> None:
        """Never report what did not land."""
        for key, rec in self.records.items():
            if rec.status != FAILED and not self.store.has_compile(key):
                self.records[key] = JobRecord(key, FAILED, rec.seconds, "reported built but not "
                                              "found in the cache afterwards", "NotInCache",
                                              rec.attempts, rec.worker)

    def skip_cached(self, jobs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Record the jobs the cache holds already (as cached); the others, to compile."""
        todo = []
        for job in jobs:
            if self.store.has_compile(job["key"]):
                self._record(JobRecord(job["key"], CACHED))
            else:
                todo.append(job)
        return todo

    def _record(self, rec: JobRecord) -> None:
        self.records[rec.key] = rec
        if self.hooks.on_record:
            self.hooks.on_record(rec)

    def finish(self, job: dict[str, Any], status: str, *, seconds: float = 0.0,
               error: str | None = None, error_type: str | None = None,
               worker: str | None = None) -> None:
        """A job's outcome: its claim goes, its record says when it ran (as the driver saw it,
        from the first worker ready)."""
        key = job["key"]
        self.claims.release(key)
        rec = JobRecord(key, status, seconds, error, error_type, self.attempts.get(key, 0), worker)
        began, origin = self.began.pop(key, None), self.pool.first_ready
        if began is not None and origin is not None:
            rec.started = round(max(0.0, began - origin), 3)
            rec.finished = round(time.monotonic() - origin, 3)
        self._record(rec)

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
            where = self.cache_dir
            why = (f"the disk holding the cache {where} is full" if disk_full(exc)
                   else f"cannot write to the cache {where}: {type(exc).__name__}: {exc}")
            self.fatal = (f"{why}; stopped (every CUBIN stored before this one is kept); "
                          "free space or use another --cache, then run again")
            self.finish(job, FAILED, seconds=seconds, worker=worker, error_type="CacheWriteError",
                        error=why)
            return
        if hit is None or hit.meta.get("digest") != rec["digest"]:
            self.finish(job, FAILED, seconds=seconds, worker=worker, error_type="NotStored",
                        error="the CUBIN did not read back from the cache after storing it")
            return
        self.finish(job, COMPILED, seconds=seconds, worker=worker)
        learn = self.options.learn
        if learn is not None and learn(job, seconds):
            self.scheduler.rerank()

    # ---- the loop --------------------------------------------------------------------------
    def run(self, todo: list[dict[str, Any]]) -> None:
        """Compile ``todo`` (none of it cached): until every job has a record, or the build
        stopped (then the jobs left are recorded as aborted)."""
        self.scheduler = Scheduler(
            todo, self.claims, self.store.has_compile, lambda job: self.finish(job, CACHED),
            self.records, self.options.max_batch, self.options.estimate)
        deadline = time.monotonic() + self.options.startup_timeout
        while self._busy() and not self.fatal:
            self._turn(len(todo), deadline)
        if self.fatal:
            self._abort()

    def _busy(self) -> bool:
        return bool(self.scheduler.pending or self.scheduler.deferred
                    or any(s.batches for s in self.pool.slots))

    def _turn(self, n_jobs: int, deadline: float) -> None:
        """Hand out batches, wait a little for any worker to say something, cut off hangs."""
        ray_starting = self.pool.poll_start(n_jobs)
        if self.scheduler.deferred:
            self.scheduler.recheck_deferred()
        for slot in list(self.pool.slots):
            self._submit(slot)
        watched = [s for s in self.pool.slots if s.worker.waitable() is not None]
        if self.pool.first_ready is None and time.monotonic() > deadline:
            raise FarmError(
                f"no worker was ready within {self.options.startup_timeout:.0f}s (are the nodes "
                "busy, or is the runtime_env failing to install?)")
        if not watched and not ray_starting:
            if self.scheduler.pending:
                raise FarmError("no live worker and jobs left (internal error)")
            if self.scheduler.deferred:  # only jobs another build is on: wait for those
                time.sleep(TICK_SECONDS)
                if self.hooks.on_tick:
                    self.hooks.on_tick()
            return
        # more than Ray's objects to watch: poll in turns
        poll = ray_starting or any(s.worker.local for s in watched)
        got = self._receive_any(watched, self._wait_seconds(poll))
        self._cut_off_hung()
        self._tell_running()
        if self.hooks.on_tick and not got:
            self.hooks.on_tick()

    def _wait_seconds(self, poll: bool) -> float:
        """How long to wait for a worker: until the next tick, a record's deadline, or the
        next poll."""
        timeout = TICK_SECONDS
        limit = self.options.record_deadline()
        if limit is not None:
            now = time.monotonic()
            for s in self.pool.slots:
                if s.batches:
                    timeout = min(timeout, s.since + limit - now)
        if poll:
            timeout = min(timeout, POLL_SECONDS)
        return max(0.0, timeout)

    def _cut_off_hung(self) -> None:
        limit = self.options.record_deadline()
        if limit is None:
            return
        now = time.monotonic()
        for slot in list(self.pool.slots):
            if slot.batches and now - slot.since > limit:
                self._requeue(slot, "Timeout",
                              f"no result after {limit:.0f}s (compile timeout "
                              f"{self.options.compile_timeout:g}s plus grace): the compile hung; "
                              "its worker was killed and replaced")

    def _tell_running(self) -> None:
        """A job still running is evidence too (a kernel far slower than guessed): once a tick,
        tell ``options.running`` how long each worker's job has run, and re-rank the jobs not
        handed out when it says estimates moved, so a slow kernel's other long configs go to the
        next free worker rather than after its first job ends."""
        running, now = self.options.running, time.monotonic()
        if running is None or now < self.next_look:
            return
        self.next_look = now + TICK_SECONDS
        moved = [running(job, now - slot.since) for slot in self.pool.slots
                 if (job := slot.current) is not None]
        if any(moved):
            self.scheduler.rerank()

    def _submit(self, slot: Slot) -> None:
        """Give the slot's worker what the scheduler says it may hold now."""
        # batches are sized for the slots the build will have, local workers meanwhile or not
        n_slots = max(len(self.pool.slots), self.pool.planned)
        if not self.pool.open_for_jobs(slot) or not slot.ready:
            return
        for batch in self.scheduler.batches_for(slot.batches, slot.worker.local, n_slots):
            slot.worker.send(batch.jobs, self.options.compile_timeout)
            if not slot.batches:
                slot.since = time.monotonic()
            slot.batches.append(batch)

    def _abort(self) -> None:
        """The build stopped: stop every worker, record every job left as aborted."""
        left = self.scheduler.unsent() + [
            j for s in self.pool.slots for i, b in enumerate(s.batches)
            for j in (b.jobs[b.done:] if i == 0 else b.jobs)]
        self.pool.stop_workers(abort=True)  # the driver is the only writer: nothing more lands
        for job in left:
            if job["key"] not in self.records:
                self.finish(job, FAILED, error_type="Aborted",
                            error=f"not built: the build was aborted: {self.fatal}")

    # ---- what workers say ------------------------------------------------------------------
    def _receive_any(self, watched: list[Slot], timeout: float) -> bool:
        """Receive from whichever workers are ready, waiting at most ``timeout`` seconds;
        whether anything came."""
        if not watched:
            self.pool.wait_for_start(timeout)  # nothing to hear from until Ray is up
            return False
        slot_of = {s.worker: s for s in watched}
        ready = ready_workers(list(slot_of), timeout)
        for worker in ready:
            self._receive(slot_of[worker])
        return bool(ready)

    def _receive(self, slot: Slot) -> None:
        """The worker's next event: warm, could not set up, a record, a batch's end, or died."""
        kind, payload = slot.worker.receive()
        if kind == WARM:
            self._warmed(slot, payload)
        elif kind == SETUP_FAILED:
            self._stop(f"worker {slot.name} could not set up: {payload}")
        elif kind == RECORD:
            self._took(slot, payload)
        elif kind == BATCH_END:
            slot.batches.popleft()
            slot.since = time.monotonic()
            if slot.retiring and not slot.batches:
                self.pool.drop(slot)
        elif not slot.worker.warm:  # died setting up: the other workers do its work...
            self.pool.drop(slot, kill=True)
            if self.options.local_only:  # ... but there may be none (no Ray)
                self._stop(payload)
        else:
            self._requeue(slot, None, payload)

    def _stop(self, why: str) -> None:
        """The build cannot go on: say why."""
        self.fatal = why
        raise FarmError(why)

    def _warmed(self, slot: Slot, info: dict[str, Any]) -> None:
        first = self.pool.first_ready is None
        problem = self.pool.warmed(slot, info)
        if problem is not None:  # a worker that differs: the farm cannot run
            self._stop(problem)
        if first and self.pool.first_ready is not None and self.hooks.on_ready:
            self.hooks.on_ready()

    def _took(self, slot: Slot, rec: dict[str, Any]) -> None:
        """A job's record from the slot's worker: land it or record its failure."""
        batch = slot.batches[0]
        job = batch.jobs[batch.done]
        batch.done += 1
        self.began[job["key"]], slot.since = slot.since, time.monotonic()
        self.attempts[job["key"]] = self.attempts.get(job["key"], 0) + 1
        if rec["status"] == COMPILED:
            self.land(job, rec)
            return
        if rec.get("fatal"):
            self.fatal = rec.get("error") or rec.get("error_type") or "fatal error"
        self.finish(job, rec["status"], seconds=rec.get("seconds", 0.0), error=rec.get("error"),
                    error_type=rec.get("error_type"), worker=rec.get("worker"))

    def _requeue(self, slot: Slot, blame: str | None, why: str) -> None:
        """The slot's worker is gone: blame its current job (retry or fail), re-queue the rest,
        replace the worker."""
        current = slot.current
        rest = [j for b in slot.batches for j in b.jobs[b.done:] if j is not current]
        slot.batches.clear()
        self.scheduler.give_back(rest)
        if current is not None:
            self._blame(slot, current, blame, why)
        self.pool.replace(slot)

    def _blame(self, slot: Slot, job: dict[str, Any], blame: str | None, why: str) -> None:
        """The job a lost worker was on: failed (a hang, or out of retries), or retried first."""
        key = job["key"]
        self.attempts[key] = self.attempts.get(key, 0) + 1
        worker = (slot.worker.info or {}).get("worker", slot.name)
        self.began[key] = slot.since
        if blame == "Timeout":
            self.finish(job, FAILED, error=why, error_type="Timeout", worker=worker)
        elif self.attempts[key] > self.options.max_retries:
            self.finish(job, FAILED, error_type="WorkerDied", worker=worker,
                        error=f"worker died while compiling this job, {self.attempts[key]} "
                              f"times (retries exhausted); last: {why}")
        else:
            self.scheduler.give_back([job])
