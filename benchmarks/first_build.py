"""A first build's compile estimates against the compiles, the order they give a farm, and where
a real build's worker-seconds go.

    python benchmarks/first_build.py                        # the jobs, simulated farms
    python benchmarks/first_build.py --per-kernel 4         # a quicker sample
    python benchmarks/first_build.py --build --json         # and a real precompile here
    python benchmarks/first_build.py --slow-kernel          # only the farm's order, simulated

1. Every planned job of ``--config`` (default ``benchmarks/kernels/first_build.toml``: the
   examples, the heavy attention/GEMM kernels, a paged decode, a LayerNorm, an FP8
   quantisation), or ``--per-kernel N`` of each kernel, through cuTile's front end and tileiras,
   one at a time in this process: its tile volume, TileIR bytes, front-end and tileiras
   seconds. Per kernel, the estimate a first build makes (no records: TileIR size and tile
   volume, `ctbuild.compile.job_estimates`) and the tile volume alone, over the measured
   seconds; overall, the sums' ratio, the median job's error (a factor) and the rank
   correlation of estimates and measured seconds.
2. The farm's order on N workers (``--workers``), simulated with those measured seconds: each
   free worker takes the first job in the ranking, the estimator plans its scouts and learns
   from each result, and from each job still running at each of the driver's ticks, as in a
   build (no batching, no start-up). The simulated end over the floor max(sum / N, longest
   job), ranked by the tile volume alone, by TileIR size, and by the measured seconds
   themselves.
3. ``--build``: ``ctbuild precompile --json --report`` into a fresh cache on this machine
   (``--build-workers``, default all cores): ``plan``'s estimate over its compile seconds, its
   run over the floor, when its longest job started, and its worker-seconds split into
   compile seconds (front end + tileiras, what each record says), ctbuild's own per-job time
   (a worker holding a job beyond its compile seconds: the key check, the transfer, the store)
   and idle time (``idle_seconds`` in ``precompile --json``: a worker open with no job,
   waiting for the longest jobs at the tail).
4. ``--slow-kernel`` (nothing compiled): the case a first build's guesses miss, simulated as in
   2. Two 26 s configs of one kernel (a paged decode, guessed 0.76 s from its TileIR) among 175
   jobs of about 1 s from 7 kernels, guessed within 0.8-1.25x: the end over the floor on 15, 8
   and 32 workers, with the estimator as built, without its running jobs' evidence (a kernel
   learnt only when its first job ends), and ranked by the measured seconds.
"""
from __future__ import annotations

import argparse
import heapq
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "benchmarks" / "kernels" / "first_build.toml"


def measure(config: str, per_kernel: int | None, archs: str | None = None
            ) -> tuple[list[dict], dict, list[dict]]:
    """Each measured job (as the farm gets it) with its seconds (front end and tileiras); the
    body check's TileIR sizes; every planned job. ``archs``: instead of the project's."""
    from ctbuild.compile.body_check import check_bodies
    from ctbuild.compile.compiler import _tileiras, tileir
    from ctbuild.compile.job_estimates import tile_volume
    from ctbuild.compile.plan import job_and_signature, make_plan
    from ctbuild.project import load_project
    from ctbuild.space import Config
    from ctbuild.specs import Workload, spec_from_json
    from ctbuild.toolchain import probe
    project = load_project(config, archs=archs)
    kernels = {k.name: k for k in project.kernels()}
    fp = probe().fingerprint
    plan = make_plan(list(kernels.values()), project.archs, fp, project.cap)
    sizes: dict[tuple[str, str], int] = {}
    assert not check_bodies(plan, project.devices, sizes)
    taken: dict[str, int] = {}
    rows = []
    for job in plan.jobs.values():
        if per_kernel is not None and taken.get(job.kernel, 0) >= per_kernel:
            continue
        taken[job.kernel] = taken.get(job.kernel, 0) + 1
        kernel, cfg = kernels[job.kernel], Config(job.config, job.kernel)
        w = Workload({n: spec_from_json(v) for n, v in job.workload.items()})
        signature = job_and_signature(kernel, cfg, w, job.arch, fp)[1]
        start = time.perf_counter()
        ir = tileir(kernel, cfg, signature, job.arch)
        front = time.perf_counter() - start
        start = time.perf_counter()
        _tileiras(ir, kernel.compiler_options(cfg), job.arch, None)
        back = time.perf_counter() - start
        as_json = job.to_json()
        rows.append({"job": as_json, "volume": tile_volume(as_json), "tileir_bytes":
                     len(ir.bytecode), "front_s": front, "tileiras_s": back,
                     "seconds": front + back})
    return rows, sizes, [job.to_json() for job in plan.jobs.values()]


