"""Workers as Ray actors: one long-lived `FarmWorker` actor per worker slot, behind
`ctbuild.farm.worker_handle.WorkerHandle`.

Each actor warms up once (``warm``), then runs the batches it is sent one after another
(``max_concurrency=1``); a batch's records stream back one per job (``num_returns="streaming"``),
which tells the driver exactly which job the actor is on. Ray is imported only here, and only
once a Ray worker is made: a farm of local workers never imports it.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Sequence

from .reaper import freeze_tree, kill_frozen
from .worker import FarmWorker
from .worker_handle import BATCH_END, DIED, RECORD, SETUP_FAILED, WARM, Event, WorkerHandle

#: Seconds a killed actor gets to be really gone (its process ended) after an abort.
GONE_SECONDS = 30.0


def actor_class(spread: bool) -> Any:
    """`FarmWorker` as a Ray actor class: one CPU, no GPU, never restarted by Ray (the driver
    replaces a lost worker itself), spread over the nodes of a joined cluster."""
    import ray
    opts: dict[str, Any] = dict(num_cpus=1, num_gpus=0, max_restarts=0, max_task_retries=0,
                                max_concurrency=1)
    if spread:
        opts["scheduling_strategy"] = "SPREAD"
    return ray.remote(FarmWorker).options(**opts)


def cause(exc: BaseException) -> str:
    """The useful line of a Ray error (the remote exception, not Ray's wrapping)."""
    inner = getattr(exc, "cause", None)
    if isinstance(inner, BaseException) and not isinstance(inner, type(exc)):
        return f"{type(inner).__name__}: {inner}".strip()
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return f"{type(exc).__name__}: " + (lines[-1] if lines else "")


class RayWorker(WorkerHandle):
    """One Ray actor. ``kill_tree``: the actor runs on this machine under our own Ray, so a
    kill also takes the processes below it (the compiler it runs would outlive it)."""

    local = False

    def __init__(self, name: str, actor_cls: Any, spec: dict[str, Any], kill_tree: bool) -> None:
        super().__init__(name)
        self.actor = actor_cls.remote(name, spec)
        self._warm_ref: Any = self.actor.warm.remote()
        self._streams: deque[Any] = deque()  # each sent batch's record stream, oldest first
        self._kill_tree = kill_tree
        self._closing: Any = None

    def waitable(self) -> Any | None:
        if self.gone:
            return None
        if self._warm_ref is not None:
            return self._warm_ref
        return self._streams[0] if self._streams else None

    def send(self, jobs: list[dict[str, Any]], timeout: float | None) -> None:
        self._streams.append(self.actor.run_batch.options(num_returns="streaming").remote(
            jobs, timeout))

    def receive(self) -> Event:
        import ray
        if self._warm_ref is not None:
            ref, self._warm_ref = self._warm_ref, None
            try:
                self.info = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - any error of its set-up stops the build
                return Event(SETUP_FAILED, cause(exc))
            return Event(WARM, self.info)
        try:
            ref = next(self._streams[0])
            return Event(RECORD, ray.get(ref))
        except StopIteration:
            self._streams.popleft()
            return Event(BATCH_END)
        except ray.exceptions.RayError as exc:  # died, or the generator itself raised
            return Event(DIED, cause(exc))

    def leave(self) -> None:
        if self._closing is None:  # runs after the batches it holds (one at a time)
            self._closing = self.actor.close.remote()

    def kill(self) -> bool:
        import ray
        pid = (self.info or {}).get("pid") if self._kill_tree else None
        if not isinstance(pid, int):
            pid = None
        frozen = freeze_tree(pid, with_root=False) if pid is not None else {}
        self.gone = True
        try:
            ray.kill(self.actor, no_restart=True)
            return True
        except Exception:  # noqa: BLE001 - already gone
            return False
        finally:
            kill_frozen(frozen, after=pid if frozen else None)

    @classmethod
    def wait_ready(cls, workers: Sequence[WorkerHandle], timeout: float) -> list[WorkerHandle]:
        import ray
        by_ref = {w.waitable(): w for w in workers}
        ready, _ = ray.wait(list(by_ref), num_returns=1, timeout=timeout)
        return [by_ref[ref] for ref in ready]

    @classmethod
    def stop_all(cls, workers: Sequence[WorkerHandle], seconds: float, abort: bool) -> None:
        """Let each actor remove its temp directory, then kill it; after an ``abort``, also
        wait until each is really gone."""
        import ray
        live = [w for w in workers if isinstance(w, RayWorker) and not w.gone]
        if not live or not ray.is_initialized():
            return
        for worker in live:
            worker.leave()
        ray.wait([w._closing for w in live], num_returns=len(live), timeout=seconds)
        probes = []
        for worker in live:
            if worker.kill() and abort:
                probes.append(worker.actor.ping.remote())
        if probes:
            ray.wait(probes, num_returns=len(probes), timeout=GONE_SECONDS)
