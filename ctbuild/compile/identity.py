"""The identity check: does every compile key still mean the code it was built from?

Every compile entry records the digest of the anonymized TileIR bytecode its CUBIN was built
from. For each entry of a project kernel whose key this checkout still derives (same kernel
fingerprint, same toolchain), the check re-runs cuTile's front end and compares digests. A
mismatch means the fingerprint missed something the front end compiles (a hole in the key), or
for a kernel whose identity rests on its TileIR (`ctbuild.fingerprint.by_tileir`), that what
it reads (the environment, a file) differs here from where it was built: either way the cache
would serve a CUBIN of other code under a key that claims this code. An entry this checkout
derives that cannot be checked (no digest or workload recorded, or its workload no longer
gives its key) fails the check too: nothing says what code it is.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..declare import TunedKernel
from ..records import CompileMeta, RecordFormatError
from ..signature_classes import Weakening
from ..space import Config
from ..specs import Workload, spec_from_json
from ..tileir import derive as tileir
from .plan import job_and_signature


@dataclass
class IdentityReport:
    """What the check found. ``mismatches`` name kernels whose key maps to other bytecode."""
    checked: int = 0
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    #: entries of this checkout's kernels that cannot be checked, and why
    unverifiable: list[dict[str, Any]] = field(default_factory=list)
    stale: int = 0          # built from other sources: their keys are no longer derived
    other_toolchain: int = 0
    foreign: int = 0        # kernels outside this project
    frontend_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.unverifiable

    def to_json(self) -> dict[str, Any]:
        return {**{k: v for k, v in self.__dict__.items()}, "ok": self.ok,
                "frontend_seconds_per_entry": round(self.frontend_seconds / self.checked, 4)
                if self.checked else None}

    def text(self) -> str:
        lines = [f"identity: {m['kernel']} config {m['config']} {m['arch']}: key {m['key'][:16]} "
                 f"was built from TileIR {m['recorded'][:16]}, these sources give "
                 f"{m['now'][:16]}; the kernel fingerprint misses something the compiled "
                 "code depends on" for m in self.mismatches]
        lines += [f"identity: {u['kernel']} config {u['config']} {u['arch']}: key "
                  f"{u['key'][:16]} cannot be checked: {u['why']}; rebuild it (remove the "
                  "entry, then `ctbuild precompile`)" for u in self.unverifiable]
        per = f" ({self.frontend_seconds / self.checked * 1000:.0f} ms front end each)" \
            if self.checked else ""
        lines.append(f"{self.checked} entries re-derived{per}, {len(self.mismatches)} mismatched, "
                     f"{len(self.unverifiable)} unverifiable; not this checkout's: {self.stale} "
                     f"from other sources, {self.other_toolchain} of another toolchain, "
                     f"{self.foreign} of kernels outside the project")
        return "\n".join(lines)


def verify_identity(kernels: Iterable[TunedKernel], entries: Iterable[tuple[str, dict]],
                    toolchain_fp: str) -> IdentityReport:
    """Re-run the front end for every entry (key, meta) of ``kernels`` under ``toolchain_fp``
    and compare its TileIR digest with the recorded one."""
    by_name = {(k.module, k.name): k for k in kernels}
    report = IdentityReport()
    for key, stored in entries:
        try:
            meta = CompileMeta.from_json(stored)
        except RecordFormatError:
            report.foreign += 1
            continue
        kernel = by_name.get((meta.module or "", meta.kernel))
        if kernel is None:
            report.foreign += 1
        elif meta.toolchain != toolchain_fp:
            report.other_toolchain += 1
        elif kernel.fingerprint != meta.kernel_fp:
            report.stale += 1
        else:
            _check_entry(kernel, key, meta, toolchain_fp, report)
    return report


def _check_entry(kernel: TunedKernel, key: str, meta: CompileMeta, toolchain_fp: str,
                 report: IdentityReport) -> None:
    """Check one entry whose kernel fingerprint and toolchain are this checkout's."""
    naming = {"kernel": kernel.name, "module": kernel.module, "config": meta.config,
              "arch": meta.arch, "key": key}
    if not meta.tileir or meta.config is None or meta.arch is None or meta.workload is None:
        missing = [n for n, v in (("TileIR digest", meta.tileir), ("config", meta.config),
                                  ("arch", meta.arch), ("workload", meta.workload)) if not v]
        report.unverifiable.append({**naming, "why": f"no {', '.join(missing)} recorded"})
        return
    cfg = Config(meta.config, kernel.name)
    w = Workload({n: spec_from_json(v) for n, v in meta.workload.items()})
    job, signature = job_and_signature(kernel, cfg, w, meta.arch, toolchain_fp,
                                       Weakening.from_json(meta.weaken))
    if job.key != key:
        report.unverifiable.append({**naming, "why": "its recorded workload and config give "
                                                     f"another key ({job.key[:16]})"})
        return
    start = time.perf_counter()
    now = tileir(kernel, cfg, signature, meta.arch).digest
    report.frontend_seconds += time.perf_counter() - start
    report.checked += 1
    if now != meta.tileir:
        report.mismatches.append({**naming, "config": cfg.to_json(), "recorded": meta.tileir,
                                  "now": now})
