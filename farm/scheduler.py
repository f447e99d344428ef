"""Which jobs go out next, and in what batches: longest first, sized to the work left.

Jobs go out longest first (by the caller's ``estimate``, re-ranked whenever its ``learn`` says
a finished job changed it, or its ``running`` says a job still running did), each worker as
soon as it is warm (no waiting for the others). Every worker slot has at most two batches
queued (one running, one waiting, so it never idles between batches), but nothing waits behind
a long batch (over a batch's share) and a long job only goes to a worker with nothing queued:
work queued behind a long job on one worker, while others idle, sets the finish time. A batch
holds about 1/(4 x workers) of the estimated work left (guided self-scheduling), so small jobs
are batched and the tail stays balanced.

Concurrent builds into one cache do not compile a key twice: a job is handed out only under its
claim (`ctbuild.farm.claims`); a job claimed by another build waits until that build stores it (then it
counts as cached) or gives the claim up (then this build compiles it).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Container, Sequence

from .claims import Claims

#: Batches queued per worker (one running + one waiting).
QUEUE_DEPTH = 2


@dataclass
class Batch:
    """Jobs handed to one worker at once, and how many of their records came back."""
    jobs: list[dict[str, Any]]
    cost: float = 0.0   # estimated seconds
    done: int = 0

    @property
    def work_left(self) -> float:
        return self.cost * (1 - self.done / len(self.jobs))


class Scheduler:
    """The jobs of one run not handed out yet, and the batches they go out in.

    ``stored(key)``: whether the cache holds the key now (another build stored it);
    ``on_cached(job)`` is told of each such job instead of handing it out; ``finished`` holds
    the keys that have a record already."""

    def __init__(self, jobs: Sequence[dict[str, Any]], claims: Claims,
                 stored: Callable[[str], bool], on_cached: Callable[[dict[str, Any]], None],
                 finished: Container[str], max_batch: int,
                 estimate: Callable[[dict[str, Any]], float] | None) -> None:
        self.claims, self.stored, self.on_cached = claims, stored, on_cached
        self.finished, self.max_batch = finished, max_batch
        self.estimate = estimate or (lambda job: 1.0)
        self.pending: deque[dict[str, Any]] = deque(jobs)
        self.deferred: list[dict[str, Any]] = []   # claimed by another build
        self.cost: dict[str, float] = {}
        self.left_cost = 0.0   # estimated seconds of the jobs not handed out
        self.rerank()

    def rerank(self) -> None:
        """Estimate the jobs not handed out yet (again), longest first: the finish time nears
        max(total / workers, longest job)."""
        for job in (*self.pending, *self.deferred):
            self.cost[job["key"]] = max(0.0, float(self.estimate(job)))
        self.pending = deque(sorted(self.pending, key=lambda j: -self.cost[j["key"]]))
        self.left_cost = sum(self.cost[j["key"]] for j in (*self.pending, *self.deferred))

    def unsent(self) -> list[dict[str, Any]]:
        """Every job not handed out (pending, or waiting for another build)."""
        return [*self.pending, *self.deferred]

    def take(self) -> dict[str, Any] | None:
        """The next job this build may compile now (claimed), or None."""
        while self.pending:
            job = self.pending.popleft()
            key = job["key"]
            if key in self.finished:
                continue
            if not self.claims.claim(key):
                self.deferred.append(job)
                continue
            if self.stored(key):  # another build stored it since we planned
                self.on_cached(job)
                continue
            return job
        return None

    def recheck_deferred(self) -> None:
        """Jobs another build claimed: cached once it stored them; ours if it let go."""
        still = []
        for job in self.deferred:
            if self.stored(job["key"]):
                self.on_cached(job)
            elif self.claims.claim(job["key"]):
                self.pending.append(job)
            else:
                still.append(job)
        self.deferred = still

    def give_back(self, jobs: Sequence[dict[str, Any]]) -> None:
        """Jobs a lost worker held go out first again, in their order."""
        self.pending.extendleft(reversed(jobs))
        self.left_cost += sum(self.cost[j["key"]] for j in jobs)

    def batches_for(self, queued: Sequence[Batch], one_at_a_time: bool,
                    n_slots: int) -> list[Batch]:
        """The batches to add to a worker that holds ``queued`` (none when it holds enough).

        A second batch queued behind a running one keeps a worker busy between batches, but at
        the tail it would hold jobs that an idle worker could start now: prefetch only while
        every slot can still get a full queue. ``one_at_a_time``: never a second batch (a local
        worker, so it can leave soon after a Ray worker is there to replace it)."""
        depth = QUEUE_DEPTH if len(self.pending) >= n_slots * QUEUE_DEPTH and \
            not one_at_a_time else 1
        held, new = list(queued), []
        while len(held) < depth:
            target = self.left_cost / (n_slots * 4)
            if held and (held[-1].cost > target or (
                    self.pending and self.cost[self.pending[0]["key"]] > target)):
                break  # nothing queues behind a long batch, no long job behind another
            batch = self._fill(target)
            if batch is None:
                break
            held.append(batch)
            new.append(batch)
        return new

    def _fill(self, target: float) -> Batch | None:
        """The next batch: jobs up to ``target`` estimated seconds (at least one job)."""
        jobs: list[dict[str, Any]] = []
        size = 0.0
        while len(jobs) < self.max_batch and (not jobs or size < target):
            job = self.take()
            if job is None:
                break
            jobs.append(job)
            size += self.cost[job["key"]]
        if not jobs:
            return None
        self.left_cost = max(0.0, self.left_cost - size)
        return Batch(jobs, size)
