"""``ctbuild tune``: measure the precompiled candidates on this GPU and record the winners."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from ..bucket_map import MAX_SPLITS
from ..tune.choice import TieBand, TieBandError
from ..tune.report import record_band, served_worst
from ..tune.span import DEFAULT_SPLITS
from ..waves import describe
from .common import (
    add_project_args,
    fail,
    guarded,
    positive_int,
    positive_seconds,
    print_json,
    project_from_args,
)

if TYPE_CHECKING:
    from ..tune.session import TuneOptions
    from ..tune.tuner import Device
    from ..tune.warm import WarmLanes

EPILOG = """\
examples:
  ctbuild tune --config examples/ctbuild.toml --cache /cache
  ctbuild tune --config examples/ctbuild.toml --compile-missing --report tune.html
  ctbuild tune --kernel matmul --retune --json
  ctbuild tune --verify --config examples/ctbuild.toml     # a new GPU, driver or node
  ctbuild tune --gpus all                                  # every GPU of this node
  ctbuild tune --no-refine                                 # one winner per Dim bucket

For every declared kernel x workload, on this GPU's arch, every precompiled candidate is
measured with cuTile's exhaustive_search (CUDA graph per sample, L2 flush, 95% CI) from the
cache's CUBINs: nothing is compiled while measuring. A candidate without a CUBIN is reported
(or compiled first, in a local process pool, with --compile-missing). A failing, faulting or
hanging candidate is recorded as failed; the others still get measured.

