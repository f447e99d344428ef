"""Precompile throughput: cuTile serial vs a warm multiprocessing pool vs the Ray farm.

    python benchmarks/precompile_scaling.py                       # examples' plan, 1..cores
    python benchmarks/precompile_scaling.py --max-workers 4 --limit 60 --json

The plan is the examples' (``examples/ctbuild.toml`` on sm_90,sm_100, 138 jobs) unless
``--config``/``--arch`` say otherwise. Every variant compiles the same jobs with
`ctbuild.compiler.compile_job` (cuTile's ``compile_tile`` with cuTile's own disk cache off:
``TileContext(cache_dir=None)``) and stores each CUBIN into its own fresh cache directory, so
nothing is ever a cache hit and every variant does the same work:

* serial: one process, one job after the other (the baseline);
* pool N: ``multiprocessing`` (spawn) with N workers started, modules imported and the
  toolchain probed *before* the clock starts;
* farm N: `farm.Farm` with N workers; its start-up (embedded Ray + warm actors) is timed
  separately and the throughput clock starts after it, as for the pool.

Prints configs/s per variant and the ratios farm/pool and farm/serial from this one run.
Targets on a 2-core machine: farm >= 0.95x pool at equal workers, farm(2) >= 1.8x serial,
start-up <= 5 s. Other load on the machine skews all of these; the load average is printed.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_STORE = None


def _pool_init(cache_dir: str, modules: list[str], paths: list[str]) -> None:
    global _STORE
    from cache import Store
    from ctbuild.buildworker import warm_worker
    warm_worker(modules, paths)
    _STORE = Store(cache_dir, readonly=False)


def _pool_ready(_: int) -> int:
    time.sleep(0.2)
    return os.getpid()


def _pool_compile(job: dict) -> tuple[str, bool]:
    from ctbuild.compiler import compile_job
    out = compile_job(job, timeout_sec=300)
    _STORE.put_compile(job["key"], out["cubin"], symbol=out["symbol"],
                       meta={"kernel": job["kernel"], "arch": job["arch"]})
    return job["key"], True


def plan_jobs(config: str, archs: str, limit: int | None) -> tuple[list[dict], object]:
    from ctbuild.config import load_project
    from ctbuild.plan import make_plan
    from ctbuild.toolchain import probe
    project = load_project(config, archs=archs)
    plan = make_plan(project.kernels(), project.archs, probe().fingerprint, project.cap)
    jobs = [j.to_json() for j in plan.jobs.values()]
    return (jobs[:limit] if limit else jobs), project


def run_serial(jobs: list[dict], cache_dir: str) -> float:
    from cache import Store
    from ctbuild.compiler import compile_job
    with Store(cache_dir, readonly=False) as store:
        start = time.perf_counter()
        for job in jobs:
            out = compile_job(job, timeout_sec=300)
            store.put_compile(job["key"], out["cubin"], symbol=out["symbol"],
                              meta={"kernel": job["kernel"], "arch": job["arch"]})
        return time.perf_counter() - start


def run_pool(jobs: list[dict], cache_dir: str, n: int, project) -> float:
    ctx = mp.get_context("spawn")
    with ctx.Pool(n, initializer=_pool_init,
                  initargs=(cache_dir, list(project.modules),
                            [str(p) for p in project.paths])) as pool:
        pids: set[int] = set()
        while len(pids) < n:  # every worker up, imported and probed before the clock starts
            pids.update(pool.map(_pool_ready, range(n), chunksize=1))
        start = time.perf_counter()
        done = sum(1 for _ in pool.imap_unordered(_pool_compile, jobs, chunksize=1))
        seconds = time.perf_counter() - start
    assert done == len(jobs)
    return seconds


def run_farm(jobs: list[dict], cache_dir: str, n: int, project) -> tuple[float, float]:
    from ctbuild.toolchain import probe
    from farm import Farm
    paths = [str(p) for p in project.paths]
    with Farm(cache_dir, "ctbuild.compiler:compile_job", workers=n,
              setup_fn="ctbuild.buildworker:warm_worker",
              setup_args=(list(project.modules), paths), sys_paths=paths,
              expect={"toolchain": probe().fingerprint},
              fatal_errors=("CompileMismatchError",)) as farm:
        startup = farm.start(len(jobs))
        result = farm.run(jobs)
    failed = result.failures
    if failed:
        raise SystemExit(f"farm: {len(failed)} jobs failed, e.g. {failed[0].error}")
    return startup, result.run_seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--config", default=str(ROOT / "examples" / "ctbuild.toml"))
    p.add_argument("--arch", default="sm_90,sm_100")
    p.add_argument("--max-workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--limit", type=int, help="compile only the first N planned jobs")
    p.add_argument("--skip-serial", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    args = p.parse_args(argv)
    jobs, project = plan_jobs(args.config, args.arch, args.limit)
    n_jobs = len(jobs)
    print(f"{n_jobs} jobs from {args.config} ({args.arch}); {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="ctbuild-bench-") as tmp:
        def fresh(name: str) -> str:
            return str(Path(tmp) / name)

        if not args.skip_serial:
            s = run_serial(jobs, fresh("serial"))
            results["serial"] = {"seconds": s, "cfg_per_s": n_jobs / s}
            print(f"serial        {s:7.2f} s  {n_jobs / s:6.2f} cfg/s", flush=True)
        for n in range(1, args.max_workers + 1):
            s = run_pool(jobs, fresh(f"pool{n}"), n, project)
            results[f"pool{n}"] = {"seconds": s, "cfg_per_s": n_jobs / s}
            print(f"pool  x{n:<3}    {s:7.2f} s  {n_jobs / s:6.2f} cfg/s", flush=True)
            startup, s = run_farm(jobs, fresh(f"farm{n}"), n, project)
            results[f"farm{n}"] = {"seconds": s, "cfg_per_s": n_jobs / s,
                                   "startup_seconds": startup}
            print(f"farm  x{n:<3}    {s:7.2f} s  {n_jobs / s:6.2f} cfg/s  "
                  f"(start-up {startup:.2f} s)", flush=True)
    print()
    print(f"{'workers':>7} {'pool cfg/s':>11} {'farm cfg/s':>11} {'farm/pool':>10} "
          f"{'farm/serial':>12} {'start-up s':>11}")
    serial = results.get("serial", {}).get("cfg_per_s")
    for n in range(1, args.max_workers + 1):
        pool, farm = results[f"pool{n}"], results[f"farm{n}"]
        ratio = farm["cfg_per_s"] / pool["cfg_per_s"]
        vs_serial = f"{farm['cfg_per_s'] / serial:.2f}x" if serial else "-"
        farm["vs_pool"] = round(ratio, 3)
        farm["vs_serial"] = round(farm["cfg_per_s"] / serial, 3) if serial else None
        print(f"{n:>7} {pool['cfg_per_s']:>11.2f} {farm['cfg_per_s']:>11.2f} {ratio:>9.2f}x "
              f"{vs_serial:>12} {farm['startup_seconds']:>11.2f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        print(json.dumps({"jobs": n_jobs, "cores": os.cpu_count(), "results": results},
                         indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
