"""What a plan will cost before anything is built: compile-seconds and tune-seconds per kernel.

Compile seconds come from the cache's records of earlier builds where it has them, else from
the guess the farm schedules by (`job_estimates`: the kernel's TileIR size, from the body
check's front-end runs, and the job's tile volume). Tune seconds: one supervised
process per workload on the tuning GPU (`TUNE_PROCESS_SECONDS`), then each kept config measured
(`TUNE_CONFIG_SECONDS`, or the per-config time the cache's tuning records show for the kernel).
A `Dim` splits its range into buckets, each a workload to build and tune: where one Dim's
buckets make most of a kernel's CUBINs, the plan suggests coarser ``buckets=``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..dims import dims_of
from .job_estimates import JobEstimator, recorded_seconds
from .plan import Plan

#: Seconds to start one tuning process (torch, CUDA context, inputs), per workload.
TUNE_PROCESS_SECONDS = 3.0
#: Seconds to measure one config (CUDA graph, L2 flush, warm-ups, samples until the CI is tight).
TUNE_CONFIG_SECONDS = 0.3
#: A Dim whose buckets make more than this share of a kernel's CUBINs gets a suggestion.
DOMINANT_SHARE = 0.5
#: ... when it has at least this many buckets.
MANY_BUCKETS = 6


@dataclass
class KernelCost:
    kernel: str
    jobs: int
    cached: int                 # jobs already in the cache (nothing to compile)
    compile_seconds: float      # estimated, for the jobs not cached
    recorded: int               # jobs whose estimate is a recorded compile time
    tune_workloads: int         # workloads tuned on one GPU (its arch)
    tune_seconds: float
    advice: str | None = None   # coarser buckets, where a Dim dominates
    tileir_bytes: int | None = None  # its largest TileIR (what guesses use), where known

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _store_facts(cache_dir: Path | None, keys: list[str]
                 ) -> tuple[dict[str, float], set[str], dict[str, float]]:
    """(recorded compile seconds, cached keys, tune seconds per config by kernel) from the
    cache at ``cache_dir``, read-only; empty when there is none (nothing is created)."""
    if cache_dir is None or not Path(cache_dir).is_dir():
        return {}, set(), {}
    from ctbuild.cache import Store

    from ..records import RecordFormatError, TuningRecord
    try:
        with Store(cache_dir, readonly=True) as store:
            known = recorded_seconds(store)
            cached = {k for k in keys if store.has_compile(k)}
            per_config: dict[str, list[float]] = {}
            for _, obj in store.tuning_records():
                try:
                    rec = TuningRecord.from_json(obj)
                except RecordFormatError:
                    continue
                if rec.measure_seconds and rec.candidates:
                    per_config.setdefault(rec.kernel, []).append(
                        rec.measure_seconds / len(rec.candidates))
    except Exception:  # noqa: BLE001 - an estimate never fails the plan
        return {}, set(), {}
    return known, cached, {k: sum(v) / len(v) for k, v in per_config.items()}


def kernel_costs(plan: Plan, cache_dir: Path | None = None,
                 tileir_bytes: Mapping[tuple[str, str], int] | None = None) -> list[KernelCost]:
    """Per kernel of ``plan``, in plan order: jobs, estimated compile and tune seconds
    (``tileir_bytes``: what `body_check.check_bodies` found of each kernel's TileIR)."""
    known, cached, per_config = _store_facts(cache_dir, list(plan.jobs))
    estimate = JobEstimator(known, tileir_bytes)
    keys: dict[str, set[str]] = {}  # a CUBIN two kernels share counts for each of them
    for e in plan.entries:
        keys.setdefault(e.kernel.name, set()).update(e.job_keys)
    out = {name: KernelCost(name, len(ks), 0, 0.0, 0, 0, 0.0) for name, ks in keys.items()}
    for (name, _), size in estimate.tileir_bytes.items():
        if name in out:
            out[name].tileir_bytes = max(size, out[name].tileir_bytes or 0)
    for name, ks in keys.items():
        cost = out[name]
        for key in ks:
            if key in cached:
                cost.cached += 1
                continue
            as_json = {**plan.jobs[key].to_json(), "kernel": name}
            cost.compile_seconds += estimate(as_json)
            cost.recorded += int(estimate.known.get(_ident(as_json)) is not None)
    tune_arch = plan.entries[0].arch if plan.entries else None
    for e in plan.entries:
        cost = out[e.kernel.name]
        if e.arch == tune_arch:
            cost.tune_workloads += 1
            cost.tune_seconds += TUNE_PROCESS_SECONDS + len(e.configs) * per_config.get(
                e.kernel.name, TUNE_CONFIG_SECONDS)
    for cost in out.values():
        cost.advice = bucket_advice(plan, cost.kernel)
    return list(out.values())


def _ident(job: dict[str, Any]) -> str:
    import json
    return json.dumps([job["kernel"], job["arch"], job["config"]], sort_keys=True)


def bucket_advice(plan: Plan, kernel: str) -> str | None:
    """A coarser ``buckets=`` for the Dim whose buckets make most of ``kernel``'s CUBINs."""
    entries = [e for e in plan.entries if e.kernel.name == kernel]
    if not entries:
        return None
    tuned = entries[0].kernel
    total = len({k for e in entries for k in e.job_keys})
    for declared in tuned.dynamic_workloads:
        dims = dims_of(declared)
        keys = {k for e in entries if (b := tuned.buckets.get(e.workload)) is not None
                and b.declared is declared for k in e.job_keys}
        dim = max(dims.values(), key=lambda d: len(d.buckets or ()))
        bounds = list(dim.buckets or ())
        if len(bounds) < MANY_BUCKETS or len(keys) <= DOMINANT_SHARE * total:
            continue
        coarse = sorted(set(bounds[1::2]) | {bounds[-1]})
        return (f"Dim {dim.name!r} ({dim.lo}..{dim.hi}) has {len(bounds)} buckets, which make "
                f"{len(keys)} of {total} CUBINs and as many tunings; coarser "
                f"Dim({dim.name!r}, {dim.lo}, {dim.hi}, buckets={coarse}) would about halve them")
    return None