Every candidate's outputs are checked against the default config's on the same inputs (or
against the kernel's check=): a candidate that computes something else is recorded as failed
("wrong result: ...") and never wins.

The candidates near the fastest then race: re-measured interleaved, round by round, so that
the GPU's clock drift hits all of them alike, the surely slower dropped, until they separate or
a budget ends. Candidates within the tie band of the fastest (default: 2%, or overlapping 95%
CIs, up to twice the band) are ties, and among ties the winner is fixed: the declared default
config if it is one, else the first in the declared space order. So two tunes of the same keys
agree unless a candidate sits at the band's edge. The record keeps the ties, every finalist's
time and the rule that chose.

A dynamic workload (ctbuild.Dim) is tuned once per bucket, for every size the bucket serves:
every candidate races again at the bucket's lower bound, powers of two and one above each,
midpoints and the size below a bound that is a multiple of 16 (along each Dim; over several
Dims, every combination), and the winner is the config whose worst loss over those sizes and
the upper bound is smallest (ties by the same rule). Where no config is within the band at
every size, the bucket is split along the Dim that leaves the least loss, at most --refine N
times (default 3; a kernel's max_splits= sets its own; --no-refine: never), and each part
that still loses along another Dim: each sub-bucket's winner is recorded under its split
point's own key and served for the sizes up to it. A bucket left unsplit with a loss
above the band says why, on its line, in its record and in the report.

Tuned entries are skipped unless --retune. Workloads added by `ctbuild precompile
--from-record` (found in the cache) are tuned too. Exit 0 when every kernel x workload got a
record (with --verify: every recorded winner still ties with the fastest), 1 when some did
not, 2 on bad input.
"""


def add_parser(sub: argparse._SubParsersAction, name: str, summary: str) -> None:
    p = sub.add_parser(name, help=summary, description=summary, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_project_args(p, archs=False)
    p.add_argument("--report", metavar="PATH",
                   help="write an HTML report (charts of candidate times) and PATH.json")
    p.add_argument("--retune", action="store_true",
                   help="measure again entries that already have a tuning record")
    p.add_argument("--compile-missing", action="store_true",
                   help="compile candidates with no CUBIN in a local process pool (pipelined "
                        "with measuring) instead of reporting them")
    p.add_argument("--kernel", metavar="NAME", action="append", default=[],
                   help="tune only this kernel (repeatable, or comma-separated)")
    p.add_argument("--timeout", metavar="S", type=positive_seconds, default=10.0,
                   help="seconds a candidate's first launch at each size may take before it "
                        "is recorded as hung (default: 10)")
    p.add_argument("--workers", metavar="N", type=positive_int, default=None,
                   help="compile processes for --compile-missing (default: CPUs - 1, max 16)")
    p.add_argument("--tie-band", metavar="PCT", type=tie_band, default=TieBand(),
                   help="candidates within PCT%% of the fastest (or with 95%% CIs "
                        "overlapping within twice PCT) tie; among ties the default config, "
                        "else the first in space order, wins (default: 2; between 0 and 50)")
    p.add_argument("--gpus", metavar="LIST",
                   help="measure on these GPUs of this node, 'all' or indices such as 0,1: one "
                        "measuring process each, each taking the next key (longest first) when "
                        "it is free; a key whose winner is not decided is re-measured on every "
                        "GPU and decided on the median across them (default: the current GPU)")
    p.add_argument("--verify", action="store_true",
                   help="re-measure the recorded winners against their ties and finalists on "
                        "this GPU and report drift; rewrites nothing")
    p.add_argument("--refine", metavar="N", nargs="?", type=refine_count,
                   const=DEFAULT_SPLITS, default=None,
                   help="split a Dim bucket at most N times along each Dim where no config is "
                        f"within the tie band at all its sizes (default: {DEFAULT_SPLITS}; 1 to "
                        f"{MAX_SPLITS}; a kernel's max_splits= sets its own)")
    p.add_argument("--no-refine", action="store_true",
                   help="never split a Dim bucket: one winner for all its sizes")
    p.add_argument("--no-isolate", action="store_true",
                   help="tune in this process (default: a supervised child process, restarted "
                        "without a candidate that kills its CUDA context)")
    p.set_defaults(run=guarded(run))


def refine_count(text: str) -> int:
    """argparse type of --refine N: the most split points per bucket."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_SPLITS:
        raise argparse.ArgumentTypeError(f"expected a number of splits along each Dim of a "
                                         f"bucket, from 1 to {MAX_SPLITS}, got {text!r}")
    return n


def tie_band(text: str) -> TieBand:
    """argparse type of --tie-band: a percent in (0, 50)."""
    try:
        return TieBand.parse(text)
    except TieBandError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def gpus_of(text: str) -> list[int]:
    """--gpus: the GPU indices, all of one model (records are keyed by the GPU's name)."""
    import torch

    from ..tune.fleet import GpuListError, parse_gpus
    gpus = parse_gpus(text, torch.cuda.device_count())
    names = {torch.cuda.get_device_name(g) for g in set(gpus)}
    if len(names) > 1:
        raise GpuListError(f"--gpus names GPUs of several models ({', '.join(sorted(names))}): "
                           "tune each model on its own (records are per GPU model)")
    return gpus


def lanes_device(text: str | None, reports: list[dict[str, Any]] | None
                 ) -> tuple[list[int] | None, Device] | None:
    """``--gpus`` and the GPU to tune on as the measuring processes started for them saw them
    (`ctbuild.tune.warm.WarmLanes.gpus`), so that this process starts no CUDA of its own; None
    where they did not all report one model (`gpus_of` and `current_device` then ask torch,
    and name what is wrong)."""
    from ..tune.tuner import Device
    from ..tune.warm import expected_gpus
    if not reports or len({(r["name"], r["arch"]) for r in reports}) != 1:
        return None
    gpus = expected_gpus(text)
    if gpus is not None and len(gpus) != len(reports):
        return None
    return gpus, Device(gpus[0] if gpus else 0, **reports[0])


def _fmt_us(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}"


def _line(s: dict[str, Any]) -> str:
    status = s["status"]
    head = f"{status:<8} {s['kernel']:<14} {s['workload'][:60]:<60}"
    if s.get("winner") is None:
        return f"{head} {s.get('note', '')}"
    fails = len(s.get("failures", []))
    speed = s.get("speedup_vs_default")
    return (f"{head} {_fmt_us(s['mean_us'])}±{_fmt_us(s['ci_us'])} us  default "
            f"{_fmt_us(s['default_us'])} us" + (f" ({speed:.2f}x)" if speed else "")
            + f"  winner {s['winner']}" + (f"  {fails} failed" if fails else ""))


def run(args: argparse.Namespace) -> int:
    from ..tune.warm import WarmLanes

    if problem := report_problem(args.report):
        return fail(problem)
    project = project_from_args(args)
    kernels = project.kernels()
    only = [n for item in args.kernel for n in item.split(",") if n]
    if problem := selection_problem(args, kernels, only):
        return fail(problem)
    if args.gpus is not None and args.no_isolate:
        return fail("--gpus runs one measuring process per GPU: drop --no-isolate")
    # the measuring processes import torch and make their CUDA contexts while this one does
    warm = None if args.verify or args.no_isolate else WarmLanes.for_gpus(args.gpus)
    try:
        return tune_project(args, project, kernels, only, warm)
    finally:
        if warm is not None:
            warm.close()


def tune_project(args: argparse.Namespace, project: Any, kernels: list, only: list[str],
                 warm: WarmLanes | None) -> int:
    """`run` once the arguments are checked and the ``warm`` lanes started."""
    from ctbuild.cache import Store

    from ..toolchain import toolchain_for
    from ..tune.fleet import FleetRun, GpuListError
    from ..tune.recorded import recorded_workloads
    from ..tune.session import entries_for, tune_entries
    from ..tune.tuner import current_device

    seen = lanes_device(args.gpus, warm.gpus()) if warm is not None else None
    gpus, device = seen if seen is not None else (None, None)
    if device is None and args.gpus is not None:
        try:
            gpus = gpus_of(args.gpus)
        except GpuListError as exc:
            return fail(str(exc))
    try:
        device = device or current_device(gpus[0] if gpus else None)
    except RuntimeError as exc:
        return fail(str(exc), 1)
    store = Store(project.cache_dir)
    entries = entries_for(kernels, only, recorded_workloads(store, kernels, device.arch))
    if not entries:
        return fail("no kernel x workload to tune (declare workloads=[...])")
    fp = toolchain_for(store)
    if args.verify:
        return verify(entries, store, device, fp, args)
    def check() -> None:
        check_identity(project, [k for k in kernels if not only or k.name in only],
                       device.arch, fp, recorded_workloads(store, kernels, device.arch),
                       args.workers)
    opts = tune_options(args, project)
    quiet = bool(args.json)
    emit = _printer(quiet)
    if not quiet:
        print(f"tuning {len(entries)} kernel x workload(s) on {device.name} ({device.arch}), "
              f"cache {project.cache_dir}, toolchain {fp[:12]}", flush=True)
    start = time.perf_counter()
    fleet: dict[str, Any] = {}
    if args.no_isolate:
        check()
        summaries = tune_entries(entries, store, opts, device=device, toolchain_fp=fp, emit=emit)
    else:
        run_on = FleetRun(str(project.path.resolve()) if project.path else None,
                          str(project.cache_dir), opts, gpus or [device.index], only,
                          pin=gpus is not None, warm=warm)
        summaries, fleet = gated(run_on, check, entries, store, device, fp, emit)
        if len(run_on.gpus) > 1 and not quiet:
            _print_fleet(summaries, fleet)
    out = tune_result(project, device, fp, time.perf_counter() - start, summaries, fleet)
    return finish(args, out)


def gated(run_on: Any, check: Callable[[], None], entries: list, store: Any, device: Any,
          fp: str, emit: Callable[[dict[str, Any]], None]
          ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`tune_fleet` with its measuring processes started while the identity ``check`` runs
    in this process: they wait for it at a gate (`ctbuild.tune.gate`)."""
    from ..tune.fleet import tune_fleet
    from ..tune.gate import Gate
    with tempfile.TemporaryDirectory(prefix="ctbuild-gate-") as tmp:
        run_on.gate = Gate(Path(tmp) / "identity-checked").after(check)
        out = tune_fleet(run_on, entries, store, device, fp, emit)
        run_on.gate.finish()
    return out


def report_problem(report: str | None) -> str | None:
    """Why --report (the page and PATH.json) cannot be written, checked before anything is
    measured: a device, FIFO or directory is refused, a link followed (`ctbuild.cache.user_files`)."""
    if report is None:
        return None
    from ctbuild.cache.user_files import NotAFileError

    from ..atomic_write import check_writable
    try:
        for path in (report, report + ".json"):
            check_writable(path)
    except NotAFileError as exc:
        return f"--report {exc}"
    return None


def selection_problem(args: argparse.Namespace, kernels: list, only: list[str]) -> str | None:
    """Why the kernels named by --kernel (and --refine on them) cannot be tuned (None: they can)."""
    names = {k.name for k in kernels}
    if unknown := [n for n in only if n not in names]:
        return f"unknown kernel(s) {unknown}; declared: {', '.join(sorted(names))}"
    if args.refine is not None and args.no_refine:
        return "--refine N and --no-refine contradict each other: give one"
    if args.refine is not None:
        return refine_problem(args, kernels, only)
    return None


def tune_options(args: argparse.Namespace, project: Any) -> TuneOptions:
    """The measuring options from the command line and the project (cap, paths)."""
    from ..tune.session import TuneOptions
    return TuneOptions(retune=args.retune, compile_missing=args.compile_missing,
                       timeout_s=args.timeout, cap=project.cap,
                       paths=[str(p) for p in project.paths], workers=args.workers,
                       tie_band=args.tie_band.percent,
                       refine=0 if args.no_refine else args.refine or DEFAULT_SPLITS)


def _printer(quiet: bool) -> Callable[[dict[str, Any]], None]:
    """What is done with each entry's summary as it is tuned: its line (and its bucket's
    lines) printed at once, so a long tune shows progress; nothing with --json."""
    def emit(s: dict[str, Any]) -> None:
        if not quiet:
            print("\n".join([_line(s), *span_lines(s)]), flush=True)
    return emit


def _print_fleet(summaries: list[dict[str, Any]], fleet: dict[str, Any]) -> None:
    """With several GPUs: the entries decided across them, then the GPUs measured slow."""
    for s in summaries:
        if s.get("record", {}).get("fleet"):
            print("fleet    " + _line(s)[9:], flush=True)
    for slow in fleet["slow_gpus"]:
        print(f"GPU {slow['gpu']} measured {100 * (slow['ratio'] - 1):.1f}% slower than "
              "the fleet median on the same candidates", flush=True)


def tune_result(project: Any, device: Any, fp: str, seconds: float,
                summaries: list[dict[str, Any]], fleet: dict[str, Any]) -> dict[str, Any]:
    """The tune's result (--json's document, the report's data): where, how long, the counts
    by status and every entry's summary."""
    return {
        "gpu": device.name, "arch": device.arch, "driver": device.driver, "toolchain": fp,
        "cache": str(project.cache_dir), "seconds": round(seconds, 3),
        "tuned": sum(s["status"] == "tuned" for s in summaries),
        "skipped": sum(s["status"] == "skipped" for s in summaries),
        "failed": sum(s["status"] == "failed" for s in summaries),
        "compiles_during_measurement": sum(
            s.get("compiles_during_measurement", 0) for s in summaries if s["status"] == "tuned"),
        "entries": summaries,
        **({"fleet": fleet} if fleet else {}),
    }


def finish(args: argparse.Namespace, out: dict[str, Any]) -> int:
    """Write --report, print the result (JSON, or the totals line) and return the exit code:
    1 when an entry failed."""
    quiet = bool(args.json)
    if args.report:
        from ..tune.report import write_report
        html_path, json_path = write_report(Path(args.report), out)
        if not quiet:
            print(f"report: {html_path} (data: {json_path})")
    if quiet:
        print_json(out)
    else:
        print(f"{out['tuned']} tuned, {out['skipped']} skipped (already tuned), {out['failed']} "
              f"failed in {out['seconds']:.1f} s; compiles during measurement: "
              f"{out['compiles_during_measurement']}")
    sys.stdout.flush()
    return 0 if out["failed"] == 0 else 1


def refine_problem(args: argparse.Namespace, kernels: list, only: list[str]) -> str | None:
    """Why ``--refine`` cannot run with these arguments (None: it can)."""
    if args.verify:
        return "--refine tunes and writes records, --verify rewrites nothing: run them apart"
    chosen = [k for k in kernels if not only or k.name in only]
    if not any(k.dynamic_workloads for k in chosen):
        return (f"--refine splits Dim buckets, and no selected kernel "
                f"({', '.join(sorted(k.name for k in chosen))}) declares a Dim workload: drop "
                "--refine or select a kernel with Dim workloads (--kernel)")
    return None


def span_lines(s: dict[str, Any]) -> list[str]:
    """How a Dim bucket is served: a line per sub-bucket it was split into, or why a bucket
    whose worst loss is above the band was not split."""
    rec = s.get("record") or {}
    regret = rec.get("regret") if isinstance(rec.get("regret"), dict) else None
    if regret is None or s.get("status") != "tuned":
        return []
    head = f"{'bucket':<8} {s['kernel']:<14}"
    band = record_band(rec)
    lines = []
    for sp in (rec.get("refined") or {}).get("splits") or []:
        sub = ", ".join(f"{n}<={v}" for n, v in sorted(sp["sizes"].items()))
        pct = sp.get("regret_pct")
        lines.append(f"{head} split: sub-bucket {sub} has its own winner"
                     + ("" if pct is None else f" (the bucket's was {pct:.1f}% slower there)"))
    by_class = rec.get("by_class") if isinstance(rec.get("by_class"), dict) else {}
    if by_class:
        lines.append(f"{head} a winner per layout class: " + "; ".join(
            f"{k} {json.dumps((v or {}).get('config'), sort_keys=True)}{describe(v)}"
            for k, v in sorted(by_class.items())))
    worst = served_worst(regret)
    if regret.get("unsplit") and worst > band:
        lines.append(f"{head} not split further, worst loss {worst:.1f}% over the bucket's "
                     f"sizes (band {band:g}%): {regret['unsplit']}")
    return lines


def check_identity(project: Any, kernels: list, arch: str, fp: str,
                   recorded: dict[str, list], workers: int | None) -> None:
    """The TileIR backstop (`ctbuild.compile.ir_check`) on the cached entries this tune relies on,
    as ``precompile`` runs it: an entry whose re-derived TileIR differs from the digest recorded
    when it was compiled (a hole in the kernel fingerprint) is removed with a warning, so it is
    reported missing, or compiled again with --compile-missing, never measured stale. Uses the
    recorded toolchain's bytecode version: a tuning node needs no tileiras for it."""
    from ..arch import Arch
    from ..compile.ir_check import check_cached
    from ..compile.plan import make_plan

    def jobs() -> Iterator[dict[str, Any]]:  # planned only where something is unverified
        yield from (j.to_json() for j in make_plan(kernels, [Arch(arch)], fp, project.cap,
                                                   recorded).jobs.values())
    check_cached(project.cache_dir, project.modules, [str(p) for p in project.paths], fp,
                 jobs(), workers, settled=(arch, {(k.module, k.name) for k in kernels}))


def _verify_line(v: dict[str, Any]) -> str:
    head = f"{v['status']:<10} {v['kernel']:<14}"
    if v["status"] not in ("agrees", "drifted"):
        return f"{head} {v.get('note', '')}"
    change = v.get("time_change_pct")
    return (f"{head} recorded {v['recorded']} on {v['recorded_on']}: "
            f"{v['winner_slower_pct']:+.1f}% vs the fastest now {v['fastest']}"
            + ("" if change is None else f"; {change:+.1f}% vs its recorded time"))


def verify(entries: list, store: Any, device: Any, fp: str, args: argparse.Namespace) -> int:
    """``--verify``: one line (or JSON item) per entry; exit 1 when a winner drifted."""
    import torch

    from ..tune.verify import verify_entry
    out = []
    with torch.cuda.device(device.index):
        for e in entries:
            v = {**verify_entry(e, store, device, fp, args.tie_band), "workload": e.label}
            out.append(v)
            if not args.json:
                print(_verify_line(v), flush=True)
    counts = {k: sum(v["status"] == k for v in out)
              for k in ("agrees", "drifted", "unmeasured", "unrecorded")}
    if args.json:
        print_json({"gpu": device.name, "arch": device.arch, "toolchain": fp,
                    "band": args.tie_band.to_json(), **counts, "entries": out})
    else:
        print(", ".join(f"{n} {k}" for k, n in counts.items()) + f" on {device.name}")
    return 0 if counts["drifted"] == 0 and counts["unmeasured"] == 0 else 1