def _ranks(values: list[float]) -> list[int]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0] * len(values)
    for rank, i in enumerate(order):
        ranks[i] = rank
    return ranks


def rank_correlation(a: list[float], b: list[float]) -> float:
    """Spearman's: the correlation of the ranks."""
    return statistics.correlation(_ranks(a), _ranks(b)) if len(a) > 1 else 1.0


def accuracy(rows: list[dict], guess: Callable[[dict], float]) -> dict[str, Any]:
    """How ``guess`` (job -> seconds) compares with the measured seconds."""
    guessed = [guess(r["job"]) for r in rows]
    actual = [r["seconds"] for r in rows]
    errors = [max(g / a, a / g) for g, a in zip(guessed, actual)]
    per_kernel: dict[str, list[float]] = {}
    for g, r in zip(guessed, rows):
        per_kernel.setdefault(r["job"]["kernel"], [0.0, 0.0])
        per_kernel[r["job"]["kernel"]][0] += g
        per_kernel[r["job"]["kernel"]][1] += r["seconds"]
    return {"sum_ratio": sum(guessed) / sum(actual), "median_error": statistics.median(errors),
            "rank_correlation": rank_correlation(guessed, actual),
            "kernels": {k: g / a for k, (g, a) in per_kernel.items()}}


def simulate(rows: list[dict], workers: int, estimate: Any) -> float:
    """When the last job ends on ``workers`` workers taking jobs in ``estimate``'s ranking,
    re-ranked whenever its ``learn`` says so, or its ``running``, told each tick of the farm's
    driver how long each job still running has run (a `JobEstimator`, or a plain callable)."""
    from ctbuild.farm.driver import TICK_SECONDS
    jobs = [r["job"] for r in rows]
    seconds = {r["job"]["key"]: r["seconds"] for r in rows}
    if hasattr(estimate, "plan"):
        estimate.plan(jobs)
    learn, running = getattr(estimate, "learn", None), getattr(estimate, "running", None)
    pending = sorted(jobs, key=lambda j: -estimate(j))
    ends: list[tuple[float, str]] = []   # (when, key) of the jobs running
    began: dict[str, float] = {}
    by_key = {j["key"]: j for j in jobs}
    now = tick = 0.0
    while pending or ends:
        while pending and len(ends) < workers:
            job = pending.pop(0)
            began[job["key"]] = now
            heapq.heappush(ends, (now + seconds[job["key"]], job["key"]))
        while running is not None and tick + TICK_SECONDS < ends[0][0]:
            tick += TICK_SECONDS
            if any([running(by_key[k], tick - began[k]) for _, k in ends if began[k] < tick]):
                pending.sort(key=lambda j: -estimate(j))
        now, key = heapq.heappop(ends)
        if learn is not None and learn(by_key[key], seconds[key]):
            pending.sort(key=lambda j: -estimate(j))
    return now


