"""``ctbuild plan``: what would be compiled, without compiling anything."""
from __future__ import annotations

import argparse

from ..compile.body_check import check_bodies
from ..compile.coverage import refined_buckets, refined_lines, summary_lines
from ..compile.plan import make_plan
from ..compile.plan_costs import KernelCost, kernel_costs
from ..declare import TunedKernel
from ..declared_inputs import unset_integer_args
from ..fingerprint import by_tileir
from ..project import select_kernels
from ..specs import describe
from ..toolchain import ToolchainError, probe
from .common import (
    EXIT_USAGE,
    add_kernel_arg,
    add_project_args,
    fail,
    guarded,
    print_json,
    project_from_args,
)

EPILOG = """\
examples:
  ctbuild plan --config examples/ctbuild.toml
  ctbuild plan --config examples/ctbuild.toml --arch sm_90,sm_100 --json
  ctbuild plan --kernel matmul --kernel rmsnorm     # only these kernels

Jobs are deduplicated by compile key, so the job count is the number of CUBINs a clean
precompile builds. Each kernel's body goes through cuTile's front end (no compile) once per
class of jobs (arch, dtype pattern, hints), so a body error, or a hint value this tileiras
cannot take, is reported here, one line per cause, with its file:line. Buckets that `ctbuild
tune --refine` split in the cache are listed with their split points. Estimated compile
seconds come from the times the cache recorded in earlier builds, else from the size of the
kernel's TileIR (what that front end gave) and its tile sizes; tune seconds assume one
tuning process per workload and about 0.3 s per config. Exit 2 on a bad declaration, kernel
body or config (the message names the kernel).
"""


def add_parser(sub: argparse._SubParsersAction, name: str, summary: str) -> None:
    p = sub.add_parser(name, help=summary, description=summary, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_project_args(p, cache=False)
    add_kernel_arg(p, "plan")
    p.set_defaults(run=guarded(run))


def toolchain_fingerprint() -> tuple[str, str | None]:
    """The local toolchain's fingerprint, or a placeholder and the reason it is missing."""
    try:
        return probe().fingerprint, None
    except ToolchainError as exc:
        return "unprobed", str(exc)


def run(args: argparse.Namespace) -> int:
    from ..cutile import load_compiler_without_torch
    project = project_from_args(args)
    kernels = select_kernels(project.kernels(), args.kernels)
    load_compiler_without_torch()  # after the kernels' modules (see there): ~1 s sooner
    fp, problem = toolchain_fingerprint()
    plan = make_plan(kernels, project.archs, fp, project.cap, generic=project.generic,
                     devices=project.devices)
    tileir_bytes: dict[tuple[str, str], int] = {}
    if problem is None and (bodies := check_bodies(plan, project.devices, tileir_bytes)):
        for line in bodies:
            fail(line)
        return EXIT_USAGE
    costs = kernel_costs(plan, project.cache_dir, tileir_bytes)
    refined = refined_buckets(project.cache_dir, kernels)
    if args.json:
        out = plan.to_json()
        by_name = {c.kernel: c.to_json() for c in costs}
        marked = {k.name: m.to_json() for k in kernels if (m := by_tileir(k)) is not None}
        for k in out["kernels"]:
            k["estimate"] = by_name.get(k["name"])
            k["refined"] = refined.get(k["name"], [])
            k["identity_by_tileir"] = marked.get(k["name"])
        if problem:
            out["toolchain_problem"] = problem
        print_json(out)
        return 0
    if problem:
        print(f"warning: no toolchain ({problem}); keys use a placeholder, kernel bodies "
              "unchecked")
    print(f"{'kernel':<16} {'arch':<7} {'configs':>15}  workload")
    for e in plan.entries:
        counts = f"{e.total}>{e.pruned}>{len(e.configs)}"
        print(f"{e.kernel.name:<16} {e.arch:<7} {counts:>15}  {describe(e.workload)}")
    print("\ncoverage (serving calls outside the declared shapes):")
    for line in summary_lines(plan, kernels):
        print(("" if line.startswith("warning:") else "  ") + line)
    print_input_notes(kernels)
    print_identity_notes(kernels)
    if refined:
        print("\nrefined buckets in the cache (ctbuild tune --refine: a size inside a "
              "sub-bucket runs the sub-bucket's winner):")
        for line in refined_lines(refined):
            print("  " + line)
    print_costs(costs)
    print(f"\n{len(plan.jobs)} compile jobs (distinct compile keys) for "
          f"{len({e.kernel.name for e in plan.entries})} kernels on "
          f"{', '.join(project.archs)}; configs shown as all>after constraint>after cap")
    return 0


def print_input_notes(kernels: list[TunedKernel]) -> None:
    """One line per kernel whose integer tensors tuning fills by the default rule: lengths and
    indices from it are safe but seldom realistic, and winners follow the values."""
    notes = [(k.name, names) for k in kernels if (names := unset_integer_args(k))]
    if notes:
        print()
    for name, names in notes:
        print(f"note: {name}: integer tensor argument(s) {', '.join(names)} have no inputs=; "
              "tuning fills them with 1..N-1 (N: the smallest extent above 1 of the other "
              "tensors): declare realistic lengths/indices with inputs= "
              "(docs/declaring.md#tuning-inputs)")


def print_identity_notes(kernels: list[TunedKernel]) -> None:
    """A note per kernel whose identity rests on its TileIR (what it reads that its
    fingerprint cannot follow), and what that costs a serving process."""
    marked = [(k.name, m) for k in kernels if (m := by_tileir(k)) is not None]
    if marked:
        print()
    for name, marks in marked:
        print(f"note: {name}: {marks.note}; a serving process verifies each of its CUBINs by "
              "TileIR at its first load (~10 ms each)")


def print_costs(costs: list[KernelCost]) -> None:
    """Estimated compile and tune seconds per kernel, and coarser-bucket advice."""
    print("\nestimated cost (compile: CPU seconds of the jobs not cached; tune: one GPU):")
    print(f"  {'kernel':<16} {'jobs':>5} {'cached':>7} {'compile s':>10} {'tune s':>8}  source")
    for c in costs:
        guessed = "TileIR size, tile sizes" if c.tileir_bytes else "tile sizes"
        source = ("all cached" if c.cached == c.jobs else
                  "recorded" if c.recorded and c.recorded == c.jobs - c.cached else
                  f"{c.recorded} recorded, rest from {guessed}" if c.recorded else guessed)
        print(f"  {c.kernel:<16} {c.jobs:>5} {c.cached:>7} {c.compile_seconds:>10.1f} "
              f"{c.tune_seconds:>8.1f}  {source}")
    for c in costs:
        if c.advice:
            print(f"  note: {c.kernel}: {c.advice}")
