"""How one kernel x workload's candidates are launched and timed on this GPU.

A `Bench` holds what every timing of one key shares: the inputs (specs turned into tensors, or
the caller's own), the stream, the grid's device facts, one served kernel per config (CUBINs
from the cache, nothing compiled) and the in-place handling. Two ways to time:

* `Bench.screen`: cuTile's own ``ct.tune.exhaustive_search`` over the candidates (CUDA graph per
  sample, L2 flush, warm-ups, 95% CI convergence);
* `Bench.sample`: one launch, timed the same way, for the interleaved runoff between finalists
  (`ctbuild.tune.race`), at the key's own size and the other sizes of its bucket.

Both take their arguments from `Bench.args`, which restores ``restore=`` arguments and zeroes
``reset_to_zero=`` ones before every launch, and tells the supervisor of each candidate's first
launch on these inputs (`Bench.tell`: a launch that hangs or faults costs its candidate only).
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from .. import cutile
from ..bucket_map import layout_class
from ..device_table import cuda_device, nominal_device
from ..dims import Bucket, concretize
from ..space import Config
from ..specs import Workload
from .check import OutputCheck
from .choice import Choice, TieBand, Timing, choose
from .inputs import make_inputs
from .race import FINALS_BUDGET, SPAN_BUDGET, ContextLost, RaceBudget, RaceResult, finalists, race
from .span import DEFAULT_SPLITS, Group, Span
from .span_sizes import span_sizes
from .waves import serve

if TYPE_CHECKING:
    from ctbuild.cache import Store

    from ..declare import TunedKernel
    from ..serve.served_kernel import ServedKernel
    from ..waves import WaveTable
    from .tuner import CandidatePlan, Device

log = logging.getLogger("ctbuild")


class CheckError(RuntimeError):
    """The default config fails the kernel's own ``check=`` reference."""


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
    on_launch: Callable[[Config | None], None] | None = None
    inplace: InPlace = field(init=False)
    _told: set[Config] = field(default_factory=set, init=False)
    _last: Config | None = field(default=None, init=False)
    _first: Config | None = field(default=None, init=False)
    _pending: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.inplace = InPlace(self.tuned, self.inputs)

    def grid(self, cfg: Config) -> tuple[int, ...]:
        return self.tuned.grid(cfg, self.inputs, self.grid_dev)

    def tell(self, cfg: Config, always: bool = False) -> None:
        """Tell the supervisor that ``cfg`` launches next, before its first launch on these
        inputs (or with ``always`` where another config was told last): ``on_launch(cfg)``,
        and ``on_launch(None)`` once the launch returned (`settle`), so that a launch that
        hangs is killed after ``--timeout`` (`ctbuild.tune.supervisor`). The supervisor blames
        the candidate it heard of last when the process dies or hangs: a launch that hangs or
        faults is a first one, or says so (`_raise_if_lost`). (A race's rotation told every
        switch: 11,000 events a tune, 0.4 s of a measuring process.)"""
        if cfg in self._told and (not always or cfg == self._last):
            return
        self._told.add(cfg)
        self._last = cfg
        self._first = self._first or cfg
        if self.on_launch is not None:
            self.on_launch(cfg)
            self._pending = True

    def settle(self) -> None:
        """The launch told of last returned (every launch is followed by the next one's
        `args`, or by this)."""
        if self._pending and self.on_launch is not None:
            self._pending = False
            self.on_launch(None)

    def args(self, cfg: Config, always: bool = False) -> tuple:
        """The launch's arguments, in-place ones restored; the launch before it returned, and
        this one is told of (`tell`)."""
        self.settle()
        self.tell(cfg, always)
        if self.inplace:
            self.inplace.prepare()
        return self.tuned.kernel_args(cfg, self.inputs)

    def sample(self, cfg: Config) -> float:
        """Microseconds of one launch of ``cfg`` (CUDA graph, L2 flushed before it)."""
        try:
            return cutile.benchmark_sample(self.stream, self.grid(cfg), self.kernel_for(cfg),
                                           self.args(cfg))
        except Exception as exc:
            self._raise_if_lost(cfg, exc)
            raise
        finally:
            self.settle()

    def _raise_if_lost(self, cfg: Config, exc: BaseException | None) -> None:
        """After ``cfg``'s launch raised: `ContextLost` where it broke the CUDA context,
        ``cfg`` told last (every launch after the fault fails too, and a race that went on
        blamed the last of them); nothing where the context still works (the candidate
        failed alone)."""
        import torch
        if not torch.cuda.is_available() or context_ok():
            return
        self.settle()
        self.tell(cfg, always=True)
        self.settle()
        raise ContextLost(f"{cfg.to_json()} broke the CUDA context"
                          + (f": {type(exc).__name__}: {exc}" if exc else "")) from exc

    def screen(self, n: int, order: Callable[[], Iterator[Config]], timeout_s: float | None
               ) -> tuple[list[Timing], list[dict[str, Any]], str | None]:
        """cuTile's exhaustive search over the ``n`` configs ``order()`` yields: (timings,
        failures, error). When every candidate fails the search raises with the first failure
        only: then ``error`` is its text (the caller fails every candidate with it).

        Under a supervisor (``on_launch``) each first launch runs here, told of (`tell`):
        one that hangs is killed after ``timeout_s``, one that faults breaks the context and
        is blamed (the first failure, every later launch failing with it). cuTile's timed
        first launch in a subprocess, which contains both without a restart, cost 4.9 ms a
        candidate on an H200 (payload export and the worker's round trip): 54% of the
        screening. Without a supervisor it still does, ``timeout_s`` bounding it."""
        import cuda.tile as ct
        error: str | None = None
        try:
            result = ct.tune.exhaustive_search(
                _Arriving(n, order), self.stream, self.grid, self.kernel_for, self.args, None,
                quiet=True,
                single_run_timeout_sec=None if self.on_launch is not None else timeout_s)
        except Exception as exc:  # noqa: BLE001 - every candidate failed (ValueError)
            error, result = f"{type(exc).__name__}: {exc}", None
        self.settle()
        if error is not None or (result is not None and result.failures):
            first = result.failures[0][0] if result is not None else self._first
            if first is not None:
                self._raise_if_lost(first, None)
        if result is None:
            return [], [], error
        timings = [Timing(m.config, m.mean_us, m.error_margin_us, m.num_samples)
                   for m in result.successes]
        failures = [{"config": cfg.to_json(), "error": explain_failure(etype, msg)}
                    for cfg, etype, msg in result.failures]
        return timings, failures, None

    def launch_once(self, cfg: Config) -> None:
        """Leave the caller-visible tensors as after one clean launch of ``cfg`` (the output
        check's launches: each told, a hang there is this one's)."""
        import cuda.tile as ct
        try:
            ct.launch(self.stream, self.grid(cfg), self.kernel_for(cfg), self.args(cfg, True))
            self.stream.synchronize()
        except Exception as exc:
            self._raise_if_lost(cfg, exc)
            raise
        finally:
            self.settle()


