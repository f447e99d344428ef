"""``ctbuild precompile``: compile every planned config to CUBINs in the cache, on Ray.

The driver loads the project, probes the toolchain, plans, records the toolchain profile in the
cache, skips keys already cached and hands the rest to the farm (`ctbuild.farm.Farm`), whose workers
compile and send the CUBINs back; the driver alone writes the cache. Into an empty cache Ray
starts in the background while the toolchain is probed and the plan made. Ray and the farm are
imported only when this runs.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..arch import Arch
from ..atomic_write import check_writable, write_json
from ..compile.failures import failure_causes
from ..compile.miss_records import RecordFileError, read_records
from ..declare import TunedKernel
from ..project import ConfigError, Project, select_kernels
from ..specs import Workload
from .common import (
    EXIT_USAGE,
    add_kernel_arg,
    add_project_args,
    fail,
    guarded,
    non_negative_int,
    positive_int,
    positive_seconds,
    print_json,
    project_from_args,
)
from .farm_choice import add_farm_arg, farm_mode, is_small

DEFAULT_TIMEOUT = 300.0

EPILOG = """\
examples:
  ctbuild precompile --config examples/ctbuild.toml --cache /cache
  ctbuild precompile --arch sm_90,sm_100 --workers 8 --compile-timeout 120
  ctbuild precompile --address 10.0.0.5:6379 --cache /cache   # existing Ray cluster
  ctbuild precompile --from-record /logs/ctbuild-misses.jsonl --report build/precompile.json
  ctbuild precompile --json --allow-failures | jq .failed
  ctbuild precompile --kernel matmul --cache /cache   # the kernel being edited only

A small build (estimated compile work under 8 s per worker) and a machine without Ray
compile on local worker processes, never waiting for Ray (--farm auto; --farm ray or local
to choose). Each kernel's body goes through cuTile's front end first, once per class of jobs
(arch, dtype pattern, hints): an error in it, or a hint value this tileiras cannot take, is
reported once per cause, with file:line, exit 2. Otherwise an embedded local Ray with one
worker per core is started (a few seconds) and stopped at the end; into an empty cache it
starts while the toolchain is probed and the plan made, otherwise only when something is
left to compile. While it starts, --early-workers local processes (default: one per worker,
leaving 2 cores to Ray) compile; each Ray worker that is up replaces one. --address (or
$RAY_ADDRESS) joins an existing cluster instead: the ctbuild package (its farm and cache
included) and the project's kernel modules are shipped to the workers, which need
cuda-tile[tileiras], ray, diskcache and xxhash installed, but no cache path and no shared
filesystem: workers send each CUBIN back and this process alone stores it (and reads it
back) in --cache. Longest configs go first (by the compile seconds the cache recorded for
them in earlier builds, else by the size of the kernel's TileIR, from that front end, and its
tile sizes). Two builds into one cache never compile the same key twice. A full disk stops
the build (exit 1); every CUBIN stored until then is kept.

Workers drop CUDA_HOME/CUDA_PATH so the pip tileiras with its own ptxas/libnvvm is used; a
worker whose toolchain fingerprint differs from this machine's aborts the build.
A config that fails to compile or exceeds --compile-timeout is reported (one line per cause:
its job count and file:line) and skipped, never cached; a worker that crashes has its job
retried elsewhere (twice at most).

--from-record FILE reads JSON lines written at run time (CTBUILD_RECORD=FILE) or by hand, e.g.
  {"kernel": "matmul", "workload": {"A": {"tensor": [512, 4096], "dtype": "float16"}, "B": {"tensor": [4096, 4096], "dtype": "float16"}, "C": {"tensor": [512, 4096], "dtype": "float16"}}, "arch": "sm_90"}
and plans those workloads too (on every target arch; a recorded arch is added to the targets).
A tensor may add "strides" (elements; default contiguous) and "align" (bytes, a power of two
>= the element size; default 256); a scalar is {"scalar": "int32", "example": 7}. A file
holds at most 16 MiB, a line 64 KiB; a bad line fails the build naming FILE:LINE.

