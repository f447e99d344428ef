"""The farm's workers: start or join Ray, start workers, replace lost ones, stop them all.

Start-up: with an embedded Ray started in the background (`Farm.start_in_background`), a few
local worker processes (`ctbuild.farm.local_workers`) compile from the first job on while Ray comes up;
each Ray worker that warms up retires one of them (it finishes what it holds, then leaves; the
Ray worker waits for it, so no more compiles run at once than there are worker slots). With
``local_only`` there is no Ray: one local worker per slot, and a lost one is replaced by a new
one. A lost Ray worker gets a new actor in its slot.
"""
from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .cluster import start_reaper, stop_reaper
from .local_workers import LocalWorker
from .options import FarmOptions, default_early_workers
from .ray_start import RayStart
from .ray_workers import RayWorker, actor_class
from .scheduler import Batch
from .worker import callable_ref
from .worker_handle import WorkerHandle, by_kind

#: Seconds a closing worker gets to remove its temp directory before it is killed.
CLOSE_SECONDS = 5.0


@dataclass(eq=False)  # slots are compared by identity
class Slot:
    """One worker slot: its worker (replaced when lost) and the batches it holds."""
    name: str
    worker: WorkerHandle
    batches: deque[Batch] = field(default_factory=deque)
    since: float = 0.0   # when the job the worker is on (as far as we know) started
    retiring: bool = False  # a local worker a Ray worker replaces: no more batches
    waits_for: Slot | None = None  # the local worker this Ray worker replaces, until it left
    open_since: float | None = None  # when it could first take jobs (None: not yet, or gone)

    @property
    def ready(self) -> bool:
        return self.worker.ready

    @property
    def current(self) -> dict[str, Any] | None:
        """The job its worker is on (since `since`), or None. A worker runs its batches one
        after another, so that is the first without a record: possibly in the second batch,
        when the first has delivered all its records but its end has not been seen yet."""
        return next((b.jobs[b.done] for b in self.batches if b.done < len(b.jobs)), None)