def context_ok() -> bool:
    """Whether this process's CUDA context still works (a fault makes it sticky-broken)."""
    import torch
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return True
    except Exception:  # noqa: BLE001
        return False


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


# ---- step 4: the race at the key's own size, and the choice ------------------------------
@dataclass(frozen=True)
class Decision:
    """The choice, and the race it was made on (None: fewer than two finalists)."""
    choice: Choice
    runoff: RaceResult | None
    finalists: tuple[Config, ...]


def decide(bench: Bench, screened: Sequence[Timing], plan: CandidatePlan, band: TieBand,
           budget: RaceBudget) -> tuple[Decision, list[dict[str, Any]]]:
    """Race the finalists and apply the tie rule: (decision, race failures)."""
    final = finalists(screened, band, plan.default)
    configs = tuple(t.config for t in final)
    if len(final) < 2:
        return Decision(choose(screened, plan.space, plan.default, band), None, configs), []
    result = race(configs, bench.sample, band, budget)
    failures = [{"config": c.to_json(), "error": f"runoff: {why}"} for c, why in result.failures]
    timings = result.timings if len(result.timings) > 1 else tuple(
        t for t in final if t.config not in {c for c, _ in result.failures})
    return Decision(choose(timings, plan.space, plan.default, band), result, configs), failures


