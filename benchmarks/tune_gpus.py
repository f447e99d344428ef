"""``ctbuild tune --gpus``: how much faster several GPUs of one node tune the same keys.

    python benchmarks/tune_gpus.py [--config C ...] [--gpus all] [--repeat 3] [--json FILE]

1. Precompile every planned candidate of each project (default: benchmarks/kernels/tune_all.toml)
   for this node's arch with `ctbuild precompile --farm local` (no Ray), into one cache;
   copy it once per run, so every run measures the same CUBINs from a cache with no records.
2. ``--repeat`` rounds, each ``ctbuild tune --gpus 0`` and ``--gpus 0,1,...,N-1`` (fresh
   processes, each into its own copy), in alternating order (one GPU first in even rounds), so
   a drift of the host or of the GPUs' clocks over the run falls on both sides. One pair of runs
   is not a figure: on one 2-GPU host its ratio moved between 1.34x and 1.63x.
3. Print, in one run:
   - the end-to-end speed-up: the median one-GPU wall over the median N-GPU wall, its ratio to
     N (the issue's target: at least 0.8 x N), and each round's ratio;
   - the measuring speed-up: the one-GPU run's measuring seconds over the N-GPU run's slowest
     lane (no process start-up in it), medians over the rounds;
   - the fixed part of a tune: its wall less its measuring (process start-up, the first key's
     imports, the finals, the exit), which N GPUs cannot shorten;
   - each lane's entries and measuring seconds (how evenly the cost estimates split the keys);
   - the wall time of the lanes and of the finals (only the keys whose race ended on its
     budget are measured on every GPU);
   - whether each round's two runs picked the same winners.

Needs a node with at least two GPUs of one model.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
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


def measured(r: dict[str, Any]) -> tuple[float, float]:
    """(measuring seconds of a run's lanes, of its slowest lane)."""
    times = [lane["measure_s"] for lane in r["lanes"]]
    return sum(times), max(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", action="append", type=Path,
                    help="project(s) to tune (default: benchmarks/kernels/tune_all.toml)")
    ap.add_argument("--gpus", default="all", help="the N-GPU run's --gpus (default: all)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of both runs (default: 3)")
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
    rounds = []
    for r in range(max(1, args.repeat)):
        runs: dict[str, Any] = {}
        for name in (("one", "many") if r % 2 == 0 else ("many", "one")):
            cache = work / f"{name}-{r}"
            shutil.copytree(base, cache)
            runs[name] = run_all(configs, cache, "0" if name == "one" else many)
        ra, rb = records(work / f"one-{r}"), records(work / f"many-{r}")
        runs["keys"] = len(set(ra) & set(rb))
        runs["same_winner"] = sum(ra[k]["config"] == rb[k]["config"] for k in set(ra) & set(rb))
        rounds.append(runs)
    one = [x["one"] for x in rounds]
    multi = [x["many"] for x in rounds]
    wall_one = statistics.median(x["wall_s"] for x in one)
    wall_many = statistics.median(x["wall_s"] for x in multi)
    serial = statistics.median(measured(x)[0] for x in one)
    slowest = statistics.median(measured(x)[1] for x in multi)
    end_to_end = wall_one / wall_many
    result = {"gpu": one[0]["gpu"], "n": n, "rounds": rounds,
              "end_to_end_speedup": end_to_end, "efficiency": end_to_end / n,
              "measure_speedup": serial / slowest if slowest else 0.0,
              "fixed_s": {"one": wall_one - serial, "many": wall_many - slowest}}
    print(f"GPU: {result['gpu']} x {n}; {rounds[0]['keys']} keys; {len(rounds)} round(s)")
    print(f"end to end (medians): one GPU {wall_one:.1f} s, {n} GPUs {wall_many:.1f} s -> "
          f"{end_to_end:.2f}x = {end_to_end / n:.2f} x N (target >= 0.80 x N); rounds: "
          + ", ".join(f"{x['one']['wall_s'] / x['many']['wall_s']:.2f}x" for x in rounds))
    print(f"measuring (medians): one GPU {serial:.2f} s; {n} GPUs: slowest lane {slowest:.2f} s "
          f"-> {result['measure_speedup']:.2f}x = {result['measure_speedup'] / n:.2f} x N")
    print(f"fixed part (wall less measuring, medians): one GPU {wall_one - serial:.2f} s, "
          f"{n} GPUs {wall_many - slowest:.2f} s")
    for r, x in enumerate(rounds):
        lanes = "; ".join(f"GPU {lane['gpu']} {lane['entries']} entries {lane['measure_s']:.2f} s"
                          for lane in x["many"]["lanes"])
        print(f"round {r}: one GPU {x['one']['wall_s']:.1f} s, {n} GPUs {x['many']['wall_s']:.1f} s "
              f"(lanes {x['many']['screen_wall_s']:.1f} s wall: {lanes}; finals "
              f"{x['many']['finals_wall_s']:.1f} s for {x['many'].get('finals_keys', 0)} key(s)); "
              f"same winner {x['same_winner']}/{x['keys']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
