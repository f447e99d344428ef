"""Check every kernel's body with cuTile's front end before anything is compiled.

A type error or an unsupported construct in a kernel body otherwise shows up only when its
CUBINs compile: once per job, after the farm has started. cuTile's front end (Python AST to
TileIR, no tileiras) takes about 23 ms per kernel, so ``plan`` and ``precompile`` run it once per
kernel, on one representative job (the first workload's default config, exact signature, first
arch), and report each kernel's error once with the user's file:line.
"""
from __future__ import annotations

import os
from typing import Any

from ..declare import TunedKernel
from ..space import Config
from ..specs import Workload, spec_from_json
from .plan import CompileJob, Plan, job_and_signature


def representative_jobs(plan: Plan) -> dict[str, CompileJob]:
    """Per kernel name, the exact job of its first entry's default config."""
    out: dict[str, CompileJob] = {}
    for e in plan.entries:
        if e.kernel.name in out:
            continue
        keys = e.class_keys.get("exact") or e.job_keys
        jobs = [plan.jobs[k] for k in keys if k in plan.jobs]
        default = [j for j in jobs if j.config == e.default.to_json()]
        if default or jobs:
            out[e.kernel.name] = (default or jobs)[0]
    return out


def body_problem(kernel: TunedKernel, job: CompileJob, devices: Any = None) -> str | None:
    """One line naming the body error of ``kernel`` (with file:line), or None."""
    from .compiler import tileir
    cfg = Config(job.config, kernel.name)
    w = Workload({k: spec_from_json(v) for k, v in job.workload.items()})
    signature = job_and_signature(kernel, cfg, w, job.arch, "body-check", devices=devices)[1]
    try:
        tileir(kernel, cfg, signature, job.arch)
    except Exception as exc:  # noqa: BLE001 - the user's kernel body: any error is reported
        return f"kernel body: {_describe(exc)}"
    return None


def one_line(exc: BaseException) -> str:
    """cuTile's message on one line (its location goes on lines of its own)."""
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return "; ".join(line.strip() for line in str(message).splitlines() if line.strip())


def location(exc: BaseException) -> str | None:
    """``file:line:col`` in the user's kernel that a cuTile front-end error points at."""
    loc = getattr(exc, "loc", None)
    filename, line = getattr(loc, "filename", None), getattr(loc, "line", None)
    if not (filename and line):
        return None
    col = getattr(loc, "col", None)
    return f"{_shown(filename)}:{line}" + (f":{col}" if col is not None else "")


def _describe(exc: BaseException) -> str:
    where = location(exc)
    return f"{where + ': ' if where else ''}{type(exc).__name__}: {one_line(exc)}"


def _shown(filename: str) -> str:
    """The path as the user would type it: relative below the working directory."""
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") or filename.startswith("<") else rel


def check_bodies(plan: Plan, devices: Any = None) -> list[str]:
    """Each kernel's body error as ``kernel 'name' (module): kernel body: file:line: ...``."""
    from ..cutile import max_bytecode_version
    from ..toolchain import compile_environment
    try:  # asks tileiras (once per process, cached), in the env every compile runs in
        with compile_environment():
            max_bytecode_version()
    except Exception:  # noqa: BLE001 - a broken toolchain is the probe's to report
        return []
    by_name = {e.kernel.name: e.kernel for e in plan.entries}
    problems = []
    for name, job in representative_jobs(plan).items():
        kernel = by_name[name]
        if (problem := body_problem(kernel, job, devices)) is not None:
            problems.append(str(kernel.error(problem)))
    return problems
