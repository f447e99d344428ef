"""``ctbuild tune --gpus``: how much faster several GPUs of one node tune the same keys.

    python benchmarks/tune_gpus.py [--config C ...] [--gpus all] [--json FILE]

1. Precompile every planned candidate of each project (default: benchmarks/kernels/tune_all.toml)
   for this node's arch with `ctbuild precompile --farm local` (no Ray), into one cache;
   copy it once per run, so every run measures the same CUBINs from a cache with no records.
2. ``ctbuild tune --gpus 0`` into the first copy, then ``--gpus 0,1,...,N-1`` into the second
   (fresh processes each).
3. Print, in one run:
   - the end-to-end speed-up: the one-GPU tune's wall time over the N-GPU tune's, and its ratio
     to N (the issue's target: at least 0.8 x N);
   - the measuring speed-up: the one-GPU run's measuring seconds over the N-GPU run's slowest
     lane (no process start-up in it);
   - each lane's entries and measuring seconds (how evenly the cost estimates split the keys);
   - the wall time of the lanes and of the finals (only the keys whose race ended on its
     budget are measured on every GPU);
   - whether both runs picked the same winners.

Needs a node with at least two GPUs of one model.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (str(ROOT), str(ROOT / "benchmarks")):
    if p not in sys.path:
        sys.path.insert(0, p)

from tune_reproducibility import DEFAULT_CONFIGS, precompile_all, records, tune  # noqa: E402


def visible_gpus() -> int:
    """GPUs this node shows, asked in a child process (the pool forks: no CUDA here yet)."""
    r = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                       capture_output=True, text=True, check=True)
    return int(r.stdout.strip())


def run_all(configs: list[Path], cache: Path, gpus: str) -> dict[str, Any]:
    """Every project tuned on ``gpus``: wall seconds, screening wall, finals wall, lanes."""
    out: dict[str, Any] = {"wall_s": 0.0, "screen_wall_s": 0.0, "finals_wall_s": 0.0,
                           "lanes": {}, "gpu": ""}
    for config in configs:
        seconds, result = tune(config, cache, "--gpus", gpus)
        fleet = result.get("fleet") or {}
        out["wall_s"] += seconds
        out["gpu"] = result["gpu"]
        out["screen_wall_s"] += fleet.get("screen_wall_s", 0.0)
        out["finals_wall_s"] += fleet.get("finals_wall_s", 0.0)
        for i, lane in enumerate(fleet.get("lanes", [])):
            mine = out["lanes"].setdefault(i, {"gpu": lane["gpu"], "entries": 0,
                                               "measure_s": 0.0})
            mine["entries"] += lane["entries"]
            mine["measure_s"] += lane["measure_s"]
        out["finals_keys"] = out.get("finals_keys", 0) + fleet.get("finals_keys", 0)
    out["lanes"] = [out["lanes"][i] for i in sorted(out["lanes"])]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", action="append", type=Path,
                    help="project(s) to tune (default: benchmarks/kernels/tune_all.toml)")
    ap.add_argument("--gpus", default="all", help="the N-GPU run's --gpus (default: all)")
    ap.add_argument("--arch", default="sm_90", help="this node's arch (asked before CUDA starts)")
    ap.add_argument("--workdir", type=Path, help="keep the caches here (default: a temp dir)")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args()
    configs = args.config or DEFAULT_CONFIGS
    visible = visible_gpus()
    many = (",".join(str(i) for i in range(visible)) if args.gpus == "all" else args.gpus)
    n = len(many.split(","))
    if n < 2:
        sys.exit(f"this node shows {visible} GPU(s): the benchmark needs at least two")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="ctbuild-gpus-"))
    base = work / "base"
    precompile_all(base, configs, args.arch)
    caches = {"one": work / "one", "many": work / "many"}
    for cache in caches.values():
        shutil.copytree(base, cache)
    one = run_all(configs, caches["one"], "0")
    many_run = run_all(configs, caches["many"], many)
    serial = sum(lane["measure_s"] for lane in one["lanes"])
    slowest = max(lane["measure_s"] for lane in many_run["lanes"])
    speedup = serial / slowest if slowest else 0.0
    end_to_end = one["wall_s"] / many_run["wall_s"]
    ra, rb = records(caches["one"]), records(caches["many"])
    same = sum(ra[k]["config"] == rb[k]["config"] for k in set(ra) & set(rb))
    result = {"gpu": one["gpu"], "n": n, "one": one, "many": many_run,
              "measure_speedup": speedup, "end_to_end_speedup": end_to_end,
              "efficiency": end_to_end / n,
              "keys": len(set(ra) & set(rb)), "same_winner": same}
    print(f"GPU: {one['gpu']} x {n}; {result['keys']} keys")
    print(f"end to end: one GPU {one['wall_s']:.1f} s, {n} GPUs {many_run['wall_s']:.1f} s -> "
          f"{end_to_end:.2f}x = {end_to_end / n:.2f} x N (target >= 0.80 x N)")
    print(f"measuring: one GPU {serial:.2f} s; {n} GPUs: slowest lane {slowest:.2f} s -> "
          f"{speedup:.2f}x = {speedup / n:.2f} x N")
    for lane in many_run["lanes"]:
        print(f"  lane GPU {lane['gpu']}: {lane['entries']} entries, measuring "
              f"{lane['measure_s']:.2f} s")
    for name, r in (("one GPU", one), (f"{n} GPUs", many_run)):
        print(f"{name}: tune {r['wall_s']:.1f} s wall; lanes {r['screen_wall_s']:.1f} s wall "
              f"(process start-up included); finals {r['finals_wall_s']:.1f} s for "
              f"{r.get('finals_keys', 0)} key(s)")
    print(f"same winner in both runs: {same}/{result['keys']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
