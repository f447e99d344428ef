"""How to run the farm (`FarmOptions`), and the defaults that depend on this machine."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

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
    # told, once a tick, how long each job still running has run; True: estimates changed
    # (a job running past its guess raised its siblings'), re-rank the jobs not sent yet
    running: Callable[[dict[str, Any], float], bool] | None = None
    # local processes that compile while an embedded Ray starts in the background (None:
    # `default_early_workers`; 0: none); a joined cluster or a Ray already up never uses them
    early_workers: int | None = None
    # run every job on local worker processes and never start Ray: where Ray is not installed,
    # or for a build that would be over before an embedded Ray is up
    local_only: bool = False

    def check(self) -> None:
        """Raise ValueError for a value no farm can run with."""
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.compile_timeout is not None and self.compile_timeout <= 0:
            raise ValueError(f"compile_timeout must be > 0, got {self.compile_timeout}")

    def record_deadline(self) -> float | None:
        """Seconds the driver waits for a worker's next record before it calls the job hung:
        the compile timeout (which the worker enforces itself) plus grace; None: no limit."""
        t = self.compile_timeout
        if t is None:
            return None
        grace = self.grace if self.grace is not None else min(30.0, max(2.0, t / 2))
        return t + grace