def build(config: str, workers: int, estimate: float) -> dict[str, Any]:
    """A real precompile into a fresh cache: ``estimate`` (what ``plan`` says of it) against its
    compile seconds, the run, where worker-seconds went."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with tempfile.TemporaryDirectory(prefix="first-build-") as tmp:
        cache, report = Path(tmp) / "cache", Path(tmp) / "report.json"
        cli = [sys.executable, "-m", "ctbuild"]
        start = time.perf_counter()
        proc = subprocess.run([*cli, "precompile", "--config", config, "--cache", str(cache),
                               "--workers", str(workers), "--json", "--report", str(report)],
                              capture_output=True, text=True, cwd=ROOT, env=env)
        e2e = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"precompile failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        summary = json.loads(proc.stdout)
        jobs = [j for j in json.loads(report.read_text())["jobs"] if j["status"] == "compiled"]
    compile_s = sum(j["seconds"] for j in jobs)
    busy = sum(j["finished_s"] - j["started_s"] for j in jobs)
    longest = max(jobs, key=lambda j: j["seconds"])
    n = summary["workers"]
    floor = max(compile_s / n, longest["seconds"])
    return {"workers": n, "farm": summary["farm"], "jobs": len(jobs),
            "estimate_s": estimate, "compile_s": compile_s, "estimate_vs_actual":
            estimate / compile_s, "e2e_s": e2e, "run_s": summary["run_seconds"],
            "floor_s": floor, "run_vs_floor": summary["run_seconds"] / floor,
            "e2e_vs_floor": e2e / floor, "worker_s": summary["worker_seconds"],
            "per_job_overhead_s": busy - compile_s, "idle_s": summary["idle_seconds"],
            "longest": {k: longest[k] for k in ("kernel", "config", "seconds", "started_s")},
            "last_finished_s": max(j["finished_s"] for j in jobs)}


def slow_kernel() -> None:
    """Step 4: the simulated farm on the slow-kernel case (see the module doc)."""
    import random

    from ctbuild.compile.job_estimates import JobEstimator

    class Before(JobEstimator):
        running = None  # type: ignore[assignment]  # no evidence from the jobs still running

    rng = random.Random(1)
    sizes = {("decode", "sm_90"): 3000}
    rows = [{"job": {"key": f"d{c}", "kernel": "decode", "arch": "sm_90", "config": {"BM": bm}},
             "seconds": 26.0} for c, bm in enumerate((64, 32))]
    for k in range(7):
        sizes[(f"k{k}", "sm_90")] = int(1024 * rng.uniform(0.8, 1.2) / 0.26)
        for c in range(25):
            job = {"key": f"k{k}-{c}", "kernel": f"k{k}", "arch": "sm_90",
                   "config": {"T": 16 << (c % 4), "i": c}}
            rows.append({"job": job, "seconds": JobEstimator({}, sizes).guess(job)
                         * rng.uniform(0.8, 1.25)})
    total, longest = sum(r["seconds"] for r in rows), max(r["seconds"] for r in rows)
    measured = {r["job"]["key"]: r["seconds"] for r in rows}
    print(f"slow kernel: {len(rows)} jobs, {total:.0f} s, the two longest {longest:.0f} s")
    for n in (15, 8, 32):
        floor = max(total / n, longest)
        after = simulate(rows, n, JobEstimator({}, sizes))
        before = simulate(rows, n, Before({}, sizes))
        best = simulate(rows, n, lambda j: measured[j["key"]])
        print(f"  {n:>2} workers: floor {floor:.1f} s; as built {after:.1f} s "
              f"({after / floor:.2f}x), without the running jobs' evidence {before:.1f} s "
              f"({before / floor:.2f}x), ranked by measured seconds {best / floor:.2f}x")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--config", default=str(DEFAULT_CONFIG))
    p.add_argument("--per-kernel", type=int, help="measure this many jobs of each kernel")
    p.add_argument("--workers", default="2,16,64", help="worker counts to simulate")
    p.add_argument("--build", action="store_true", help="also run a real precompile here")
    p.add_argument("--build-workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.add_argument("--slow-kernel", action="store_true",
                   help="only simulate the farm on a kernel far slower than its guess (step 4)")
    args = p.parse_args(argv)
    sys.path[:0] = [str(ROOT)]
    if args.slow_kernel:
        slow_kernel()
        return 0
    from ctbuild.compile.job_estimates import JobEstimator

    print(f"{args.config}; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}",
          flush=True)
    rows, sizes, planned = measure(args.config, args.per_kernel)
    by_tileir, by_volume = JobEstimator({}, sizes), JobEstimator({})
    result: dict[str, Any] = {
        "jobs": len(rows), "front_s": sum(r["front_s"] for r in rows),
        "tileiras_s": sum(r["tileiras_s"] for r in rows),
        "tileir": accuracy(rows, by_tileir), "volume": accuracy(rows, by_volume)}
    print(f"\n{len(rows)} jobs: front end {result['front_s']:.1f} s, tileiras "
          f"{result['tileiras_s']:.1f} s (front end {min(r['front_s'] for r in rows) * 1e3:.0f}"
          f"-{max(r['front_s'] for r in rows) * 1e3:.0f} ms a job)")
    print(f"\n{'kernel':<16} {'jobs':>4} {'TileIR B':>8} {'volume':>15} {'measured s':>10} "
          f"{'TileIR est/act':>14} {'volume est/act':>14}")
    for kernel in result["tileir"]["kernels"]:
        mine = [r for r in rows if r["job"]["kernel"] == kernel]
        vols = [r["volume"] for r in mine]
        print(f"{kernel:<16} {len(mine):>4} {max(r['tileir_bytes'] for r in mine):>8} "
              f"{min(vols):>7.0f}-{max(vols):<7.0f} {sum(r['seconds'] for r in mine):>10.1f} "
              f"{result['tileir']['kernels'][kernel]:>14.2f} "
              f"{result['volume']['kernels'][kernel]:>14.2f}")
    for name in ("tileir", "volume"):
        a = result[name]
        print(f"{'TileIR size x volume' if name == 'tileir' else 'tile volume alone':<21}: "
              f"sum est/act {a['sum_ratio']:.2f}, per kernel {min(a['kernels'].values()):.2f}"
              f"..{max(a['kernels'].values()):.2f}, median job error {a['median_error']:.2f}x, "
              f"rank correlation {a['rank_correlation']:.3f}")

    total = sum(r["seconds"] for r in rows)
    longest = max(r["seconds"] for r in rows)
    measured = {r["job"]["key"]: r["seconds"] for r in rows}
    print("\nsimulated farm (measured seconds, no batching): end / floor")
    print(f"{'workers':>7} {'floor s':>8} {'volume':>7} {'TileIR':>7} {'measured':>8}")
    result["simulated"] = []
    for n in [int(x) for x in args.workers.split(",") if x.strip()]:
        floor = max(total / n, longest)
        ends = {"volume": simulate(rows, n, JobEstimator({})),
                "tileir": simulate(rows, n, JobEstimator({}, sizes)),
                "measured": simulate(rows, n, lambda j: measured[j["key"]])}
        result["simulated"].append({"workers": n, "floor_s": floor,
                                    **{k: v / floor for k, v in ends.items()}})
        print(f"{n:>7} {floor:>8.1f} {ends['volume'] / floor:>7.2f} "
              f"{ends['tileir'] / floor:>7.2f} {ends['measured'] / floor:>8.2f}")
    if args.build:
        cold = JobEstimator({}, sizes)  # plan's estimate into an empty cache
        b = result["build"] = build(args.config, args.build_workers,
                                    sum(cold(j) for j in planned))
        print(f"\nprecompile on {b['workers']} workers ({b['farm']}), {b['jobs']} jobs: plan "
              f"estimated {b['estimate_s']:.1f} s, compiles took {b['compile_s']:.1f} s "
              f"(est/act {b['estimate_vs_actual']:.2f}); run {b['run_s']:.1f} s, end to end "
              f"{b['e2e_s']:.1f} s, floor {b['floor_s']:.1f} s (run/floor "
              f"{b['run_vs_floor']:.2f}, e2e/floor {b['e2e_vs_floor']:.2f}); longest job "
              f"{b['longest']['kernel']} {b['longest']['seconds']:.1f} s started at "
              f"{b['longest']['started_s']} s; worker-seconds {b['worker_s']:.1f} = compile "
              f"{b['compile_s']:.1f} + ctbuild per job {b['per_job_overhead_s']:.1f} + idle "
              f"{b['idle_s']:.1f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        print(json.dumps({"config": args.config, "cores": os.cpu_count(), **result}, indent=2,
                         default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
