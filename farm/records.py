"""What the farm reports: one `JobRecord` per job, and the `FarmResult` of a run."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: Job outcomes. ``cached``: the key was already in the cache (nothing compiled).
COMPILED, CACHED, FAILED = "compiled", "cached", "failed"


class FarmError(RuntimeError):
    """The farm could not run at all (Ray would not start, a worker could not set up, a worker's
    toolchain differs from the driver's): no point in trying more jobs."""


@dataclass
class JobRecord:
    """The outcome of one job. Small: no CUBIN bytes (the driver stored those in the cache)."""
    key: str
    status: str
    seconds: float = 0.0          # compile seconds measured in the worker (0 when not compiled)
    error: str | None = None      # full error text when failed
    error_type: str | None = None  # exception class name, "WorkerDied", "Timeout", "Aborted"
    attempts: int = 0             # how many times a worker started this job
    worker: str | None = None     # "host:pid" of the worker that finished it
    # seconds from the first worker ready to when the job's worker started / finished it, as
    # the driver saw it (None for jobs no worker ran): where a build's tail comes from
    started: float | None = None
    finished: float | None = None

    @property
    def ok(self) -> bool:
        return self.status != FAILED

    @property
    def first_error_line(self) -> str:
        for line in (self.error or "").splitlines():
            if line.strip():
                return line.strip()
        return ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FarmResult:
    """Every job's record (in the order the jobs were given) and how the run went."""
    records: list[JobRecord] = field(default_factory=list)
    workers: int = 0              # Ray worker slots used (0: nothing compiled on Ray)
    early_workers: int = 0        # local workers that compiled while the embedded Ray started
    local_only: bool = False      # every job ran on local workers; Ray was never started
    startup_seconds: float = 0.0  # Ray start/connect + workers imported and warm
    startup_steps: dict[str, float] = field(default_factory=dict)  # `Farm.startup_steps`
    run_seconds: float = 0.0      # first batch submitted -> last record in
    #: Seconds workers could take jobs, summed over workers: from each one's warm-up (or the
    #: local worker it replaced leaving) to its end. Jobs per worker-second compares with a
    #: warm pool whose clock starts when all its workers are warm, which ``run_seconds``
    #: (from the first warm worker) does not: the others may still be warming then.
    worker_seconds: float = 0.0
    restarts: int = 0             # workers lost to a crash or a hang (Ray's are replaced)
    fatal: str | None = None      # why the build was aborted, if it was
    worker_info: list[dict[str, Any]] = field(default_factory=list)
    address: str | None = None    # the Ray cluster joined, or None for the embedded one

    def count(self, status: str) -> int:
        return sum(1 for r in self.records if r.status == status)

    @property
    def failures(self) -> list[JobRecord]:
        return [r for r in self.records if r.status == FAILED]
