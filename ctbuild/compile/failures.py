"""What failed in a build, grouped by cause: one line per kernel and error, with its job count
and the file:line to edit.

A config that fails to compile fails alike for every workload and arch it is built for, and
often for every value of another axis: listed per job, one cause is tens of lines, and
tileiras' errors and timeouts carry no file:line. Grouped by kernel, error type and first line
(the temporary paths tileiras names made alike), each cause is one line: a job or the count
and the first jobs, the error, and where to edit -- the error's own file:line (cuTile's front
end points into the body), else the kernel's declaration (`declared_at`).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Mapping

from .declared_at import declaration_line

if TYPE_CHECKING:
    from ..declare import TunedKernel

#: Jobs a cause's line names before "+N more".
SHOWN_JOBS = 2
#: A front-end error's first line starts with the body's ``file:line[:col]: `` (after its
#: type, where the worker's record keeps it).
_LOCATED = re.compile(r"^(?:\w+: )?\S+:\d+(?::\d+)?: ")
#: The per-job temporary directories a compile's messages may name.
_TEMP = re.compile(r"ctbuild-[A-Za-z0-9_]+")


def failure_causes(failures: list[dict[str, Any]], kernels: Mapping[str, TunedKernel]
                   ) -> list[dict[str, Any]]:
    """One dict per cause (``kernel``, ``error_type``, ``error``, ``where``, ``jobs``: the
    count, ``examples``: the first distinct jobs' arch, dtypes and config), in the order causes
    first failed.
    ``failures``: the build's failed jobs (``kernel``, ``arch``, ``config``, ``error_type``,
    ``error``: its first line)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for f in failures:
        error = f.get("error") or ""
        groups.setdefault((f["kernel"], f.get("error_type") or "", _TEMP.sub("ctbuild-*", error)),
                          []).append(f)
    causes = []
    for (name, etype, _), jobs in groups.items():
        error = jobs[0].get("error") or ""
        kernel = kernels.get(name)
        where = None if _LOCATED.match(error) or kernel is None else declaration_line(kernel)
        examples: list[dict[str, Any]] = []
        for j in jobs:  # a config's exact and relaxed jobs read alike: each shown once
            example = {"arch": j["arch"], "dtypes": _dtypes(j.get("workload")),
                       "config": j.get("config") or {}}
            if example not in examples and len(examples) < SHOWN_JOBS:
                examples.append(example)
        causes.append({"kernel": name, "error_type": etype, "error": error, "where": where,
                       "jobs": len(jobs), "examples": examples})
    return causes


def cause_line(cause: Mapping[str, Any]) -> str:
    """``kernel arch {config}: Type: error (declared at file:line)`` for one job;
    ``kernel, N jobs (arch {config}, ..., +M more): ...`` for more."""
    shown = ", ".join(f"{e['arch']} {e['dtypes']} {{{_config(e['config'])}}}"
                      for e in cause["examples"])
    if cause["jobs"] == 1:
        head = f"{cause['kernel']} {shown}"
    else:
        more = cause["jobs"] - len(cause["examples"])
        head = f"{cause['kernel']}, {cause['jobs']} jobs ({shown}{f', +{more} more' if more else ''})"
    error, etype = cause["error"], cause["error_type"]
    if etype and not error.startswith(etype):
        error = f"{etype}: {error}"
    where = f" (declared at {cause['where']})" if cause.get("where") else ""
    return f"{head}: {error}{where}"


def _dtypes(workload: Mapping[str, Any] | None) -> str:
    """A workload's tensor dtypes, e.g. ``float16`` or ``float16/int32``: what tells a cause's
    jobs of one config apart, mostly."""
    found = sorted({v["dtype"] for v in (workload or {}).values()
                    if isinstance(v, dict) and "dtype" in v})
    return "/".join(found) or "-"


def _config(config: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items())


__all__ = ["cause_line", "failure_causes"]