# ---- step 5: the bucket's other sizes --------------------------------------------------------
def own_size_times(screened: Sequence[Timing], decision: Decision) -> dict[Config, Timing]:
    """Every screened candidate's time at the key's own size on the race's clock: the
    finalists' race times, the others' screening times scaled by the fastest's ratio."""
    times = {t.config: t for t in screened}
    raced = {t.config: t for t in decision.runoff.timings} if decision.runoff else {}
    failed = {c for c, _ in decision.runoff.failures} if decision.runoff else set()
    common = [c for c in raced if c in times]
    scale = min(raced[c].mean_us for c in common) / min(times[c].mean_us for c in common) \
        if common else 1.0
    out = {c: Timing(c, t.mean_us * scale, t.ci_us * scale, t.samples)
           for c, t in times.items() if c not in failed}
    out.update(raced)
    return out


#: At a size that is not a corner of its bucket, a candidate more than this much slower than
#: the fastest at every size raced before it is not raced there: it cannot serve it (each
#: corner races every candidate, and a config's speed changes by little between sizes).
PRUNE_FACTOR = 1.3


def measure_span(bucket: Bucket, contenders: Sequence[Config], top: dict[Config, Timing],
                 timer_for: Callable[[Workload], Callable[[Config], float]], band: TieBand,
                 keep: Sequence[Config] = ()) -> tuple[Span, list[dict[str, Any]]]:
    """Race ``contenders`` at each of the bucket's other sizes, the corners first (each Dim at
    its lower or upper bound): (the span, the candidates that failed at a size: failures of
    the key, naming the size). Any other size races only the candidates within
    `PRUNE_FACTOR` of the fastest at some size raced before it, and ``keep`` (the key's
    winner and default: every size times them, so some config is timed at all)."""
    sizes = span_sizes(bucket)
    low, high = bucket.lower_bounds(), dict(bucket.sizes)
    corners = [i for i, s in enumerate(sizes) if all(s[n] in (low[n], high[n]) for n in s)]
    times: dict[int, dict[Config, Timing]] = {}
    races: dict[int, dict[str, Any]] = {}
    problems, failures = [], []
    near = _near(top)
    for i in [*corners, *(i for i in range(len(sizes)) if i not in corners)]:
        raced = [c for c in contenders if i in corners or c in near or c in keep]
        started = time.perf_counter()
        result = race(raced, timer_for(concretize(bucket.declared, sizes[i])), band,
                      SPAN_BUDGET) if len(raced) > 1 else None
        failures += [{"config": c.to_json(), "error": f"at {sizes[i]}: {why}"}
                     for c, why in (result.failures if result is not None else ())]
        if result is None or not result.timings:
            problems.append(f"{sizes[i]}: no candidate could be timed")
            continue
        times[i] = {t.config: t for t in result.timings}
        near |= _near(times[i])
        races[i] = {"raced": len(raced), "rounds": result.rounds, "stopped": result.stopped,
                    "seconds": round(time.perf_counter() - started, 4)}
    kept = sorted(times)
    out = [sizes[i] for i in kept] + [dict(bucket.sizes)]
    return Span(bucket, out, [*(times[i] for i in kept), top], problems,
                [races[i] for i in kept], [layout_class(size) for size in out]), failures


