"""Planning: every kernel x workload x arch, its candidate configs, and the compile jobs.

Jobs are deduplicated by compile key: two workloads whose signatures agree (e.g. shapes that
differ only in a dimension the signature does not see) share one CUBIN.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from .arch import Arch
from .declare import DEFAULT_CAP, DeclarationError, TunedKernel
from .keys import kernel_compile_key
from .signature import SignatureError, derive_signature
from .space import Config, UnknownAxisError
from .specs import Workload, describe, spec_to_json


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

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


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
    job_keys: list[str]


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
        for k in kernels.values():
            k["jobs"] = len({key for e in self.entries if e.kernel.name == k["name"]
                             for key in e.job_keys})
        return {"jobs": len(self.jobs), "toolchain": self.toolchain,
                "kernels": list(kernels.values())}


def job_for(kernel: TunedKernel, cfg: Config, w: Workload, arch: str, toolchain_fp: str
            ) -> CompileJob:
    """The compile job (and key) of one config; the farm worker re-derives it to check."""
    return job_and_signature(kernel, cfg, w, arch, toolchain_fp)[0]


def job_and_signature(kernel: TunedKernel, cfg: Config, w: Workload, arch: str,
                      toolchain_fp: str) -> tuple[CompileJob, Any]:
    """`job_for`, plus the `KernelSignature` it was keyed on (what a compile needs)."""
    try:
        signature = derive_signature(kernel.kernel, kernel.kernel_args(cfg, w))
        kernel.resolved_hints(cfg, arch)
        kernel.grid(cfg, w)
    except UnknownAxisError as exc:
        raise kernel.error(str(exc).split(": ", 1)[-1]) from None
    except (SignatureError, TypeError, ValueError) as exc:
        raise kernel.error(f"config {cfg!r} on {describe(w)}: {exc}") from None
    key = kernel_compile_key(kernel, cfg, signature, arch, toolchain_fp)
    return CompileJob(key=key, kernel=kernel.name, module=kernel.module,
                      kernel_fp=kernel.fingerprint, arch=str(arch), config=cfg.to_json(),
                      workload={n: spec_to_json(v) for n, v in w.items()},
                      symbol=signature.symbol or ""), signature


def make_plan(kernels: Sequence[TunedKernel], archs: Sequence[Arch], toolchain_fp: str,
              cap: int = DEFAULT_CAP,
              extra_workloads: dict[str, list[Workload]] | None = None) -> Plan:
    """Enumerate and prune every space; raise `DeclarationError` naming the first problem."""
    plan = Plan(toolchain=toolchain_fp)
    for kernel in kernels:
        workloads = list(kernel.workloads) + list((extra_workloads or {}).get(kernel.name, []))
        if not workloads:
            raise kernel.error("declares no workloads; add workloads=[{...}] so the build "
                               "knows what to compile")
        for w in workloads:
            for arch in archs:
                cands = kernel.candidates(w, arch, cap)
                keys = []
                for cfg in cands.kept:
                    job = job_for(kernel, cfg, w, arch, toolchain_fp)
                    plan.jobs.setdefault(job.key, job)
                    keys.append(job.key)
                plan.entries.append(PlanEntry(kernel, w, arch, cands.total, len(cands.pruned),
                                              cands.kept, cands.default, keys))
    return plan


__all__ = ["CompileJob", "Plan", "PlanEntry", "make_plan", "job_for", "job_and_signature",
           "DeclarationError"]
