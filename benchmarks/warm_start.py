"""Warm start vs cold start: time to the first correct result of each example kernel.

    python benchmarks/warm_start.py [--cache DIR] [--out DIR]

1. ``build`` (own process): precompile every example workload for sm_90 in a local process
   pool (``ctbuild.compile.compiler.compile_job``; no Ray) and tune them on this GPU
   (``ctbuild.tune.tuner.tune_workload``) into the cache DIR.
2. ``warm`` (fresh process, ``CTBUILD_MODE=strict``, ``--no-tileiras``: PATH stripped of
   tileiras and cuTile's compiler lookup raising): ``import ctbuild``, call each kernel on its
   first declared workload, synchronize, check against torch. Counts tileiras runs
   (``compile_tile`` calls and ``STATS.jit_compiles``): must be 0.
3. ``cold`` (fresh process, cuTile's own disk cache pointed at an empty dir): the same work
   with plain cuTile: JIT + ``ct.tune.exhaustive_search`` over the same candidates, then launch
   the winner and check.

Prints per kernel the time to the first correct result (call -> synchronized result; input
creation and the torch reference excluded on both sides) and the cold/warm ratio, and writes
``warm_start.json`` to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T_START = time.perf_counter()
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(ROOT), str(ROOT / "tests"), str(ROOT / "examples")):
    if p not in sys.path:
        sys.path.insert(0, p)


def _emit(path: str | None, obj: dict) -> None:
    text = json.dumps(obj, indent=2, default=str)
    if path:
        Path(path).write_text(text)
    print(text)


def cmd_build(args: argparse.Namespace) -> int:
    from gpu_runtime_examples import build_cache
    report = build_cache(args.cache)
    _emit(args.json, report)
    return 0 if not report["precompile"]["errors"] else 1


def cmd_warm(args: argparse.Namespace) -> int:
    import gpu_runtime_examples as ex
    if args.no_tileiras:
        ex.hide_tileiras()
    counter = ex.CompileCount()
    os.environ["CTBUILD_CACHE_DIR"] = str(args.cache)
    os.environ["CTBUILD_MODE"] = "strict"
    t0 = time.perf_counter()
    import ctbuild  # noqa: F401
    from ctbuild.serve.served_kernel import STATS
    kernels = ex.load_examples()
    t_import = time.perf_counter() - t0
    import torch
    torch.zeros(1, device="cuda")  # CUDA context (same on both sides)
    torch.cuda.synchronize()
    tileiras_reachable = True
    try:
        from ctbuild.toolchain import find_tileiras
        find_tileiras()
    except Exception:
        tileiras_reachable = False
    results = {}
    for name, tuned in kernels.items():
        args_, expected = ex.gpu_case(tuned, 0)
        torch.cuda.synchronize()
        t = time.perf_counter()
        tuned(*args_)
        torch.cuda.synchronize()
        first = time.perf_counter() - t
        ex.check(name, args_, expected)
        t = time.perf_counter()
        tuned(*args_)  # not checked (in-place kernels): the steady-state call
        torch.cuda.synchronize()
        second = time.perf_counter() - t
        prov = tuned.runtime.provenance()
        entry = prov["entries"][0]
        results[name] = {"first_s": first, "second_s": second, "correct": True,
                         "config": entry["config"], "config_from": entry["config_from"],
                         "cubin_from": entry["cubin_from"], "origins": prov["origins"]}
    _emit(args.json, {
        "mode": "warm", "kernels": results, "import_s": t_import,
        "process_s": time.perf_counter() - T_START, "jit_compiles": STATS.jit_compiles,
        "compile_tile_calls": counter.calls, "tileiras_reachable": tileiras_reachable,
        "ray_or_farm_imported": sorted(m for m in sys.modules
                                       if m.split(".")[0] in ("ray", "farm")),
        "device": torch.cuda.get_device_name()})
    return 0


def cmd_cold(args: argparse.Namespace) -> int:
    import gpu_runtime_examples as ex
    counter = ex.CompileCount()
    t0 = time.perf_counter()
    import cuda.tile as ct

    from ctbuild.arch import Arch
    from ctbuild.device_table import cuda_device
    kernels = ex.load_examples()
    t_import = time.perf_counter() - t0
    import torch
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    dev = cuda_device(torch.cuda.current_device())  # what a grid(cfg, w, dev) sizes itself by
    results = {}
    for name, tuned in kernels.items():
        args_, expected = ex.gpu_case(tuned, 0)
        w = tuned.bind(*args_)
        cands = tuned.candidates(tuned.workloads[0], Arch("sm_90")).kept
        snaps = {n: w[n].clone() for n in tuned.restore}
        stream = torch.cuda.current_stream()
        torch.cuda.synchronize()
        calls0 = counter.calls
        t = time.perf_counter()

        def args_fn(cfg, w=w, snaps=snaps, tuned=tuned):
            for n, s in snaps.items():
                w[n].copy_(s)
            return tuned.kernel_args(cfg, w)

        result = ct.tune.exhaustive_search(
            cands, stream, lambda cfg, w=w, tuned=tuned: tuned.grid(cfg, w, dev), tuned.kernel,
            args_fn, tuned.hints, quiet=True)
        best = result.best.config
        for n, s in snaps.items():
            w[n].copy_(s)
        ct.launch(stream, tuned.grid(best, w, dev), tuned.kernel.replace_hints(**tuned.hints(best)),
                  tuned.kernel_args(best, w))
        torch.cuda.synchronize()
        first = time.perf_counter() - t
        ex.check(name, args_, expected)
        results[name] = {"first_s": first, "correct": True, "config": best.to_json(),
                         "best_us": result.best.mean_us, "candidates": len(cands),
                         "compiles": counter.calls - calls0}
    _emit(args.json, {"mode": "cold", "kernels": results, "import_s": t_import,
                      "process_s": time.perf_counter() - T_START,
                      "compile_tile_calls": counter.calls,
                      "device": torch.cuda.get_device_name()})
    return 0


def _child(argv: list[str], env: dict | None = None) -> tuple[dict, float]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv],
                         capture_output=True, text=True, env={**os.environ, **(env or {})})
    wall = time.perf_counter() - start
    if out.returncode != 0:
        sys.stderr.write(out.stdout[-4000:] + out.stderr[-8000:])
        raise SystemExit(f"child {argv[0]} failed with exit {out.returncode}")
    return json.loads(Path(argv[argv.index("--json") + 1]).read_text()), wall


def cmd_all(args: argparse.Namespace) -> int:
    out_dir = Path(args.out or tempfile.mkdtemp(prefix="warm-start-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    cache = Path(args.cache or out_dir / "cache")
    report: dict = {"cache": str(cache)}
    if not args.no_build:
        build, wall = _child(["build", "--cache", str(cache), "--json", str(out_dir / "build.json")])
        report["build"] = {"wall_s": wall, "precompile": {k: v for k, v in build["precompile"].items()
                                                          if k != "errors"},
                           "precompile_errors": build["precompile"]["errors"][:5],
                           "tune_s": build["tune"]["seconds"], "records": build["tune"]["records"]}
    warm, warm_wall = _child(["warm", "--cache", str(cache), "--no-tileiras",
                              "--json", str(out_dir / "warm.json")])
    tile_cache = tempfile.mkdtemp(prefix="cutile-cold-cache-")
    cold, cold_wall = _child(["cold", "--json", str(out_dir / "cold.json")],
                             env={"CUDA_TILE_CACHE_DIR": tile_cache})
    rows = []
    print(f"\nwarm start vs cold start on {warm['device']} (time to first correct result)")
    print(f"{'kernel':14} {'cold s':>9} {'warm ms':>9} {'ratio':>9} {'compiles cold/warm':>19}"
          f"  warm config (from)")
    for name, w in warm["kernels"].items():
        c = cold["kernels"][name]
        ratio = c["first_s"] / w["first_s"]
        rows.append({"kernel": name, "cold_s": c["first_s"], "warm_s": w["first_s"],
                     "ratio": ratio, "cold_compiles": c["compiles"],
                     "warm_config": w["config"], "cold_config": c["config"],
                     "warm_origin": w["origins"]})
        print(f"{name:14} {c['first_s']:9.3f} {w['first_s'] * 1e3:9.3f} {ratio:9.0f} "
              f"{c['compiles']:>12}/0      {w['config']} ({w['config_from']}/{w['cubin_from']})")
    print(f"process wall: cold {cold_wall:.2f} s, warm {warm_wall:.2f} s "
          f"(ratio {cold_wall / warm_wall:.1f}; both include Python/torch/CUDA start-up)")
    print(f"warm: jit_compiles={warm['jit_compiles']} compile_tile_calls="
          f"{warm['compile_tile_calls']} tileiras_reachable={warm['tileiras_reachable']} "
          f"ray/farm imported={warm['ray_or_farm_imported']}")
    report.update({"device": warm["device"], "rows": rows, "warm_wall_s": warm_wall,
                   "cold_wall_s": cold_wall, "warm": warm, "cold": cold})
    (out_dir / "warm_start.json").write_text(json.dumps(report, indent=2, default=str))
    ok = warm["jit_compiles"] == 0 and warm["compile_tile_calls"] == 0 and \
        not warm["ray_or_farm_imported"]
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd")
    for name in ("all", "build", "warm", "cold"):
        p = sub.add_parser(name)
        p.add_argument("--cache", help="cache directory (default: <out>/cache)")
        p.add_argument("--json", help="write the result here")
        if name == "warm":
            p.add_argument("--no-tileiras", action="store_true",
                           help="make tileiras unreachable in this process")
        if name == "all":
            p.add_argument("--out", help="where logs and JSON go")
            p.add_argument("--no-build", action="store_true", help="reuse --cache as is")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("all", "build", "warm", "cold"):
        argv = ["all", *argv]
    args = parser.parse_args(argv)
    if args.cmd == "all":
        return cmd_all(args)
    return {"build": cmd_build, "warm": cmd_warm, "cold": cmd_cold}[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
