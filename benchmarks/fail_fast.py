"""How soon `ctbuild precompile` gives up where it must: the timing claims the tests used to
assert (an unreachable cluster failed in under 60 s, a build with a hung compile in under
120 s), measured instead of asserted. The tests check what makes them fast: the error names
ctbuild's own connection check, the hangs end as CompilerTimeoutError and Timeout.

    python benchmarks/fail_fast.py [--runs 3]

Prints per run the wall time of each case and its ratio to the limit that should end it: the
connection check's timeout for ``--address`` with nothing listening, ``--compile-timeout``
for the planted hangs of tests/fixtures/farm_project/faulty.toml; and the medians.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FARM_PROJECT = ROOT / "tests" / "fixtures" / "farm_project"
for p in (str(ROOT), str(FARM_PROJECT)):
    if p not in sys.path:
        sys.path.insert(0, p)

from cli_helpers import FAULTY, SMALL, free_port, precompile  # noqa: E402

from ctbuild.farm.cluster import REACHABLE_TIMEOUT_S  # noqa: E402

COMPILE_TIMEOUT_S = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    walls: dict[str, list[float]] = {"unreachable": [], "hung compiles": []}
    limits = {"unreachable": REACHABLE_TIMEOUT_S, "hung compiles": float(COMPILE_TIMEOUT_S)}
    with tempfile.TemporaryDirectory(prefix="fail-fast-") as tmp:
        for i in range(args.runs):
            proc, wall, _ = precompile("--config", str(SMALL), "--cache", f"{tmp}/u{i}",
                                       "--address", f"127.0.0.1:{free_port()}")
            walls["unreachable"].append(wall)
            print(f"unreachable --address run {i}: {wall:6.2f} s (exit {proc.returncode}), "
                  f"{wall / REACHABLE_TIMEOUT_S:.2f}x the connection check's timeout")
            proc, wall, _ = precompile("--config", str(FAULTY), "--cache", f"{tmp}/h{i}",
                                       "--compile-timeout", str(COMPILE_TIMEOUT_S),
                                       "--workers", "2", env={"FARM_FIXTURE_HANG": "1"})
            walls["hung compiles"].append(wall)
            print(f"hung compiles run {i}: {wall:6.2f} s (exit {proc.returncode}), "
                  f"{wall / COMPILE_TIMEOUT_S:.1f}x --compile-timeout")
    print(", ".join(f"median {k}: {statistics.median(v):.2f} s "
                    f"({statistics.median(v) / limits[k]:.2f}x its limit)"
                    for k, v in walls.items()))


if __name__ == "__main__":
    main()
