"""What re-running cuTile's front end costs per config, next to a full compile (tileiras).

`ctbuild cache verify --identity` re-runs the front end for every cached entry; this prints the
front end's share of a compile for one job per example kernel, measured in one run:

    python benchmarks/frontend_cost.py [--config examples/ctbuild.toml] [--arch sm_90]
"""
from __future__ import annotations

import argparse

from first_build import measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="examples/ctbuild.toml")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--per-kernel", type=int, default=3, help="jobs measured per kernel")
    args = parser.parse_args()
    rows = [(r["job"]["kernel"], r["front_s"], r["tileiras_s"])
            for r in measure(args.config, args.per_kernel, args.arch)[0]]
    print(f"{'kernel':<14} {'front end ms':>12} {'tileiras ms':>12} {'front/total':>12}")
    for name, front, back in rows:
        print(f"{name:<14} {front * 1e3:12.1f} {back * 1e3:12.1f} {front / (front + back):12.2f}")
    fronts = sum(r[1] for r in rows)
    total = sum(r[1] + r[2] for r in rows)
    print(f"mean front end {fronts / len(rows) * 1e3:.1f} ms per config; "
          f"front end / full compile = {fronts / total:.3f}")


if __name__ == "__main__":
    main()
