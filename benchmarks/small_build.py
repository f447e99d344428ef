"""A small rebuild end to end: `ctbuild precompile` of a 4-job project into a fresh cache, on
local worker processes (``--farm local``, what ``auto`` picks for it) and on an embedded Ray
(``--farm ray``), alternating, each run a fresh process as a user runs it:

    python benchmarks/small_build.py [--runs 3] [--config tests/fixtures/robust_project/ctbuild.toml]

Prints per run the wall time, the summed compile seconds and the farm's start-up, and the
medians; a no-op precompile (everything cached) gives the fixed cost any run pays (Python,
imports, the toolchain probe, the plan).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def precompile(config: str, cache: Path, *extra: str) -> tuple[float, dict]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ctbuild", "precompile", "--config", config,
                           "--arch", "sm_90,sm_100", "--cache", str(cache), "--json", *extra],
                          capture_output=True, text=True, cwd=ROOT, check=True)
    return time.perf_counter() - start, json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="tests/fixtures/robust_project/ctbuild.toml")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    walls: dict[str, list[float]] = {"local": [], "ray": [], "no-op": []}
    with tempfile.TemporaryDirectory(prefix="small-build-") as tmp:
        for i in range(args.runs):
            for farm in ("local", "ray"):
                cache = Path(tmp) / f"{farm}-{i}"
                wall, out = precompile(args.config, cache, "--farm", farm)
                walls[farm].append(wall)
                print(f"{farm:<6} run {i}: {wall:6.2f} s end to end, {out['jobs']} jobs, "
                      f"compile {out['compile_seconds']:.2f} s summed, start-up "
                      f"{out['startup_seconds']:.2f} s, compiling {out['run_seconds']:.2f} s")
                if farm == "local":
                    walls["no-op"].append(precompile(args.config, cache)[0])
                shutil.rmtree(cache)
    print(", ".join(f"median {k}: {statistics.median(v):.2f} s" for k, v in walls.items()))


if __name__ == "__main__":
    main()
