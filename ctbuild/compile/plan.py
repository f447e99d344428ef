"""Planning: every kernel x workload x arch, its candidate configs, and the compile jobs.

Jobs are deduplicated by compile key: two workloads whose signatures agree (e.g. shapes that
differ only in a dimension the signature does not see) share one CUBIN.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..arch import Arch
from ..declaration_checks import ReadLog, grid_problem, idle_axis_problem, index_problem
from ..declare import DEFAULT_CAP, DeclarationError, TunedKernel
from ..device_table import nominal_device
from ..dims import dynamic_positions
from ..keys import kernel_compile_key
from ..signature import derive_signature, int_constants
from ..signature_classes import (
    CLASSES,
    EXACT,
    EXACT_WEAKENING,
    GENERIC_WEAKENING,
    RELAXED,
    Weakening,
    param_dynamics,
    weaken,
)
from ..space import HINT_NAMES, Config, UnknownAxisError
from ..specs import Workload, describe, spec_to_json
from ..user_code import where


@dataclass(frozen=True)
class CompileJob:
    """One CUBIN to build. JSON-able so it can travel to farm workers."""
    key: str
    kernel: str
    module: str
    kernel_fp: str
    arch: str
    config: dict[str, Any]
    workload: dict[str, Any]
    symbol: str
    weaken: dict[str, Any] | None = None   # a signature class other than exact (see below)
    #: The signature's integer constants (tile sizes, a head dimension...): what the farm's
    #: estimate of the compile time reads (`job_estimates.tile_volume`).
    constants: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @property
    def cubin_class(self) -> str:
        return Weakening.from_json(self.weaken).cls


@dataclass
class PlanEntry:
    """One kernel x workload x arch."""
    kernel: TunedKernel
    workload: Workload
    arch: Arch
    total: int
    pruned: int
    configs: list[Config]
    default: Config
    job_keys: list[str]                 # every CUBIN of this entry, all classes
    class_keys: dict[str, list[str]] = field(default_factory=dict)  # the same, by class


@dataclass
class Plan:
    entries: list[PlanEntry] = field(default_factory=list)
    jobs: dict[str, CompileJob] = field(default_factory=dict)
    toolchain: str = ""

    def to_json(self) -> dict[str, Any]:
        kernels: dict[str, dict[str, Any]] = {}
        for e in self.entries:
            k = kernels.setdefault(e.kernel.name, {
                "name": e.kernel.name, "module": e.kernel.module,
                "fingerprint": e.kernel.fingerprint, "axes": list(e.kernel.axes), "entries": []})
            k["entries"].append({
                "workload": {n: spec_to_json(v) for n, v in e.workload.items()},
                "arch": str(e.arch), "configs_total": e.total, "configs_pruned": e.pruned,
                "configs": len(e.configs), "default": e.default.to_json(),
                "jobs": len(set(e.job_keys))})
        from .coverage import kernel_coverage
        by_name = {e.kernel.name: e.kernel for e in self.entries}
        for k in kernels.values():
            k["jobs"] = len({key for e in self.entries if e.kernel.name == k["name"]
                             for key in e.job_keys})
            k["coverage"] = kernel_coverage(self, by_name[k["name"]])
        return {"jobs": len(self.jobs), "toolchain": self.toolchain,
                "kernels": list(kernels.values())}


def job_for(kernel: TunedKernel, cfg: Config, w: Workload, arch: str, toolchain_fp: str,
            weakening: Weakening = EXACT_WEAKENING) -> CompileJob:
    """The compile job (and key) of one config; the farm worker re-derives it to check."""
    return job_and_signature(kernel, cfg, w, arch, toolchain_fp, weakening)[0]


def job_and_signature(kernel: TunedKernel, cfg: Config, w: Workload, arch: str,
                      toolchain_fp: str, weakening: Weakening = EXACT_WEAKENING,
                      devices: Mapping[str, Any] | None = None) -> tuple[CompileJob, Any]:
    """`job_for`, plus the `KernelSignature` it was keyed on (what a compile needs): the
    workload's own signature, or the one ``weakening`` derives from it (a signature class)."""
    try:
        kernel_args = kernel.kernel_args(cfg, w)
        signature = weaken(derive_signature(kernel.kernel, kernel_args, mangled=False),
                           weakening, kernel.pyfunc.__name__)
        kernel.resolved_hints(cfg, arch)
        grid = kernel.grid(cfg, w, nominal_device(arch, devices))
    except UnknownAxisError as exc:
        raise kernel.error(str(exc).split(": ", 1)[-1]) from None
    except DeclarationError:
        raise
    except Exception as exc:  # grid/args are user code: any error is a declaration problem
        raise kernel.error(f"config {cfg!r} on {describe(w)}: {type(exc).__name__}: {exc}"
                           f"{where(exc)}") from None
    if problem := index_problem(kernel.kernel_params, kernel_args, signature) or \
            grid_problem(grid):
        raise kernel.error(f"config {cfg!r} on {describe(w)}: {problem}")
    key = kernel_compile_key(kernel, cfg, signature, arch, toolchain_fp)
    return CompileJob(key=key, kernel=kernel.name, module=kernel.module,
                      kernel_fp=kernel.fingerprint, arch=str(arch), config=cfg.to_json(),
                      workload={n: spec_to_json(v) for n, v in w.items()},
                      symbol=signature.symbol or "",
                      weaken=None if weakening.cls == EXACT else weakening.to_json(),
                      constants=int_constants(signature)), signature