class WorkerPool:
    """The worker slots of one farm, and the Ray they run on (`RayStart`)."""

    def __init__(self, options: FarmOptions, address: str | None,
                 compile_ref: str | bytes | None) -> None:
        self.options, self.address, self.compile_ref = options, address, compile_ref
        self.ray = RayStart(address, options)
        self.slots: list[Slot] = []
        self.startup_seconds = 0.0
        #: Where the start-up went, seconds after it began: Ray up (``ray``), workers spawned
        #: (``spawned``: once the caller has planned), the first one warm (``ready``), local
        #: workers started (``early``).
        self.startup_steps: dict[str, float] = {}
        self.restarts = 0
        #: Seconds workers could take jobs, summed over workers (`FarmResult.worker_seconds`).
        self.worker_seconds = 0.0
        self.t_start = 0.0                    # time.monotonic() when the start-up began
        self.first_ready: float | None = None  # time.monotonic() when the first was warm
        self.ray_slots = 0                    # Ray workers spawned (0: not yet)
        self.planned = 0                      # worker slots this run is to have
        self.early_workers = 0                # local workers started while Ray started
        self.early_info: list[dict[str, Any]] = []  # what each of them reported when warm
        self.local_reaper: int | None = None  # the watchdog of a farm without Ray
        self._leaving: list[WorkerHandle] = []  # retired local workers, reaped at close
        self._local_seq = 0                   # names local workers uniquely (e0, e1, ...)
        self._actor_cls: Any = None

    @property
    def started(self) -> bool:
        """Whether Ray is up (started or joined)."""
        return self.ray.started

    @property
    def ray_requested(self) -> bool:
        """Whether Ray is started, starting or joined."""
        return self.ray.requested

    @property
    def reaper(self) -> int | None:
        """The watchdog that stops what this farm started if the driver is SIGKILLed."""
        return self.ray.reaper if self.ray.reaper is not None else self.local_reaper

    # ---- start-up --------------------------------------------------------------------------
    def start_in_background(self) -> None:
        if self.ray.requested:
            return
        self.t_start = time.monotonic()
        self.ray.in_background(self.wanted(None) or 1)

    def start(self, n_jobs: int | None = None) -> None:
        """Start or join Ray (unless a background start did) and spawn its workers."""
        self.ray.join()
        if not self.ray.started:
            self.t_start = self.t_start or time.monotonic()
            self.ray.connect(self.wanted(n_jobs) or 1)
        self.startup_steps["ray"] = self.ray.up_at - self.t_start
        if not self.ray_slots:
            self._spawn_all(n_jobs)

    def wanted(self, n_jobs: int | None) -> int | None:
        """Worker slots asked for: the option, else this machine's cores when Ray is embedded,
        else (a cluster) None: all its CPUs; never more than ``n_jobs``."""
        wanted = self.options.workers or (os.cpu_count() or 1) if self.address is None \
            else self.options.workers
        if n_jobs is not None and wanted is not None:
            wanted = max(1, min(wanted, n_jobs))
        return wanted

    def begin(self, n_jobs: int) -> float:
        """Get workers going for a run of ``n_jobs`` jobs: local ones while an embedded Ray is
        still starting in the background (Ray's follow from `poll_start`), else Ray's now.
        Returns when the run began."""
        self.worker_seconds = 0.0
        self._get_workers(n_jobs)
        began = time.monotonic()
        for slot in self.slots:  # warm from an earlier run
            if slot.ready and slot.waits_for is None:
                slot.open_since = began
        return began

    def _get_workers(self, n_jobs: int) -> None:
        wanted = self.wanted(n_jobs) or 1
        self.planned = wanted
        self.early_workers, self.early_info = 0, []
        if self.options.local_only:  # no Ray at all: one local worker per slot
            self.t_start = time.monotonic()
            if self.reaper is None:  # a SIGKILLed driver takes its workers (and tileiras) along
                self.local_reaper = start_reaper()
            self._add_local(wanted)
            return
        early = self.options.early_workers
        early = default_early_workers(wanted) if early is None else min(early, wanted)
        if not (self.ray.starting and self.address is None and early > 0):
            self.start(n_jobs)
            return
        self.startup_steps["early"] = time.monotonic() - self.t_start
        self._add_local(early)

    def poll_start(self, n_jobs: int) -> bool:
        """Spawn Ray's workers once a background start is done; True while it is not."""
        if self.ray_slots or self.options.local_only:
            return False
        if self.ray.starting:
            return True
        self.start(n_jobs)
        return False

    def wait_for_start(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a background start (no worker to hear from yet)."""
        self.ray.wait(timeout)

    def _spec(self) -> dict[str, Any]:
        """What every worker is set up with (`ctbuild.farm.worker.FarmWorker`)."""
        o = self.options
        return {"compile_fn": self.compile_ref,
                "setup_fn": callable_ref(o.setup_fn), "setup_args": list(o.setup_args),
                "sys_paths": [str(p) for p in o.sys_paths] if self.address is None else [],
                "fatal_errors": list(o.fatal_errors), "env": dict(o.env),
                "strip_env": list(o.strip_env)}

    def _add_local(self, n: int, count: bool = True) -> None:
        """Start ``n`` local worker processes (fewer where the system refuses more: then Ray's
        workers, or the local ones that did start, do the work)."""
        spec = self._spec()
        for _ in range(n):
            name = f"e{self._local_seq}"
            self._local_seq += 1
            try:
                worker = LocalWorker(name, spec)
            except OSError:
                break
            self.slots.append(Slot(name, worker))
            self.early_workers += int(count)

    def _spawn_all(self, n_jobs: int | None) -> None:
        n = min(self.wanted(n_jobs) or self.ray.cpus, self.ray.cpus)
        self._actor_cls = actor_class(spread=self.address is not None)
        self.startup_steps["spawned"] = time.monotonic() - self.t_start
        self.slots += [Slot(f"w{i}", self._spawn_ray(f"w{i}")) for i in range(n)]
        self.ray_slots = self.planned = n

    def _spawn_ray(self, name: str) -> RayWorker:
        # on our own embedded Ray, a kill takes the compiler below the actor along
        kill_tree = self.ray.owned and self.address is None
        return RayWorker(name, self._actor_cls, self._spec(), kill_tree)

    # ---- while running ---------------------------------------------------------------------
    def warmed(self, slot: Slot, info: dict[str, Any]) -> str | None:
        """A worker is warm: check what it reported (the problem, if it differs from
        ``expect``); the first one ends the start-up; a Ray worker retires a local one."""
        if slot.worker.local:
            self.early_info.append(info)
        problem = None
        for k, want in self.options.expect.items():
            if info.get(k) != want:
                problem = (f"worker {info.get('worker', slot.name)} has {k} "
                           f"{info.get(k)!r} but the driver has {want!r}: every worker must "
                           "run the same toolchain and sources as the driver")
        if problem is not None:
            return problem
        if slot.waits_for is None:
            slot.open_since = time.monotonic()
        if self.first_ready is None:
            self.first_ready = time.monotonic()
            self.startup_seconds = self.first_ready - self.t_start
            self.startup_steps["ready"] = self.startup_seconds
        if not slot.worker.local:
            self._retire_one_local(slot)
        return None

    def _retire_one_local(self, ray_slot: Slot) -> None:
        """A Ray worker is warm: one local worker stops taking jobs (one still warming up or
        idle leaves at once, else the one with the least estimated work left) and leaves when it
        has delivered what it holds. Until then the Ray worker waits for it, so no more compiles
        run at once than there are worker slots."""
        local = [s for s in self.slots if s.worker.local and not s.retiring]
        if not local:
            return
        slot = min(local, key=lambda s: (s.worker.warm and bool(s.batches),
                                         sum(b.work_left for b in s.batches)))
        slot.retiring = True
        if not slot.worker.warm or not slot.batches:
            self.drop(slot)
        else:
            ray_slot.waits_for = slot
            self._closed(ray_slot)  # open once the local worker has left

    def open_for_jobs(self, slot: Slot) -> bool:
        """Whether the slot may get batches: not retiring, and not waiting any more for the
        local worker it replaces (it opens when that one has left)."""
        if slot.retiring:
            return False
        if slot.waits_for is not None:
            if slot.waits_for in self.slots:
                return False
            slot.waits_for = None
            slot.open_since = time.monotonic()
        return True

    def _closed(self, slot: Slot) -> None:
        """A worker takes no more jobs (gone, replaced, waiting, or the run is over): its time
        open to jobs counts into `worker_seconds`."""
        if slot.open_since is not None:
            self.worker_seconds += time.monotonic() - slot.open_since
            slot.open_since = None

    def drop(self, slot: Slot, kill: bool = False) -> None:
        """Take a worker out of the farm: asked to clean up and leave (reaped at close), or
        killed (a dead, hung or still-warming one)."""
        self._closed(slot)
        if slot in self.slots:
            self.slots.remove(slot)
        if kill or not slot.worker.warm:
            slot.worker.kill()
        else:
            slot.worker.leave()
            self._leaving.append(slot.worker)
        slot.batches.clear()

    def replace(self, slot: Slot) -> None:
        """The slot's worker is lost: a Ray slot gets a new actor; a local worker's jobs go to
        Ray's workers, or with no Ray, to a new local worker."""
        self.restarts += 1
        self._closed(slot)
        if slot.worker.local:
            self.drop(slot, kill=True)
            if self.options.local_only:
                self._add_local(1, count=False)
            return
        slot.worker.kill()
        slot.worker = self._spawn_ray(slot.name)
        slot.batches.clear()

    def end_run(self) -> None:
        for slot in self.slots:
            self._closed(slot)

    def worker_info(self) -> list[dict[str, Any]]:
        """What each worker reported when warm: the local ones, then Ray's."""
        return self.early_info + [s.worker.info for s in self.slots
                                  if s.worker.info and not s.worker.local]

    # ---- stopping --------------------------------------------------------------------------
    def stop_workers(self, abort: bool = True) -> None:
        """Stop every worker, letting each remove its temp directory; ``abort``: the build
        stopped (the driver is the only writer: nothing more will land), so the ones on a job
        are killed now."""
        for slot in self.slots:
            slot.batches.clear()
            self._closed(slot)
        workers = [s.worker for s in self.slots] + self._leaving
        self._leaving = []
        for kind, group in by_kind(workers):
            kind.stop_all(group, CLOSE_SECONDS, abort)

    def close(self) -> None:
        """Let every worker remove its temp directory, stop the workers, leave or stop Ray."""
        try:
            self.ray.join()
        except BaseException:  # noqa: BLE001 - a failed start has nothing more to report here
            pass
        self.stop_workers(abort=False)
        self.slots = []
        self.ray_slots = 0
        self.t_start = 0.0
        self.startup_steps = {}
        if self.local_reaper is not None:  # local workers only: they are stopped by now
            stop_reaper(self.local_reaper)
            self.local_reaper = None
        self.ray.stop()