def _near(times: dict[Config, Timing]) -> set[Config]:
    """The configs within `PRUNE_FACTOR` of the fastest of ``times``."""
    reach = PRUNE_FACTOR * min(t.mean_us for t in times.values())
    return {c for c, t in times.items() if t.mean_us <= reach}


def key_clash(tuned: TunedKernel, bucket: Bucket, points: Sequence[dict[str, int]]
              ) -> str | None:
    """Why a split of ``bucket`` at ``points`` cannot be recorded (None: it can): a split
    point whose tuning key is a declared workload's, or another split point's (a key function
    that buckets this Dim, e.g. pow2), would overwrite that record."""
    taken = {repr(tuned.tuning_key(w)) for w in tuned.workloads}
    for point in points:
        key = repr(tuned.tuning_key(concretize(bucket.declared, point)))
        if key in taken:
            return (f"the kernel's tuning key gives the split point {point} the key of a "
                    "declared workload or of another split: a split needs a key that tells the "
                    "sizes apart (no pow2 bucketing of this Dim)")
        taken.add(key)
    return None


# ---- launching ------------------------------------------------------------------------------
class Benches:
    """`Bench` es of one kernel on one GPU that share one served kernel per config (each
    loads its CUBINs once, whatever the sizes they are launched at)."""

    def __init__(self, tuned: TunedKernel, store: Store | None, fp: str, device: Device, *,
                 stream: Any = None, input_device: Any = None, seed: int = 0,
                 served: Callable[[Config], ServedKernel] | None = None,
                 on_launch: Callable[[Config | None], None] | None = None) -> None:
        import torch

        from ..serve.served_kernel import CubinSource, ServedKernel
        self.tuned, self.seed, self.on_launch = tuned, seed, on_launch
        self.on_gpu = torch.cuda.is_available()
        self.stream = stream if stream is not None else torch.cuda.current_stream(device.index)
        self.grid_dev = cuda_device(device.index) if self.on_gpu else \
            nominal_device(device.arch)
        self.inputs_at = input_device or f"cuda:{device.index}"
        source = CubinSource(store, fp)
        self._make = served or (lambda cfg: ServedKernel(tuned, cfg, source))
        self._kernels: dict[Config, ServedKernel] = {}

    def kernel_for(self, cfg: Config) -> ServedKernel:
        if cfg not in self._kernels:
            self._kernels[cfg] = self._make(cfg)
        return self._kernels[cfg]

    def on(self, inputs: Workload) -> Bench:
        """A bench on these real inputs."""
        return Bench(self.tuned, inputs, self.stream, self.grid_dev, self.kernel_for,
                     self.on_launch)

    def on_spec(self, spec: Workload) -> Bench:
        """A bench on random inputs made from specs (or the kernel's ``inputs`` hook)."""
        return self.on(make_inputs(self.tuned, spec, self.inputs_at, self.seed))


# ---- one key, steps 2-5 ----------------------------------------------------------------------
@dataclass
class TuneSettings:
    """How to measure and decide: the tie band, the race budget at the key's own size, whether
    a bucket's other sizes are measured, and how many times a bucket may be split."""
    band: TieBand = field(default_factory=TieBand)
    budget: RaceBudget = FINALS_BUDGET
    span: bool = True
    max_splits: int = DEFAULT_SPLITS


@dataclass
class Measured:
    """What measuring one key gave: the screening, the decision, the bucket's span and how it
    is served (its groups, smallest first, and why it was not split further), their times."""
    screened: list[Timing]
    failed: list[dict[str, Any]]
    error: str | None
    decision: Decision | None = None
    span: Span | None = None
    groups: list[Group] = field(default_factory=list)
    unsplit: str | None = None
    #: per layout class, the table its calls choose their config by (`ctbuild.waves`)
    waves: dict[str, WaveTable] = field(default_factory=dict)
    check: dict[str, Any] | None = None
    phases: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def winner(self) -> Config | None:
        """The config the key's own record serves."""
        if self.groups:
            return self.groups[-1].winner
        return self.decision.choice.winner.config if self.decision else None