exit status: 0 all built (or --allow-failures), 1 some job failed or the build was aborted,
2 bad input (config, declarations, flags, record file, unusable cache directory), 130/143
interrupted by SIGINT/SIGTERM (Ray and the workers are stopped; finished CUBINs are kept).
"""  # noqa: E501 - the --from-record example is one JSON line, as users paste it


def add_parser(sub: argparse._SubParsersAction, name: str, summary: str) -> None:
    p = sub.add_parser(name, help=summary, description=summary, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_project_args(p)
    add_kernel_arg(p, "build")
    add_farm_arg(p)
    p.add_argument("--address", metavar="ADDR",
                   help="join this Ray cluster, e.g. 10.0.0.5:6379 (default: $RAY_ADDRESS; "
                        "unset: start an embedded local Ray)")
    p.add_argument("--workers", metavar="N", type=positive_int,
                   help="worker processes at most (default: this machine's cores, or the "
                        "cluster's CPUs)")
    p.add_argument("--early-workers", metavar="N", type=non_negative_int,
                   help="local processes that compile while the embedded Ray starts (default: "
                        "one per worker, leaving two cores to Ray: none on 2 cores; 0: none)")
    p.add_argument("--compile-timeout", metavar="S", type=positive_seconds,
                   default=DEFAULT_TIMEOUT,
                   help=f"seconds one config may compile before it is recorded as failed "
                        f"(default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--allow-failures", action="store_true",
                   help="exit 0 even when some configs failed (they are still reported)")
    p.add_argument("--report", metavar="PATH",
                   help="write every job's record (key, kernel, config, arch, status, seconds, "
                        "when it started and finished after the first worker was ready, error) "
                        "as JSON to PATH")
    p.add_argument("--from-record", metavar="FILE", action="append", default=[],
                   help="also plan the workloads recorded at run time in FILE (JSON lines); "
                        "repeatable")
    p.set_defaults(run=guarded(run))


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    report, problem = _report_path(args.report)
    if problem is not None:
        return fail(problem)
    from ..compile.worker_setup import STRIPPED_ENV
    dropped = [k for k in STRIPPED_ENV if os.environ.pop(k, None) is not None]

    project = project_from_args(args)
    kernels = select_kernels(project.kernels(), args.kernels)
    try:
        extra, record_archs = read_records(args.from_record, kernels)
    except RecordFileError as exc:
        return fail(str(exc))
    mode, note = farm_mode(args)
    args.farm = mode
    stream = sys.stderr if args.json else sys.stdout
    if not args.json and dropped:
        print(f"note: ignoring {', '.join(dropped)} (the pip tileiras uses its own ptxas/libnvvm)",
              file=stream)
    if note:
        print(f"note: {note}", file=stream)
    farm = _make_farm(args, project)
    out = sys.stdout
    try:
        # Ray's driver threads print cluster events (e.g. "A worker died...") to sys.stdout;
        # keep stdout for our output (one JSON object with --json) and send those to stderr.
        with contextlib.redirect_stdout(sys.stderr):
            if _cache_is_cold(project.cache_dir):  # surely something to build: Ray (if used)
                args.tileir_bytes = {}  # the body check's, for the estimates (job_estimates)
                checked = _start_early(args, project, kernels, extra, record_archs, farm)
                if checked is not None:              # starts while the toolchain is probed
                    return checked
            return _build(args, project, kernels, extra, record_archs, farm, stream, out,
                          report, started)
    finally:
        with contextlib.redirect_stdout(sys.stderr):
            farm.close()


def _archs(project: Project, record_archs: list[Arch]) -> list[Arch]:
    return list(project.archs) + [a for a in record_archs if a not in project.archs]


def _start_early(args: argparse.Namespace, project: Project, kernels: list[TunedKernel],
                 extra: dict[str, list[Workload]], record_archs: list[Arch], farm: Any
                 ) -> int | None:
    """Into an empty cache: plan (with a placeholder toolchain: the job count is the same),
    check the kernel bodies (their TileIR sizes into ``args.tileir_bytes``), and start Ray in
    the background unless the build stays local. Returns an exit status when a body is wrong
    (before any Ray started), else None."""
    from ..compile.job_estimates import JobEstimator
    from ..compile.plan import make_plan
    from ..cutile import load_compiler_without_torch
    load_compiler_without_torch()  # planning needs no torch either: about 1 s sooner
    plan = make_plan(kernels, _archs(project, record_archs), "unprobed", project.cap,
                     extra_workloads=extra, generic=project.generic, devices=project.devices)
    if (code := _report_bodies(plan, project, args.tileir_bytes)) is not None:
        return code
    jobs = [job.to_json() for job in plan.jobs.values()]
    estimate = JobEstimator({}, args.tileir_bytes)
    if args.farm == "ray" or (args.farm == "auto" and not is_small(jobs, estimate,
                                                                    args.workers)):
        farm.start_in_background()
    return None


def _report_bodies(plan: Any, project: Project, tileir_bytes: dict[tuple[str, str], int]
                   ) -> int | None:
    """Each kernel whose body cuTile's front end rejects, once, with file:line: exit 2.
    ``tileir_bytes`` gets the size of each kernel's TileIR."""
    from ..compile.body_check import check_bodies
    problems = check_bodies(plan, project.devices, tileir_bytes)
    for line in problems:
        fail(line)
    return EXIT_USAGE if problems else None


