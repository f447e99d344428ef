"""Where ``ctbuild precompile`` compiles: on Ray, or on local worker processes only.

Ray is the default farm where it is installed: it joins clusters (``--address``) and an
embedded one uses every core of a big host. But an embedded Ray takes 8-19 s to come up on 2
cores, longer than a small rebuild's compiles; and a serving install (no ``farm`` extra) has
no Ray at all. So ``--farm auto`` (the default) compiles on local worker processes (the same
`ctbuild.farm.FarmWorker`, `ctbuild.farm.local_workers`) when Ray is not installed, or when the build's
estimated work per worker is below `SMALL_BUILD_SECONDS`: it is over before Ray would be up.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Callable, Iterable

from ..project import ConfigError

FARMS = ("auto", "ray", "local")
#: Estimated compile seconds per worker below which ``auto`` skips Ray: about the time an
#: embedded Ray takes to have its first worker warm on a small host.
SMALL_BUILD_SECONDS = 8.0


def add_farm_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--farm", choices=FARMS, default="auto",
        help="where to compile: ray (embedded, or the cluster of --address), local (worker "
             "processes on this machine, no Ray), auto (default: ray, but local where Ray is "
             "not installed or the build is small enough to finish before Ray is up)")


def farm_mode(args: argparse.Namespace) -> tuple[str, str | None]:
    """("ray" | "local" | "auto", a note to print once or None); `ConfigError` for flags
    that cannot work together (a cluster without Ray, a cluster with ``--farm local``)."""
    from ctbuild.farm.cluster import ray_installed, resolve_address

    address = resolve_address(args.address)
    named = f"--address {args.address}" if args.address else f"RAY_ADDRESS={address}"
    if address is not None and args.farm == "local":
        raise ConfigError(f"{named} names a Ray cluster but --farm local compiles here; "
                          "drop one of them")
    if ray_installed():
        return ("ray" if address is not None else args.farm), None
    if address is not None or args.farm == "ray":
        what = named if address is not None else "--farm ray"
        raise ConfigError(f"{what} needs Ray, which is not installed here: install the farm "
                          "extra (pip install 'ctbuild[farm]'), or drop it to compile on "
                          "local worker processes")
    return "local", ("Ray is not installed here (no 'farm' extra): compiling on local "
                     "worker processes")


def is_small(jobs: Iterable[dict[str, Any]], estimate: Callable[[dict[str, Any]], float],
             workers: int | None) -> bool:
    """Whether these jobs' estimated work per worker is below `SMALL_BUILD_SECONDS`."""
    costs = [estimate(job) for job in jobs]
    slots = max(1, min(workers or os.cpu_count() or 1, len(costs) or 1))
    return sum(costs) / slots < SMALL_BUILD_SECONDS
