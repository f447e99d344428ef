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
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FARM_PROJECT = ROOT / "tests" / "fixtures" / "farm_project"
#: The timeout of ctbuild's own check that something listens at --address (farm/cluster.py).
CONNECT_TIMEOUT_S = 10.0
COMPILE_TIMEOUT_S = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def precompile(*args: str, env: dict[str, str] | None = None) -> tuple[float, int]:
    """Wall seconds and exit code of one ``ctbuild precompile`` (a fresh process)."""
    full = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    full.update(env or {})
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ctbuild", "precompile", *args], cwd=ROOT,
                          env=full, capture_output=True, text=True, timeout=600)
    return time.perf_counter() - start, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    walls: dict[str, list[float]] = {"unreachable": [], "hung compiles": []}
    limits = {"unreachable": CONNECT_TIMEOUT_S, "hung compiles": float(COMPILE_TIMEOUT_S)}
    with tempfile.TemporaryDirectory(prefix="fail-fast-") as tmp:
        for i in range(args.runs):
            wall, code = precompile("--config", str(FARM_PROJECT / "ctbuild.toml"), "--cache",
                                    f"{tmp}/u{i}", "--address", f"127.0.0.1:{free_port()}")
            walls["unreachable"].append(wall)
            print(f"unreachable --address run {i}: {wall:6.2f} s (exit {code}), "
                  f"{wall / CONNECT_TIMEOUT_S:.2f}x the connection check's timeout")
            wall, code = precompile("--config", str(FARM_PROJECT / "faulty.toml"), "--cache",
                                    f"{tmp}/h{i}", "--compile-timeout", str(COMPILE_TIMEOUT_S),
                                    "--workers", "2", env={"FARM_FIXTURE_HANG": "1"})
            walls["hung compiles"].append(wall)
            print(f"hung compiles run {i}: {wall:6.2f} s (exit {code}), "
                  f"{wall / COMPILE_TIMEOUT_S:.1f}x --compile-timeout")
    print(", ".join(f"median {k}: {statistics.median(v):.2f} s "
                    f"({statistics.median(v) / limits[k]:.2f}x its limit)"
                    for k, v in walls.items()))


if __name__ == "__main__":
    main()
