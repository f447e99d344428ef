"""The one interface the driver talks to a worker through, wherever the worker runs.

Two implementations: a Ray actor (`ctbuild.farm.ray_workers.RayWorker`) and a process on the driver's
own machine (`ctbuild.farm.local_workers.LocalWorker`). Both run the same `ctbuild.farm.worker.FarmWorker`
and say the same things, as `Event`s: warm (with its info), could not set up, one record per
job, the end of each batch, and died. How a worker is reached, waited on, stopped and killed
stays behind this interface; which kind to start and when is the pool's (`ctbuild.farm.pool`).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, NamedTuple, Sequence

#: What a worker can say. ``WARM``: set up, payload its info dict; ``SETUP_FAILED``: could not
#: set up, payload the error; ``RECORD``: one job's record; ``BATCH_END``: it is done with its
#: oldest batch; ``DIED``: it is gone, payload why (the driver blames the job it was on).
WARM, SETUP_FAILED, RECORD, BATCH_END, DIED = "warm", "failed", "rec", "end", "died"


class Event(NamedTuple):
    kind: str
    payload: Any = None


class WorkerHandle(ABC):
    """The driver's handle on one worker. It warms up on its own once made; the driver sends it
    batches and receives its events, one at a time, whenever `waitable` is ready."""

    #: A process on the driver's machine (started while Ray starts, or instead of Ray), not a
    #: Ray actor. It is watched by polling: its pipe cannot be waited on together with Ray.
    local: ClassVar[bool]

    def __init__(self, name: str) -> None:
        self.name = name                      # its slot's name: "w0" (Ray), "e0" (local)
        self.info: dict[str, Any] | None = None  # what it reported when warm
        self.gone = False                     # killed or stopped: it says nothing more

    @property
    def warm(self) -> bool:
        return self.info is not None

    @property
    def ready(self) -> bool:
        """Whether it can take batches now."""
        return self.warm and not self.gone

    @abstractmethod
    def waitable(self) -> Any | None:
        """What `wait_ready` waits on for its next event; None while it owes none."""

    @abstractmethod
    def send(self, jobs: list[dict[str, Any]], timeout: float | None) -> None:
        """Queue a batch (compiled in order, one record each, then ``BATCH_END``). A worker
        that died meanwhile does not raise here: its next event says ``DIED``."""

    @abstractmethod
    def receive(self) -> Event:
        """Its next event; call only once `waitable` is ready (it may block otherwise)."""

    @abstractmethod
    def leave(self) -> None:
        """Ask it to clean up once it has delivered what it holds, without waiting here
        (`stop_all` ends it)."""

    @abstractmethod
    def kill(self) -> bool:
        """Kill it now, with the compiler it runs; False when it was gone already."""

    @classmethod
    @abstractmethod
    def wait_ready(cls, workers: Sequence[WorkerHandle], timeout: float) -> list[WorkerHandle]:
        """Those of ``workers`` (all of this class) with an event to receive, waiting at most
        ``timeout`` seconds for one."""

    @classmethod
    @abstractmethod
    def stop_all(cls, workers: Sequence[WorkerHandle], seconds: float, abort: bool) -> None:
        """End ``workers`` (all of this class), letting them remove their temp directories
        for at most ``seconds``. ``abort``: the build stopped and nothing more they compile
        would land; they are killed without waiting for the jobs they are on."""


def by_kind(workers: Sequence[WorkerHandle]) -> list[tuple[type[WorkerHandle], list[WorkerHandle]]]:
    """``workers`` grouped by class, local ones first (they are polled, never blocked on)."""
    groups: dict[type[WorkerHandle], list[WorkerHandle]] = {}
    for worker in workers:
        groups.setdefault(type(worker), []).append(worker)
    return sorted(groups.items(), key=lambda kv: not kv[0].local)


def ready_workers(workers: Sequence[WorkerHandle], timeout: float) -> list[WorkerHandle]:
    """Workers with an event to receive, of whichever kind answers first: local ones are
    polled without waiting while Ray's are waited on for up to ``timeout`` seconds."""
    groups = by_kind(workers)
    for i, (kind, group) in enumerate(groups):
        last = i == len(groups) - 1
        ready = kind.wait_ready(group, timeout if last else 0.0)
        if ready or last:
            return ready
    return []
