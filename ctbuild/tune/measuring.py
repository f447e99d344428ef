"""How one kernel x workload's candidates are launched and timed on this GPU.

A `Bench` holds what every timing of one key shares: the inputs (specs turned into tensors, or
the caller's own), the stream, the grid's device facts, one served kernel per config (CUBINs
from the cache, nothing compiled) and the in-place handling. Two ways to time:

* `Bench.screen`: cuTile's own ``ct.tune.exhaustive_search`` over the candidates (CUDA graph per
  sample, L2 flush, warm-ups, 95% CI convergence; the first launch of every candidate in a
  timed subprocess, which also contains faults and hangs);
* `Bench.sample`: one launch, timed the same way, for the interleaved runoff between finalists
  (`ctbuild.tune.runoff`) and for the sizes inside a bucket (`ctbuild.tune.regret`).

Both take their arguments from `Bench.args`, which restores ``restore=`` arguments and zeroes
``reset_to_zero=`` ones before every launch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from .. import cutile
from ..space import Config
from ..specs import Workload
from .choice import Timing

if TYPE_CHECKING:
    from ..declare import TunedKernel
    from ..serve.served_kernel import ServedKernel


class InPlace:
    """Snapshot ``restore=`` arguments once; before every sample restore them and zero the
    ``reset_to_zero=`` ones. Restoring writes into the caller's own tensors (same pointers, so
    the launch signature and compile key do not change)."""

    def __init__(self, tuned: TunedKernel, w: Workload) -> None:
        self.restore = {n: w[n] for n in tuned.restore}
        self.zero = {n: w[n] for n in tuned.reset_to_zero}
        self.snapshot = {n: t.clone() for n, t in self.restore.items()}

    def __bool__(self) -> bool:
        return bool(self.restore or self.zero)

    def prepare(self) -> None:
        for n, t in self.restore.items():
            t.copy_(self.snapshot[n])
        for t in self.zero.values():
            t.zero_()


class _Arriving(Sequence[Config]):
    """``exhaustive_search`` iterates its space once: yield configs as their CUBINs arrive."""

    def __init__(self, n: int, order: Callable[[], Iterator[Config]]) -> None:
        self.n, self.order = n, order

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Config:  # type: ignore[override]  # never used
        raise IndexError(i)

    def __iter__(self) -> Iterator[Config]:
        return self.order()


@dataclass
class Bench:
    """Launching and timing one kernel x workload's candidates (see the module doc)."""
    tuned: TunedKernel
    inputs: Workload
    stream: Any
    grid_dev: Any
    kernel_for: Callable[[Config], ServedKernel]
    on_candidate: Callable[[Config], None] | None = None
    inplace: InPlace = field(init=False)
    _last: Config | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.inplace = InPlace(self.tuned, self.inputs)

    def grid(self, cfg: Config) -> tuple[int, ...]:
        return self.tuned.grid(cfg, self.inputs, self.grid_dev)

    def args(self, cfg: Config) -> tuple:
        """The launch's arguments, in-place ones restored; tells ``on_candidate`` first when the
        candidate changes (who to blame if the process dies)."""
        if self.on_candidate is not None and cfg != self._last:
            self._last = cfg
            self.on_candidate(cfg)
        if self.inplace:
            self.inplace.prepare()
        return self.tuned.kernel_args(cfg, self.inputs)

    def sample(self, cfg: Config) -> float:
        """Microseconds of one launch of ``cfg`` (CUDA graph, L2 flushed before it)."""
        return cutile.benchmark_sample(self.stream, self.grid(cfg), self.kernel_for(cfg),
                                       self.args(cfg))

    def screen(self, n: int, order: Callable[[], Iterator[Config]], timeout_s: float | None
               ) -> tuple[list[Timing], list[dict[str, Any]], str | None]:
        """cuTile's exhaustive search over the ``n`` configs ``order()`` yields: (timings,
        failures, error). When every candidate fails the search raises with the first failure
        only: then ``error`` is its text (the caller fails every candidate with it)."""
        import cuda.tile as ct
        try:
            result = ct.tune.exhaustive_search(
                _Arriving(n, order), self.stream, self.grid, self.kernel_for, self.args, None,
                quiet=True, single_run_timeout_sec=timeout_s)
        except Exception as exc:  # noqa: BLE001 - every candidate failed (ValueError)
            return [], [], f"{type(exc).__name__}: {exc}"
        timings = [Timing(m.config, m.mean_us, m.error_margin_us, m.num_samples)
                   for m in result.successes]
        failures = [{"config": cfg.to_json(), "error": explain_failure(etype, msg)}
                    for cfg, etype, msg in result.failures]
        return timings, failures, None

    def launch_once(self, cfg: Config) -> None:
        """Leave the caller-visible tensors as after one clean launch of ``cfg``."""
        import cuda.tile as ct
        ct.launch(self.stream, self.grid(cfg), self.kernel_for(cfg), self.args(cfg))
        self.stream.synchronize()


def explain_failure(etype: type, msg: str) -> str:
    """A measurement failure as one recorded line, naming faults and hangs as such."""
    text = f"{etype.__name__}: {msg.strip()}"
    if "benchmark worker exited unexpectedly" in msg:
        return ("fault: the candidate's first launch killed cuTile's benchmark subprocess "
                "(illegal address, trap or abort; its stderr has the CUDA error) -- " + text)
    if etype.__name__ == "TileLaunchTimeoutError":
        return "timeout: " + text
    return text


def config_key(cfg: Config) -> str:
    """A config as the JSON text records and exclusions compare by."""
    return json.dumps(cfg.to_json(), sort_keys=True)