def relaxed_weakening(kernel: TunedKernel, cfg: Config, w: Workload) -> Weakening | None:
    """The relaxed class of a bucket's representative workload (None for a static one)."""
    bucket = kernel.buckets.get(w)
    if bucket is None:
        return None
    return Weakening(RELAXED, param_dynamics(kernel.kernel_args(cfg, w), w,
                                             dynamic_positions(bucket.declared)))


def check_axes_reach(kernel: TunedKernel, configs: Sequence[Config], w: Workload,
                     dev: Any) -> None:
    """Every axis must reach the compile: a kernel parameter (bound by name), a cuTile hint,
    or a value grid/args/hints read. Else its values are duplicates, or a hint the user thinks
    applied is not (Triton's ``num_warps=[4, 8]`` in a cuTile space): raise naming the axis."""
    reached = set(HINT_NAMES) if kernel.hints_fn is None else set()
    if kernel.args_fn is None:
        reached |= set(kernel.kernel_params)
    if not set(kernel.axes) - reached:
        return
    for cfg in configs:
        log = ReadLog(cfg, kernel.name)
        kernel.grid(log, w, dev)
        kernel.kernel_args(log, w)
        kernel.hints(log)
        reached |= log.reads
    if idle := sorted(set(kernel.axes) - reached):
        raise kernel.error(idle_axis_problem(idle[0], kernel.kernel_params))


def make_plan(kernels: Sequence[TunedKernel], archs: Sequence[Arch], toolchain_fp: str,
              cap: int = DEFAULT_CAP,
              extra_workloads: dict[str, list[Workload]] | None = None, *,
              generic: bool = True, devices: Mapping[str, Any] | None = None) -> Plan:
    """Enumerate and prune every space; raise `DeclarationError` naming the first problem.

    Per kernel x workload x arch x kept config: the exact CUBIN, and for a bucket of a dynamic
    workload the relaxed one; per workload the generic CUBIN of its default config (unless
    ``generic=False``). Jobs are deduplicated by compile key."""
    plan = Plan(toolchain=toolchain_fp)
    for kernel in kernels:
        workloads = list(kernel.workloads) + list((extra_workloads or {}).get(kernel.name, []))
        if not workloads:
            raise kernel.error("declares no workloads; add workloads=[{...}] so the build "
                               "knows what to compile")
        for w in workloads:
            for arch in archs:
                cands = kernel.candidates(w, arch, cap)
                by_class: dict[str, list[str]] = {c: [] for c in CLASSES}

                # called only within this iteration, so the loop variables are the current ones
                def add(cfg: Config, weakening: Weakening) -> None:
                    job = job_and_signature(kernel, cfg, w, arch,  # noqa: B023
                                            toolchain_fp, weakening, devices)[0]
                    plan.jobs.setdefault(job.key, job)
                    by_class[weakening.cls].append(job.key)  # noqa: B023

                for cfg in cands.kept:
                    add(cfg, EXACT_WEAKENING)
                    relaxed = relaxed_weakening(kernel, cfg, w)
                    if relaxed is not None:
                        add(cfg, relaxed)
                if generic:
                    add(cands.default, GENERIC_WEAKENING)
                if w is workloads[0] and arch == archs[0]:
                    check_axes_reach(kernel, cands.kept, w, nominal_device(arch, devices))
                keys = [k for c in CLASSES for k in by_class[c]]
                plan.entries.append(PlanEntry(kernel, w, arch, cands.total, len(cands.pruned),
                                              cands.kept, cands.default, keys, by_class))
    return plan


__all__ = ["CompileJob", "Plan", "PlanEntry", "make_plan", "job_for", "job_and_signature",
           "DeclarationError"]
