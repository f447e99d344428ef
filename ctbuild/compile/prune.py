"""Which cache entries belong to kernel versions the project no longer plans (``ctbuild cache
prune``).

A kernel's fingerprint (`ctbuild.fingerprint`) names one version of its source; every compile
entry and tuning record records the fingerprint it was built or tuned for. After an edit the
old version's entries can never be served again, but a rollback may want them back: per kernel
the planned fingerprint is kept, then the most recently written others, ``keep`` in all.
Kernels the project does not declare (another project may share the cache) and entries without
a fingerprint are left alone. Only this side knows fingerprints; the store removes what it is
told (`ctbuild.cache.Store.drop`).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..records import CompileMeta, RecordFormatError, TuningRecord

#: The latest ``created`` taken as a time (9999-12-31T23:59:59Z): later is no time a clock gave.
LATEST = 253402300799.0


@dataclass
class Version:
    """One fingerprint of one kernel and its entries in the cache."""
    kernel: str
    fingerprint: str
    compile_keys: list[str] = field(default_factory=list)
    tuning_keys: list[str] = field(default_factory=list)
    newest: float = 0.0  # when its last entry was written

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "fingerprint": self.fingerprint, "newest": self.newest,
                "compile_entries": len(self.compile_keys), "tuning_records": len(self.tuning_keys)}


@dataclass
class PrunePlan:
    """What stays (per kernel, planned fingerprint first) and what goes."""
    kept: dict[str, list[Version]] = field(default_factory=dict)
    dropped: list[Version] = field(default_factory=list)
    undeclared: dict[str, int] = field(default_factory=dict)  # kernel -> entries left alone
    unversioned: int = 0  # entries of declared kernels that record no fingerprint

    @property
    def compile_keys(self) -> list[str]:
        return [k for v in self.dropped for k in v.compile_keys]

    @property
    def tuning_keys(self) -> list[str]:
        return [k for v in self.dropped for k in v.tuning_keys]


def _versions(planned: Mapping[str, str], compiles: Iterable[tuple[str, dict[str, Any]]],
              tunings: Iterable[tuple[str, dict[str, Any]]], plan: PrunePlan
              ) -> dict[tuple[str, str], Version]:
    """Group the entries of declared kernels by (kernel, fingerprint); count the others."""
    found: dict[tuple[str, str], Version] = {}
    for kind, entries in (("compile", compiles), ("tuning", tunings)):
        for key, raw in entries:
            try:
                rec: CompileMeta | TuningRecord = CompileMeta.from_json(raw) if kind == "compile" \
                    else TuningRecord.from_json(raw)
            except RecordFormatError:
                plan.unversioned += 1
                continue
            if rec.kernel not in planned:
                plan.undeclared[rec.kernel] = plan.undeclared.get(rec.kernel, 0) + 1
                continue
            if not rec.kernel_fp:
                plan.unversioned += 1
                continue
            v = found.setdefault((rec.kernel, rec.kernel_fp), Version(rec.kernel, rec.kernel_fp))
            (v.compile_keys if kind == "compile" else v.tuning_keys).append(key)
            v.newest = max(v.newest, _written_at(rec.created))
    return found


def _written_at(created: Any) -> float:
    """When an entry was written, as its stored ``created`` says; 0.0 (unknown, as for an entry
    that records none) unless that is a plausible time. A shared cache may hold anything there
    (another writer, a hand-made bundle): a string, a list, ``Infinity`` or a year past 9999
    must neither stop a prune nor rank as the newest version."""
    if isinstance(created, bool) or not isinstance(created, (int, float)):
        return 0.0
    return float(created) if 0.0 <= created <= LATEST else 0.0


def plan_prune(planned: Mapping[str, str], compiles: Iterable[tuple[str, dict[str, Any]]],
               tunings: Iterable[tuple[str, dict[str, Any]]], keep: int) -> PrunePlan:
    """``planned``: kernel name -> the fingerprint the project plans now. Per kernel, the
    planned fingerprint and the ``keep - 1`` most recently written others stay."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    plan = PrunePlan()
    by_kernel: dict[str, list[Version]] = {}
    for v in _versions(planned, compiles, tunings, plan).values():
        by_kernel.setdefault(v.kernel, []).append(v)
    for kernel, versions in sorted(by_kernel.items()):
        ordered = sorted(versions, key=lambda v: (v.fingerprint != planned[kernel], -v.newest))
        stay = keep if any(v.fingerprint == planned[kernel] for v in versions) else keep - 1
        plan.kept[kernel] = ordered[:stay]
        plan.dropped += ordered[stay:]
    return plan