def _use_local(args: argparse.Namespace, farm: Any, store: Any, jobs: list[dict[str, Any]],
               estimate: Any) -> None:
    """Settle where the jobs compile when no Ray was started early: local processes for
    ``--farm local`` or a small build (`farm_choice.is_small`) under ``auto``."""
    if farm.ray_requested:
        return
    todo = [j for j in jobs if not store.has_compile(j["key"])]
    farm.options.local_only = args.farm == "local" or (
        args.farm == "auto" and is_small(todo, estimate, args.workers))


def _cache_is_cold(cache_dir: Path) -> bool:
    """Whether the cache holds no compile entry yet (then a build compiles, surely)."""
    from ctbuild.cache import Store
    try:
        with Store(cache_dir, readonly=True) as store:
            return next(iter(store.compile_entries()), None) is None
    except Exception:  # noqa: BLE001 - an unusable cache is reported later, with its reason
        return False


def _build(args: argparse.Namespace, project: Project, kernels: list[TunedKernel],
           extra: dict[str, list[Workload]], record_archs: list[Arch], farm: Any, stream: Any,
           out: Any, report: Path | None, started: float) -> int:
    """Probe, plan, compile on ``farm``; the summary goes to ``out`` (the real stdout)."""
    from ..compile.job_estimates import estimator
    from ..compile.plan import make_plan
    from ..cutile import load_compiler_without_torch
    from ..toolchain import probe, record_in, shareable
    archs = _archs(project, record_archs)
    load_compiler_without_torch()  # planning needs no torch either: about 1 s sooner
    toolchain = probe()
    plan = make_plan(kernels, archs, toolchain.fingerprint, project.cap, extra_workloads=extra,
                     generic=project.generic, devices=project.devices)
    tileir_bytes = getattr(args, "tileir_bytes", None)
    if tileir_bytes is None:  # not checked early
        tileir_bytes = {}
        if (code := _report_bodies(plan, project, tileir_bytes)) is not None:
            return code
    jobs = {key: job.to_json() for key, job in plan.jobs.items()}

    import sqlite3

    from ctbuild.cache import CacheError, Store
    try:
        with Store(project.cache_dir, readonly=False) as store:
            record_in(store, toolchain)
            estimate = estimator(store, tileir_bytes)
            farm.options.estimate, farm.options.learn = estimate, estimate.learn
            farm.options.running = estimate.running
            _use_local(args, farm, store, list(jobs.values()), estimate)
    except (CacheError, OSError, ValueError, sqlite3.Error) as exc:
        return fail(f"cache {project.cache_dir}: {exc}")
    farm.options.expect = {"toolchain": toolchain.fingerprint}
    modules, paths = farm.options.setup_args[:2]  # workers here take this probe (`adopt`)
    farm.options.setup_args = (modules, paths, shareable(toolchain))

    todo = list(jobs.values())
    from ..compile.ir_check import check_cached, remember_build
    guard, ir_check = check_cached(project.cache_dir, project.modules, modules_paths(project),
                                   toolchain.fingerprint, todo, args.workers,
                                   toolchain.profile.get("bytecode_version"))
    estimate.plan(todo)
    result, error = _run_farm(args, farm, todo, stream)
    if error is not None:
        return fail(error, 1)
    remember_build(guard, project.cache_dir,
                   [r.key for r in result.records if r.status == "compiled"])

    rows = _job_rows(result.records, jobs)
    failures = _failures(result.records, rows)
    summary = _summary(result, rows, failures, started=started, toolchain=toolchain.fingerprint,
                       archs=archs, cache_dir=project.cache_dir, ir_check=ir_check.to_json())
    summary["causes"] = failure_causes(failures, {k.name: k for k in kernels})
    if report is not None:
        write_json(report, {"summary": summary, "worker_info": result.worker_info,
                               "jobs": rows})
    return _print_outcome(args, out, summary, result.fatal)


