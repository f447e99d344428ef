"""``ctbuild plan``: what would be compiled, without compiling anything."""
from __future__ import annotations

import argparse

from ..build.coverage import summary_lines
from ..build.plan import make_plan
from ..specs import describe
from ..toolchain import ToolchainError, probe
from .common import add_project_args, guarded, print_json, project_from_args

EPILOG = """\
examples:
  ctbuild plan --config examples/ctbuild.toml
  ctbuild plan --config examples/ctbuild.toml --arch sm_90,sm_100 --json

Jobs are deduplicated by compile key, so the job count is the number of CUBINs a clean
precompile builds. Exit 2 on a bad declaration or config (the message names the kernel).
"""


def add_parser(sub: argparse._SubParsersAction, name: str, summary: str) -> None:
    p = sub.add_parser(name, help=summary, description=summary, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_project_args(p, cache=False)
    p.set_defaults(run=guarded(run))


def toolchain_fingerprint() -> tuple[str, str | None]:
    """The local toolchain's fingerprint, or a placeholder and the reason it is missing."""
    try:
        return probe().fingerprint, None
    except ToolchainError as exc:
        return "unprobed", str(exc)


def run(args: argparse.Namespace) -> int:
    project = project_from_args(args)
    kernels = project.kernels()
    fp, problem = toolchain_fingerprint()
    plan = make_plan(kernels, project.archs, fp, project.cap, generic=project.generic,
                     devices=project.devices)
    if args.json:
        out = plan.to_json()
        if problem:
            out["toolchain_problem"] = problem
        print_json(out)
        return 0
    if problem:
        print(f"warning: no toolchain ({problem}); keys use a placeholder")
    print(f"{'kernel':<16} {'arch':<7} {'configs':>15}  workload")
    for e in plan.entries:
        counts = f"{e.total}>{e.pruned}>{len(e.configs)}"
        print(f"{e.kernel.name:<16} {e.arch:<7} {counts:>15}  {describe(e.workload)}")
    print("\ncoverage (serving calls outside the declared shapes):")
    for line in summary_lines(plan, kernels):
        print(("" if line.startswith("warning:") else "  ") + line)
    print(f"\n{len(plan.jobs)} compile jobs (distinct compile keys) for "
          f"{len({e.kernel.name for e in plan.entries})} kernels on "
          f"{', '.join(project.archs)}; configs shown as all>after constraint>after cap")
    return 0
