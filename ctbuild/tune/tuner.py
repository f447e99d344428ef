"""Measure precompiled candidates on this GPU and record the winners (``ctbuild tune``).

`tune_workload(tuned, w, *, store, ...) -> TuningRecord` tunes one kernel x workload on the
current GPU, in named steps:

1. `plan_candidates`: the configs to measure and their compile keys (exclusions, configs that
   cannot be planned and CUBINs missing from the cache are failures of their own);
2. screening (`Bench.screen`): cuTile's own ``ct.tune.exhaustive_search``, fed with kernels
   whose CUBINs come from the cache (`ServedKernel`): nothing is compiled while measuring;
3. the output check (`ctbuild.tune.check`): each screened candidate's outputs against the
   default config's (or the declared ``check=``); a wrong one is a failure and never wins;
4. the race at the key's own size (`ctbuild.tune.race`): the finalists re-measured
   interleaved, round by round, until they separate or the budget ends; the tie rule
   (`ctbuild.tune.choice`) decides;
5. for a `Dim` bucket, the race at the bucket's other sizes and the winner for all of them,
   or the bucket split where none is good at all (`ctbuild.tune.span`);
6. the record (and the sub-buckets' records), written to the store unless ``write=False``.

``w`` holds specs (random inputs are made) or the caller's real tensors (online tuning: the
runtime's ``CTBUILD_MODE=tune``). In-place arguments (``restore=``) are snapshotted once and
restored before every sample, accumulators (``reset_to_zero=``) zeroed; afterwards the caller's
tensors are as after ONE launch of the winner on the original inputs.
The CLI's loop over kernels x workloads lives in `ctbuild.tune.session`, the
``--compile-missing`` pool in `ctbuild.compile.compile_pool`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import logging
import subprocess
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from .. import cutile
from ..arch import Arch
from ..bucket_map import refined_json
from ..compile.compile_pool import CompilePool
from ..compile.plan import job_for
from ..declare import DEFAULT_CAP, TunedKernel
from ..dims import Bucket, concretize
from ..keys import kernel_record_key
from ..records import TuningRecord
from ..space import Config
from ..specs import Workload, spec_to_json
from ..toolchain import toolchain_for
from .choice import RULE_SPAN
from .inputs import has_specs
from .measuring import Benches, Measured, TuneSettings, config_key, measure
from .span import Group

if TYPE_CHECKING:
    from ctbuild.cache import Store

    from ..serve.served_kernel import ServedKernel

log = logging.getLogger("ctbuild")


# ---- identity of the GPU and toolchain ------------------------------------------------------
@dataclass(frozen=True)
class Device:
    """The GPU being tuned on."""
    index: int
    arch: str
    name: str
    driver: str

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "arch": self.arch, "gpu": self.name, "driver": self.driver}


def current_device(index: int | None = None) -> Device:
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("ctbuild tune needs a CUDA GPU; none is visible to torch")
    dev = torch.cuda.current_device() if index is None else index
    major, minor = torch.cuda.get_device_capability(dev)
    return Device(dev, str(Arch.from_capability(major, minor)), torch.cuda.get_device_name(dev),
                  driver_version())


def driver_version() -> str:
    try:
        v = cutile.driver_version()
        return f"{v // 1000}.{(v % 1000) // 10}"
    except Exception:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return out.splitlines()[0] if out else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def record_key(tuned: TunedKernel, w: Mapping[str, Any], device: Device, toolchain_fp: str
               ) -> str:
    return kernel_record_key(tuned, Workload(dict(w)), device.arch, device.name, toolchain_fp)


# ---- counting compiles -------------------------------------------------------------------
class CompileCounter:
    """Counts cuTile compiles of this thread while active (`cutile.compiles_in_this_thread`:
    a compile in another thread of the process is not this tuning's), plus `STATS.jit_compiles`
    of served kernels."""

    def __init__(self) -> None:
        self.tileiras = 0
        self._jit0 = 0
        self.jit = 0

    @contextlib.contextmanager
    def active(self) -> Iterator[CompileCounter]:
        from ..serve.served_kernel import STATS
        tileiras0 = cutile.compiles_in_this_thread()
        self._jit0 = STATS.jit_compiles
        try:
            yield self
        finally:
            self.tileiras += cutile.compiles_in_this_thread() - tileiras0
            self.jit += STATS.jit_compiles - self._jit0

    @property
    def total(self) -> int:
        return self.tileiras + self.jit


# ---- step 1: what to measure ----------------------------------------------------------------
@dataclass
class CandidatePlan:
    """The configs of one key to measure, in space order, with their compile keys."""
    spec: Workload
    space: list[Config]
    default: Config
    total: int
    pruned: int
    keys: dict[Config, str] = field(default_factory=dict)
    measurable: list[Config] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)


def plan_candidates(tuned: TunedKernel, spec: Workload, arch: str, fp: str, cap: int,
                    configs: Sequence[Config] | None, exclude: Mapping[str, str]
                    ) -> CandidatePlan:
    """The candidates of ``tuned`` for ``spec``: planned keys, exclusions as failures."""
    cands = tuned.candidates(spec, Arch(arch), cap)
    space = list(configs) if configs is not None else list(cands.kept)
    plan = CandidatePlan(spec, space, cands.default, cands.total, len(cands.pruned))
    for cfg in space:
        try:
            plan.keys[cfg] = job_for(tuned, cfg, spec, arch, fp).key
        except Exception as exc:  # noqa: BLE001 - a config that cannot be planned fails alone
            plan.failures.append({"config": cfg.to_json(), "error": f"plan: {exc}"})
    for cfg in plan.keys:
        if reason := exclude.get(config_key(cfg)):
            plan.failures.append({"config": cfg.to_json(), "error": reason})
        else:
            plan.measurable.append(cfg)
    return plan


def arrivals(plan: CandidatePlan, tuned: TunedKernel, store: Store | None, arch: str, fp: str,
             pool: CompilePool | None, served: bool) -> tuple[Callable[[], Iterator[Config]], int]:
    """(the order configs become measurable in, how many will). Without a pool a config whose
    CUBIN is not cached is a failure; with one it is compiled and measured when it lands."""
    missing = [] if served or store is None else [
        c for c in plan.measurable if not store.has_compile(plan.keys[c])]
    if pool is not None:
        for c in missing:
            pool.submit(job_for(tuned, c, plan.spec, arch, fp))
        by_key: dict[str, list[Config]] = {}
        for c in plan.measurable:
            by_key.setdefault(plan.keys[c], []).append(c)

        def pooled() -> Iterator[Config]:
            for k in pool.arrivals(plan.keys[c] for c in plan.measurable):
                yield from by_key[k]
        return pooled, len(plan.measurable)
    for c in missing:
        plan.failures.append({"config": c.to_json(), "error": "missing: no CUBIN in the cache "
                              f"(compile key {plan.keys[c]}); run ctbuild precompile or pass "
                              "--compile-missing"})
    ready = [c for c in plan.measurable if c not in set(missing)]
    return (lambda: iter(ready)), len(ready)


# ---- one kernel x workload -----------------------------------------------------------------
def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def tune_workload(tuned: TunedKernel, w: Mapping[str, Any], *, store: Store | None,
                  toolchain_fp: str | None = None, device: Device | None = None,
                  cap: int = DEFAULT_CAP, timeout_s: float | None = 10.0,
                  configs: Sequence[Config] | None = None, exclude: Mapping[str, str] | None = None,
                  pool: CompilePool | None = None, write: bool = True, seed: int = 0,
                  on_launch: Callable[[Config | None], None] | None = None,
                  stream: Any = None, input_device: Any = None,
                  served: Callable[[Config], ServedKernel] | None = None,
                  settings: TuneSettings | None = None,
                  bucket: Bucket | None = None) -> TuningRecord:
    """Tune one kernel x workload on this GPU from cached CUBINs; return (and store) the record.

    ``w`` holds the call arguments by name: specs (random inputs, or the kernel's ``inputs``
    hook) or real CUDA tensors (online tuning; left as after one launch of the winner).
    ``store`` gives the CUBINs and takes the record (``write``); ``toolchain_fp``, ``device``,
    ``stream`` and ``input_device`` default to the store's toolchain and torch's current GPU
    and stream. ``timeout_s`` bounds each candidate's first launch (`Bench.screen`).
    ``configs`` replaces the pruned space; ``exclude`` ({json config: reason}) records
    failures without launching. ``pool`` compiles absent CUBINs, pipelined (else they are
    reported missing). ``on_launch``: supervision (`Bench.tell`).
    ``served`` gives the kernel per config (the runtime's JIT-compiles a miss under its policy;
    ``store`` may then be None). ``settings``: tie band, race budget, span switch, split
    limit. ``bucket``: the `Dim` bucket ``w`` represents (default: the declared one), measured
    at its other sizes and split where needed; each sub-bucket's record is written beside the
    bucket's. A record whose ``config`` is None (nothing could be measured) is not written.
    """
    import torch

    from ..serve.live_args import call_spec  # with torch: not at `ctbuild tune --help`

    started = time.perf_counter()
    settings = settings or TuneSettings()
    device = device or current_device()
    if served is None and store is None:
        raise ValueError("tune_workload needs a store to read CUBINs from, or served=")
    fp = toolchain_fp or (toolchain_for(store) if store is not None else "")
    real = has_specs(w) is False and len(w) > 0
    spec = call_spec(w) if real else Workload(dict(w))
    plan = plan_candidates(tuned, spec, device.arch, fp, cap, configs, dict(exclude or {}))
    order, n_measure = arrivals(plan, tuned, store, device.arch, fp, pool, served is not None)
    benches = Benches(tuned, store, fp, device, stream=stream, input_device=input_device,
                      seed=seed, served=served, on_launch=on_launch)
    bench = benches.on(Workload(dict(w))) if real else benches.on_spec(spec)
    counter = CompileCounter()
    with (torch.cuda.device(device.index) if benches.on_gpu else contextlib.nullcontext()), \
            counter.active():
        m = measure(tuned, plan, bench, benches, order, n_measure, timeout_s, settings,
                    None if real else bucket or tuned.buckets.get(spec))
    plan.failures += m.failed + _compile_failures(plan, pool) + \
        _all_failed(plan, m.error, pool)
    record = _record(tuned, plan, device, fp, m, settings, real,
                     compiled=_compiled(plan, pool), compiles=counter.total,
                     seconds=time.perf_counter() - started)
    if write and m.decision is not None and store is not None:
        for sub_spec, sub in _sub_records(tuned, plan, device, fp, m, record):
            store.put_tuning(record_key(tuned, sub_spec, device, fp), sub.to_json())
        store.put_tuning(record_key(tuned, spec, device, fp), record.to_json())
    return record


def _compiled(plan: CandidatePlan, pool: CompilePool | None) -> list[str]:
    return [] if pool is None else [plan.keys[c] for c in plan.measurable
                                    if plan.keys[c] in pool.compiled]


def _compile_failures(plan: CandidatePlan, pool: CompilePool | None) -> list[dict[str, Any]]:
    if pool is None:
        return []
    return [{"config": c.to_json(), "error": f"compile: {pool.errors[plan.keys[c]]}"}
            for c in plan.measurable if plan.keys[c] in pool.errors]


def _all_failed(plan: CandidatePlan, error: str | None, pool: CompilePool | None
                ) -> list[dict[str, Any]]:
    """When the search raised (every candidate failed, with the first failure's text), each
    measurable config not failed otherwise is recorded with that text."""
    if error is None:
        return []
    known = {json.dumps(f["config"], sort_keys=True) for f in plan.failures}
    return [{"config": c.to_json(), "error": error} for c in plan.measurable
            if config_key(c) not in known]


def _record(tuned: TunedKernel, plan: CandidatePlan, device: Device, fp: str, m: Measured,
            settings: TuneSettings, real: bool, *, compiled: list[str], compiles: int,
            seconds: float) -> TuningRecord:
    """The tuning record of one key (``config`` None when nothing could be measured)."""
    decision = m.decision
    by_cfg = {t.config: t for t in m.screened}
    if decision is not None and decision.runoff is not None:
        by_cfg.update({t.config: t for t in decision.runoff.timings})  # same clock as winner's
    dflt = by_cfg.get(plan.default)
    choice = decision.choice if decision is not None else None
    winner = by_cfg.get(m.winner) if m.winner is not None else None
    top = m.groups[-1] if m.groups else None
    return TuningRecord(
        kernel=tuned.name, module=tuned.module, kernel_fp=tuned.fingerprint,
        arch=device.arch, gpu=device.name, driver=device.driver, toolchain=fp,
        tuning_key=tuned.tuning_key(plan.spec),
        workload={n: spec_to_json(v) for n, v in plan.spec.items()},
        config=winner.config.to_json() if winner is not None else None,
        compile_key=plan.keys.get(winner.config) if winner is not None else None,
        mean_us=winner.mean_us if winner is not None else None,
        ci_us=winner.ci_us if winner is not None else None,
        default={"config": plan.default.to_json(), "mean_us": dflt.mean_us if dflt else None,
                 "ci_us": dflt.ci_us if dflt else None},
        candidates=[t.to_json() for t in sorted(m.screened, key=lambda t: t.mean_us)],
        failures=plan.failures,
        space={"total": plan.total, "pruned": plan.pruned, "kept": len(plan.space)},
        choice=None if choice is None else {
            "rule": choice.rule if top is None or top.winner == choice.winner.config
            else RULE_SPAN, "band": settings.band.to_json(),
            "fastest": choice.fastest.config.to_json(),
            "ties": [t.to_json() for t in choice.ties]},
        runoff=None if decision is None or decision.runoff is None else {
            **decision.runoff.to_json(), "budget": settings.budget.to_json()},
        regret=None if m.span is None or top is None else m.span.regret_json(
            top, m.span.bucket.to_json(), m.unsplit, m.waves),
        refined=None if m.span is None else refined_json(
            [m.span.as_split(g, top.winner) for g in m.groups[:-1]] if top else [],
            settings.max_splits),
        by_class=_by_class(top, m), check=m.check, compiled_during_tune=len(compiled),
        compiles_during_measurement=compiles,
        measure_seconds=round(m.seconds, 3), seconds=round(seconds, 3),
        phase_seconds={k: round(v, 3) for k, v in m.phases.items()},
        source="online" if real else "workload", tuned_at=_now())


def _sub_records(tuned: TunedKernel, plan: CandidatePlan, device: Device, fp: str,
                 m: Measured, parent: TuningRecord) -> Iterator[tuple[Workload, TuningRecord]]:
    """The records of a split bucket's sub-buckets, keyed by their split points, from the
    times the span measured there."""
    if m.span is None:
        return
    for g in m.groups[:-1]:
        assert g.point is not None
        spec = concretize(m.span.bucket.declared, g.point)
        at = m.span.times[m.span.sizes.index(g.point)]
        win = at[g.winner]
        yield spec, dataclasses.replace(
            parent, tuning_key=tuned.tuning_key(spec),
            workload={n: spec_to_json(v) for n, v in spec.items()},
            config=g.winner.to_json(),
            compile_key=job_for(tuned, g.winner, spec, device.arch, fp).key,
            mean_us=win.mean_us, ci_us=win.ci_us,
            default={"config": plan.default.to_json(),
                     "mean_us": at[plan.default].mean_us if plan.default in at else None,
                     "ci_us": at[plan.default].ci_us if plan.default in at else None},
            candidates=[t.to_json() for t in sorted(at.values(), key=lambda t: t.mean_us)],
            choice={"rule": RULE_SPAN, "band": parent.choice["band"] if parent.choice else None,
                    "fastest": min(at.values(), key=lambda t: t.mean_us).config.to_json(),
                    "ties": []},
            runoff=None, regret=m.span.regret_json(g, g.point, tables=m.waves),
            by_class=_by_class(g, m),
            refined=None, source="split", phase_seconds={}, measure_seconds=None,
            seconds=None)


def _by_class(group: Group | None, m: Measured) -> dict[str, Any] | None:
    """A record's ``by_class``: each layout class's winner, where the group has them, and
    the table a class's calls choose their config by (`ctbuild.waves`), where the bucket has
    one (the same in every record of the bucket: the runtime serves a size alike whichever
    record holds it), with the config the group would serve that class with."""
    if group is None:
        return None
    out: dict[str, Any] = {k: {"config": c.to_json()} for k, c in group.by_class.items()}
    for k, table in m.waves.items():
        out[k] = {"config": group.for_class(k).to_json(),
                  "waves": table.to_json()}
    return out or None
