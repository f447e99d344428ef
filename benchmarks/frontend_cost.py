"""What re-running cuTile's front end costs per config, next to a full compile (tileiras).

`ctbuild cache verify --identity` re-runs the front end for every cached entry; this prints the
front end's share of a compile for one job per example kernel, measured in one run:

    python benchmarks/frontend_cost.py [--config examples/ctbuild.toml] [--arch sm_90]
"""
from __future__ import annotations

import argparse
import time

from ctbuild.compile.compiler import _tileiras, tileir
from ctbuild.compile.plan import job_and_signature, make_plan
from ctbuild.project import load_project
from ctbuild.space import Config
from ctbuild.toolchain import probe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="examples/ctbuild.toml")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--per-kernel", type=int, default=3, help="jobs measured per kernel")
    args = parser.parse_args()
    project = load_project(args.config, archs=args.arch)
    kernels = {k.name: k for k in project.kernels()}
    fp = probe().fingerprint
    plan = make_plan(list(kernels.values()), project.archs, fp, project.cap)
    taken: dict[str, int] = {}
    rows = []
    for job in plan.jobs.values():
        if taken.get(job.kernel, 0) >= args.per_kernel:
            continue
        taken[job.kernel] = taken.get(job.kernel, 0) + 1
        kernel = kernels[job.kernel]
        cfg = Config(job.config, kernel.name)
        from ctbuild.specs import Workload, spec_from_json
        w = Workload({n: spec_from_json(v) for n, v in job.workload.items()})
        _, signature = job_and_signature(kernel, cfg, w, job.arch, fp)
        start = time.perf_counter()
        ir = tileir(kernel, cfg, signature, job.arch)
        front = time.perf_counter() - start
        start = time.perf_counter()
        _tileiras(ir, kernel.compiler_options(cfg), job.arch, None)
        back = time.perf_counter() - start
        rows.append((job.kernel, front, back))
    print(f"{'kernel':<14} {'front end ms':>12} {'tileiras ms':>12} {'front/total':>12}")
    for name, front, back in rows:
        print(f"{name:<14} {front * 1e3:12.1f} {back * 1e3:12.1f} {front / (front + back):12.2f}")
    fronts = sum(r[1] for r in rows)
    total = sum(r[1] + r[2] for r in rows)
    print(f"mean front end {fronts / len(rows) * 1e3:.1f} ms per config; "
          f"front end / full compile = {fronts / total:.3f}")


if __name__ == "__main__":
    main()
