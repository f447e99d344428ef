"""Check every kernel's body with cuTile's front end before anything is compiled.

A type error or an unsupported construct in a kernel body, or a hint value this tileiras cannot
take (``num_worker_warps`` other than 4 or 8 under 13.4: cuTile's front end refuses it for
that bytecode version), otherwise shows up only when its CUBINs compile: once per job, after
the farm has started. cuTile's front end (Python AST to TileIR, no tileiras) takes about 23 ms,
so ``plan`` and ``precompile`` run it on one job of each class of jobs it can answer
differently for: kernel, arch, the workload's dtype and rank pattern (with its ``ct.Constant``
values) and the config's compiler hints; the job is the class's default config where the class
holds it. Each distinct problem is reported once per kernel, with the user's file:line (a hint's
at its declaration, `declared_at`) and the classes it hit. What only some tile sizes trigger (a
tile that is not a power of two) still surfaces at precompile, grouped by cause
(`ctbuild.compile.failures`). The size of each TileIR the front end gives is kept: it is what
a kernel without recorded compile times is estimated by (`job_estimates`).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from ..declare import TunedKernel
from ..space import Config
from ..specs import Workload, spec_from_json
from .declared_at import declaration_line
from .plan import CompileJob, Plan, PlanEntry, job_and_signature

#: Classes a report line names before "+N more".
SHOWN_CLASSES = 2


@dataclass(frozen=True)
class BodyProblem:
    """What the front end refused for one class: where (``file:line``), what, and the hint
    whose value alone made it refuse (None: the body itself)."""
    where: str | None
    text: str
    hint: str | None = None

    def line(self) -> str:
        head = f"hint {self.hint}" if self.hint else "kernel body"
        return f"{head}: {self.where + ': ' if self.where else ''}{self.text}"


def job_classes(plan: Plan) -> dict[tuple, CompileJob]:
    """One exact job per class (kernel, arch, dtype/rank/constant pattern, resolved hints),
    the class's default config where it has one, in plan order."""
    out: dict[tuple, CompileJob] = {}
    for e in plan.entries:
        keys = e.class_keys.get("exact") or e.job_keys
        default = e.default.to_json()
        pattern = _pattern(e)
        for job in (plan.jobs[k] for k in keys if k in plan.jobs):
            hints = e.kernel.resolved_hints(Config(job.config, e.kernel.name), job.arch)
            cls = (e.kernel.name, job.arch, pattern, json.dumps(hints, sort_keys=True))
            if cls not in out or (job.config == default and out[cls].config != default):
                out[cls] = job
    return out


def _pattern(e: PlanEntry) -> tuple:
    """What of a workload the front end compiles differently: each tensor's dtype and rank,
    each scalar's type, each ``ct.Constant``'s value."""
    constants = e.kernel.constant_args(e.workload)
    out: list[tuple] = []
    for name, spec in sorted(e.workload.items()):
        dtype, ndim = getattr(spec, "dtype", None), getattr(spec, "ndim", None)
        if dtype is not None:
            out.append((name, str(dtype), ndim))
        else:
            out.append((name, repr(spec) if name in constants else type(spec).__name__))
    return tuple(out)


def body_problem(kernel: TunedKernel, job: CompileJob, devices: Any = None,
                 tileir_bytes: dict[tuple[str, str], int] | None = None) -> BodyProblem | None:
    """What the front end refuses in ``job`` (with file:line), or None; where it takes the job,
    the size of the TileIR goes into ``tileir_bytes`` under (kernel, arch), the largest of the
    kernel's classes there."""
    from .compiler import tileir
    cfg = Config(job.config, kernel.name)
    w = Workload({k: spec_from_json(v) for k, v in job.workload.items()})
    signature = job_and_signature(kernel, cfg, w, job.arch, "body-check", devices=devices)[1]
    try:
        size = len(tileir(kernel, cfg, signature, job.arch).bytecode)
    except Exception as exc:  # noqa: BLE001 - the user's kernel body: any error is reported
        text = f"{type(exc).__name__}: {one_line(exc)}"
        if (where := location(exc)) is not None:
            return BodyProblem(where, text)
        hint = _hint_cause(kernel, cfg, signature, job.arch)
        return BodyProblem(declaration_line(kernel, hint), text,
                           None if hint is None else f"{hint}={cfg.to_json()[hint]}")
    if tileir_bytes is not None:
        group = (kernel.name, job.arch)
        tileir_bytes[group] = max(size, tileir_bytes.get(group, 0))
    return None


def _hint_cause(kernel: TunedKernel, cfg: Config, signature: Any, arch: str) -> str | None:
    """The config's hint axis without which the front end takes the job (its value is what
    it refused), or None: an error with no location in the body comes from a hint or from
    cuTile itself, and only trying tells which."""
    from .compiler import tileir
    values = cfg.to_json()
    for axis in [a for a in kernel.hints(cfg) if a in values]:
        try:
            tileir(kernel, Config({k: v for k, v in values.items() if k != axis}, kernel.name),
                   signature, arch)
        except Exception:  # noqa: BLE001 - not this hint (or a hints= that needs it)
            continue
        return axis
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
    return f"{shown(filename)}:{line}" + (f":{col}" if col is not None else "")


def shown(filename: str) -> str:
    """The path as the user would type it: relative below the working directory."""
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") or filename.startswith("<") else rel


def _describe(kernel: TunedKernel, job: CompileJob) -> str:
    """A class as a report names it: arch, dtypes, the config's hints."""
    dtypes = sorted({v["dtype"] for v in job.workload.values()
                     if isinstance(v, dict) and "dtype" in v})
    hints = ", ".join(f"{k}={v}" for k, v in kernel.hints(Config(job.config, kernel.name)).items())
    return f"{job.arch} {'/'.join(dtypes) or '-'}" + (f" {{{hints}}}" if hints else "")


def check_bodies(plan: Plan, devices: Any = None,
                 tileir_bytes: dict[tuple[str, str], int] | None = None) -> list[str]:
    """One line per kernel and distinct problem: ``kernel 'name' (module): kernel body:
    file:line: ...`` (or ``hint NAME=V: file:line: ...``), naming the classes it hit when
    others passed. ``tileir_bytes`` gets each (kernel, arch)'s TileIR size (`body_problem`)."""
    from ..cutile import max_bytecode_version
    from ..toolchain import compile_environment
    try:  # asks tileiras (once per process, cached), in the env every compile runs in
        with compile_environment():
            max_bytecode_version()
    except Exception:  # noqa: BLE001 - a broken toolchain is the probe's to report
        return []
    by_name = {e.kernel.name: e.kernel for e in plan.entries}
    classes = job_classes(plan)
    hit: dict[tuple[str, BodyProblem], list[tuple]] = {}
    for cls, job in classes.items():
        if (problem := body_problem(by_name[cls[0]], job, devices, tileir_bytes)) is not None:
            hit.setdefault((cls[0], problem), []).append(cls)
    lines = []
    for (name, problem), where in hit.items():
        total = sum(1 for c in classes if c[0] == name)
        shown_classes = ", ".join(_describe(by_name[name], classes[c])
                                  for c in where[:SHOWN_CLASSES])
        more = f", +{len(where) - SHOWN_CLASSES} more" if len(where) > SHOWN_CLASSES else ""
        scope = "" if len(where) == total else \
            f" (in {len(where)} of {total} job classes: {shown_classes}{more})"
        lines.append(str(by_name[name].error(problem.line() + scope)))
    return lines