def _report_path(given: str | None) -> tuple[Path | None, str | None]:
    """(the file --report writes, or why it cannot be written): checked before the build, so a
    wrong path fails at once. A link is followed; a device, FIFO or directory is refused."""
    if not given:
        return None, None
    from ctbuild.cache.user_files import NotAFileError
    try:
        report = check_writable(given)
    except NotAFileError as exc:
        return None, f"--report {exc}"
    if not report.parent.is_dir():
        return None, f"--report {given}: directory {report.parent} does not exist"
    return report, None


def _job_rows(records: list[Any], jobs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per job record, with what its job built (kernel, arch, config, workload): the
    --report's jobs, and what the per-kernel summary counts."""
    rows = []
    for rec in records:
        job = jobs[rec.key]
        rows.append({"key": rec.key, "kernel": job["kernel"], "arch": job["arch"],
                     "config": job["config"], "workload": job["workload"],
                     "status": rec.status, "seconds": round(rec.seconds, 4),
                     "attempts": rec.attempts, "worker": rec.worker,
                     "started_s": rec.started, "finished_s": rec.finished,
                     "error_type": rec.error_type, "error": rec.error})
    return rows


def _failures(records: list[Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The failed jobs, each with only its error's first line: short enough to print."""
    return [{"key": r["key"], "kernel": r["kernel"], "arch": r["arch"],
             "config": r["config"], "workload": r["workload"], "error_type": r["error_type"],
             "error": records[i].first_error_line}
            for i, r in enumerate(rows) if r["status"] == "failed"]


def _summary(result: Any, rows: list[dict[str, Any]], failures: list[dict[str, Any]], *,
             started: float, toolchain: str, archs: list[Arch], cache_dir: Path,
             ir_check: dict[str, Any]) -> dict[str, Any]:
    """The build's summary (printed, --json's document, --report's head): the counts, where
    the time went, where it ran, each kernel's counts and the failures."""
    from ..compile.progress import kernel_summary
    return {
        "jobs": len(rows), "compiled": result.count("compiled"),
        "cached": result.count("cached"), "failed": result.count("failed"),
        "seconds": round(time.perf_counter() - started, 3), "workers": result.workers,
        "early_workers": result.early_workers,
        "farm": "local" if result.local_only else "ray",
        "startup_seconds": round(result.startup_seconds, 3),
        "startup_steps": result.startup_steps,
        "run_seconds": round(result.run_seconds, 3),
        "worker_seconds": round(result.worker_seconds, 3),
        "compile_seconds": round(sum(r["seconds"] for r in rows), 3),
        # worker-seconds beyond the jobs' own (compile seconds, which count cuTile's front end,
        # plus ctbuild's ~10 ms a job): workers open with no job, waiting for the longest
        "idle_seconds": round(result.worker_seconds - sum(
            r["finished_s"] - r["started_s"] for r in rows if r["started_s"] is not None
            and r["finished_s"] is not None), 3),
        "restarts": result.restarts, "toolchain": toolchain,
        "archs": [str(a) for a in archs], "cache": str(cache_dir),
        "address": result.address, "fatal": result.fatal,
        "kernels": kernel_summary(rows), "failures": failures,
        "ir_check": ir_check,
    }


def _print_outcome(args: argparse.Namespace, out: Any, summary: dict[str, Any],
                   fatal: str | None) -> int:
    """Print the summary to ``out`` (JSON or the table) and a fatal error to stderr; the exit
    status: 1 when the build was aborted, or some job failed without --allow-failures."""
    from ..compile.progress import render_summary
    failures = summary["failures"]
    with contextlib.redirect_stdout(out):
        if args.json:
            print_json(summary)
        else:
            print(render_summary(summary["kernels"], summary))
    if fatal:
        print(f"error: {fatal}", file=sys.stderr)
    if fatal or (failures and not args.allow_failures):
        return 1
    return 0


def modules_paths(project: Project) -> list[str]:
    """Where the project's kernel modules are imported from (what workers put on sys.path)."""
    return [str(p) for p in project.paths]


def _make_farm(args: argparse.Namespace, project: Project) -> Any:
    """The farm for this build (not started): where it runs, what workers import and strip."""
    import ctbuild
    from ctbuild.farm import Farm, FarmError, FarmOptions
    from ctbuild.farm.cluster import module_paths, resolve_address

    from ..compile.worker_setup import STRIPPED_ENV

    address = resolve_address(args.address)
    paths = [str(p) for p in project.paths]
    ship: list[str] = []
    if address is not None:  # ship our package (farm and cache are in it) and the kernel modules
        try:
            ship = [str(Path(str(ctbuild.__file__)).parent)]
            ship += module_paths(project.modules, paths)
        except FarmError as exc:
            raise ConfigError(str(exc)) from None
    options = FarmOptions(
        workers=args.workers, address=address, compile_timeout=args.compile_timeout,
        early_workers=args.early_workers,
        setup_fn="ctbuild.compile.worker_setup:warm_worker",
        setup_args=(list(project.modules), paths if address is None else []),
        sys_paths=paths, ship=ship, fatal_errors=("CompileMismatchError",),
        strip_env=STRIPPED_ENV)
    return Farm(project.cache_dir, "ctbuild.compile.compiler:compile_job", options)


def _run_farm(args: argparse.Namespace, farm: Any, jobs: list[dict[str, Any]],
              stream: Any) -> tuple[Any, str | None]:
    """Run the jobs on the farm with a progress display; (result, None) or (None, error)."""
    from ctbuild.farm import FarmError

    from ..compile.progress import Progress

    progress = Progress(len(jobs), stream)

    def on_start(todo: int) -> None:
        where = f"Ray at {farm.address}" if farm.address else "embedded Ray"
        if farm.options.local_only:
            where = "local processes (no Ray)"
        progress.phase(f"{todo} to compile, {len(jobs) - todo} cached; starting workers on "
                       f"{where}")

    try:
        result = farm.run(jobs, on_record=progress.record, on_tick=progress.tick,
                          on_start=on_start, on_ready=progress.workers_ready)
    except FarmError as exc:
        progress.close()
        return None, str(exc)
    except KeyboardInterrupt:  # SIGINT or SIGTERM: the CLI says so, after the farm closed
        progress.close()
        raise
    progress.close()
    return result, None