def measure(tuned: TunedKernel, plan: CandidatePlan, bench: Bench, benches: Benches,
            order: Callable[[], Iterator[Config]], n_measure: int, timeout_s: float | None,
            settings: TuneSettings, bucket: Bucket | None) -> Measured:
    """Steps 2-5 on the GPU: screen, check outputs (`gate`), race the finalists and decide, race the
    bucket's other sizes and split it where needed; then launch the winner once (an in-place
    kernel's inputs are left as after its launch)."""
    started = time.perf_counter()
    screened, failed, error = bench.screen(n_measure, order, timeout_s) if n_measure else \
        ([], [], None)
    m = Measured(screened, failed, error, phases={"screen": time.perf_counter() - started})
    t = time.perf_counter()
    m.screened, wrong, m.check = gate(tuned, bench, screened, plan.default) if screened else \
        ([], [], None)
    m.failed += wrong
    m.phases["check"] = time.perf_counter() - t
    if not m.screened:
        m.seconds = time.perf_counter() - started
        return m
    t = time.perf_counter()
    m.decision, raced_failed = decide(bench, m.screened, plan, settings.band, settings.budget)
    m.phases["runoff"] = time.perf_counter() - t
    m.failed += raced_failed
    if bucket is not None and settings.span:
        t = time.perf_counter()
        top = own_size_times(m.screened, m.decision)
        contenders = sorted(top, key=lambda c: top[c].mean_us)
        m.span, span_failed = measure_span(
            bucket, contenders, top, lambda cw: benches.on_spec(cw).sample, settings.band,
            keep=[m.decision.choice.winner.config, plan.default])
        m.failed += span_failed
        m.groups, m.unsplit, m.waves = serve(
            m.span, plan.space, plan.default, settings.band, settings.max_splits,
            lambda points: key_clash(tuned, bucket, points), lambda c, s: math.prod(
                tuned.grid(c, concretize(bucket.declared, s), benches.grid_dev)),
            benches.grid_dev.sm_count)
        m.phases["span"] = time.perf_counter() - t
    winner = m.winner
    assert winner is not None
    bench.launch_once(winner)
    m.seconds = time.perf_counter() - started
    return m


def gate(tuned: TunedKernel, bench: Bench, screened: list[Timing], default: Config
         ) -> tuple[list[Timing], list[dict[str, Any]], dict[str, Any]]:
    """Step 3: each screened candidate's outputs against the reference (`ctbuild.tune.check`):
    (the candidates that pass, the failures of those that do not, what the record says of the
    check). Without ``check=`` the reference is the default config's outputs; when the default
    could not be screened or launched there is none, and nothing is dropped (the record says
    why). `CheckError` when the default fails the kernel's own reference."""
    names = {t.config for t in screened}
    if tuned.check is None and default not in names:
        return screened, [], {"reference": None, "note": "the default config could not be "
                              "measured: no reference to compare with"}
    check = OutputCheck(tuned, bench.inputs, bench.launch_once)
    problem = check.reference(default)
    if problem is not None and tuned.check is not None:
        raise CheckError(f"kernel {tuned.name!r}: the default config {default.to_json()} "
                         f"fails the kernel's check= reference: {problem}")
    if problem is not None:
        check.restore()
        return screened, [], {"reference": None, "note": problem}
    # the default is its own reference, unless a check= reference judged it above
    judged = [t.config for t in screened if tuned.check is not None or t.config != default]
    wrong = {c: why for c in judged if (why := check.verdict(c)) is not None}
    check.restore()
    return [t for t in screened if t.config not in wrong], \
        [{"config": c.to_json(), "error": why} for c, why in wrong.items()], \
        {"reference": "check=" if tuned.check is not None else "default", "failed": len(wrong)}
