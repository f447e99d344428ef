"""Precompile end to end: `ctbuild precompile` (the Ray farm) vs a plain process-pool script.

    python benchmarks/precompile_scaling.py --workers 2                      # this machine
    python benchmarks/precompile_scaling.py --workers 2,16,64 \\
        --config benchmarks/kernels/ctbuild.toml --json                      # a big host

The plan is the project's in ``--config`` (default ``benchmarks/kernels/ctbuild.toml``: the
examples plus heavy attention/GEMM kernels, 306 jobs on sm_90+sm_100). For each worker count N,
two builds of the same jobs into fresh, empty caches, each a separate process timed from start
to exit:

* pool N: this file's ``pool-build`` mode, a plain script: load the project, probe, plan, start
  a ``multiprocessing`` (spawn) pool of N workers that import the kernels and probe the
  toolchain, compile every job (``ctbuild.compile.compiler.compile_job``, in plan order), store each
  CUBIN from the parent process;
* farm N: ``python -m ctbuild precompile --workers N`` (embedded Ray).

Reported per N: end-to-end seconds of both and their ratio (pool/farm: >= 1 means the farm is
faster); throughput after start-up, as jobs per warm worker-second (``thr ratio``: the pool's N
workers count from when all of them are warm, as its clock starts then; the farm's workers each
from its own warm-up, ``worker_seconds`` in ``precompile --json``), and the compile phases'
ratio (``run ratio``: pool seconds from all warm to the last job over farm seconds from the
first warm worker, which charges the farm for the seconds its other workers still warm up
while the first already compiles); the farm's start-up (Ray start to the first worker warm,
overlapped with planning); the floor max(sum of compile seconds / N, longest job) with the
farm's compile phase and end to end against it; and when the farm's longest job started and its
last job finished (from its ``--report``: where a tail comes from). Other load skews all of
these: the load average is printed before and after.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "benchmarks" / "kernels" / "ctbuild.toml"


# ---- the plain pool script (run as its own process: `precompile_scaling.py pool-build`) ------
def _pool_init(modules: list[str], paths: list[str]) -> None:
    from ctbuild.compile.worker_setup import warm_worker
    warm_worker(modules, paths)


def _pool_ready(_: int) -> int:
    time.sleep(0.2)
    return os.getpid()


def _pool_compile(job: dict) -> tuple[dict, dict]:
    from ctbuild.compile.compiler import compile_job
    return job, compile_job(job, timeout_sec=300)


def pool_build(config: str, archs: str | None, workers: int, cache_dir: str) -> dict:
    """Plan and compile every job with a warm spawn pool; the parent stores the CUBINs."""
    from ctbuild.cache import Store
    from ctbuild.compile.plan import make_plan
    from ctbuild.project import load_project
    from ctbuild.toolchain import probe
    project = load_project(config, archs=archs)
    plan = make_plan(project.kernels(), project.archs, probe().fingerprint, project.cap)
    jobs = [j.to_json() for j in plan.jobs.values()]
    ctx = mp.get_context("spawn")
    with Store(cache_dir, readonly=False) as store, ctx.Pool(
            workers, initializer=_pool_init,
            initargs=(list(project.modules), [str(p) for p in project.paths])) as pool:
        pids: set[int] = set()
        while len(pids) < workers:  # every worker up, imported and probed
            pids.update(pool.map(_pool_ready, range(workers), chunksize=1))
        start = time.perf_counter()
        seconds = []
        for job, out in pool.imap_unordered(_pool_compile, jobs, chunksize=1):
            store.put_compile(job["key"], out["cubin"], symbol=out["symbol"], meta=out["meta"])
            seconds.append(out["seconds"])
        run = time.perf_counter() - start
    return {"jobs": len(jobs), "run_seconds": run, "compile_seconds": seconds}


# ---- the driver -------------------------------------------------------------------------------
def _timed(argv: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])}... failed (exit {proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    return seconds, proc


def measure(config: str, archs: str | None, n: int, tmp: Path) -> dict:
    """One pool build and one farm build of ``n`` workers, each into a fresh cache under
    ``tmp``."""
    tmp = Path(tempfile.mkdtemp(prefix=f"x{n}-", dir=tmp))
    arch_args = ["--arch", archs] if archs else []
    pool_e2e, proc = _timed([sys.executable, __file__, "pool-build", "--config", config,
                             *arch_args, "--workers", str(n), "--cache", str(tmp / f"pool{n}")])
    pool = json.loads(proc.stdout.strip().splitlines()[-1])
    report = tmp / f"farm{n}.json"
    farm_e2e, proc = _timed([sys.executable, "-m", "ctbuild", "precompile", "--config", config,
                             *arch_args, "--workers", str(n), "--cache", str(tmp / f"farm{n}"),
                             "--json", "--report", str(report)])
    farm = json.loads(proc.stdout)
    rows = json.loads(report.read_text())["jobs"]
    if farm["compiled"] != pool["jobs"] or farm["failed"]:
        raise SystemExit(f"farm x{n}: compiled {farm['compiled']} of {pool['jobs']} jobs, "
                         f"{farm['failed']} failed")
    secs = pool["compile_seconds"]
    floor = max(sum(secs) / n, max(secs))
    farm_floor = max(sum(r["seconds"] for r in rows) / n, max(r["seconds"] for r in rows))
    longest = max(rows, key=lambda r: r["seconds"])
    jobs = pool["jobs"]
    return {
        "workers": n, "jobs": jobs,
        "pool_e2e_s": pool_e2e, "farm_e2e_s": farm_e2e, "e2e_farm_vs_pool": pool_e2e / farm_e2e,
        "pool_run_s": pool["run_seconds"], "farm_run_s": farm["run_seconds"],
        "pool_cfg_per_s": jobs / pool["run_seconds"], "farm_cfg_per_s": jobs / farm["run_seconds"],
        # per warm worker-second: the pool's clock starts when all its workers are warm, the
        # farm's workers each count from their own warm-up (`FarmResult.worker_seconds`)
        "throughput_farm_vs_pool": n * pool["run_seconds"] / farm["worker_seconds"],
        "run_farm_vs_pool": pool["run_seconds"] / farm["run_seconds"],
        "farm_startup_s": farm["startup_seconds"],
        "farm_startup_steps": farm.get("startup_steps", {}),
        "floor_s": floor, "farm_floor_s": farm_floor,
        "farm_run_vs_floor": farm["run_seconds"] / farm_floor,
        "farm_e2e_vs_floor": farm_e2e / farm_floor,
        "longest_job_s": max(secs), "sum_compile_s": sum(secs),
        "farm_longest": {k: longest[k] for k in ("kernel", "arch", "config", "seconds",
                                                 "started_s", "finished_s")},
        "farm_last_finished_s": max(r["finished_s"] or 0.0 for r in rows),
    }


def _median_row(runs: list[dict]) -> dict:
    """Per figure, the median over repeated runs of one worker count."""
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    return {k: statistics.median(r[k] for r in runs) for k in keys}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pool-build"]:
        p = argparse.ArgumentParser(prog="precompile_scaling.py pool-build")
        p.add_argument("--config", required=True)
        p.add_argument("--arch")
        p.add_argument("--workers", type=int, required=True)
        p.add_argument("--cache", required=True)
        a = p.parse_args(argv[1:])
        print(json.dumps(pool_build(a.config, a.arch, a.workers, a.cache)))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--config", default=str(DEFAULT_CONFIG))
    p.add_argument("--arch", help="override the config's archs, e.g. sm_90,sm_100")
    p.add_argument("--workers", default=str(os.cpu_count() or 1),
                   help="comma-separated worker counts, e.g. 2,16,64 (default: all cores)")
    p.add_argument("--repeat", type=int, default=1,
                   help="measure each worker count this many times (pool, farm, pool, farm...) "
                        "and add a median row: on a noisy machine one pair's ratios are as wide "
                        "as the targets' margins")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    args = p.parse_args(argv)
    counts = [int(x) for x in args.workers.split(",") if x.strip()]
    print(f"{args.config}; {os.cpu_count()} cores; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        for n in [n for n in counts for _ in range(max(1, args.repeat))]:
            r = measure(args.config, args.arch, n, Path(tmp))
            results.append(r)
            lj = r["farm_longest"]
            print(f"x{n}: {r['jobs']} jobs; pool e2e {r['pool_e2e_s']:.1f} s, farm e2e "
                  f"{r['farm_e2e_s']:.1f} s; the farm's longest job ({lj['kernel']} "
                  f"{lj['arch']} {lj['config']}, {lj['seconds']:.1f} s) started "
                  f"{lj['started_s']} s after the first worker was ready, the last job finished "
                  f"at {r['farm_last_finished_s']:.1f} s; start-up: "
                  + ", ".join(f"{k} at {v:.2f} s" for k, v in r["farm_startup_steps"].items())
                  + f"; load {os.getloadavg()[0]:.2f}", flush=True)
    print()
    print(f"{'workers':>7} {'pool e2e s':>10} {'farm e2e s':>10} {'e2e ratio':>9} "
          f"{'pool run s':>10} {'farm run s':>10} {'run ratio':>9} {'thr ratio':>9} "
          f"{'start-up s':>10} "
          f"{'floor s':>8} {'run/floor':>9} {'e2e/floor':>9}")
    rows = list(results)
    if args.repeat > 1:
        rows += [_median_row([r for r in results if r["workers"] == n]) for n in counts]
    for r in rows:
        print(f"{r['workers']:>7} {r['pool_e2e_s']:>10.2f} {r['farm_e2e_s']:>10.2f} "
              f"{r['e2e_farm_vs_pool']:>8.2f}x {r['pool_run_s']:>10.2f} {r['farm_run_s']:>10.2f} "
              f"{r['run_farm_vs_pool']:>8.2f}x {r['throughput_farm_vs_pool']:>8.2f}x "
              f"{r['farm_startup_s']:>10.2f} "
              f"{r['farm_floor_s']:>8.2f} {r['farm_run_vs_floor']:>9.2f} "
              f"{r['farm_e2e_vs_floor']:>9.2f}")
    print("ratios: pool seconds / farm seconds (>= 1: the farm is faster); floor: "
          "max(sum of the farm's compile seconds / workers, longest job)"
          + ("; the last row per worker count: medians" if args.repeat > 1 else ""))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        print(json.dumps({"config": args.config, "cores": os.cpu_count(), "results": results},
                         indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
