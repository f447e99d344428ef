"""``ctbuild cache verify --identity``: re-run cuTile's front end for cached entries."""
from __future__ import annotations

import argparse

from .. import settings
from ..project import load_project
from ..toolchain import probe
from .common import fail, guarded, print_json


def add_identity_args(cache_parser: argparse.ArgumentParser) -> None:
    """Add ``--identity`` (and the project ``--config`` it needs) to ``cache verify``."""
    subs = next(a for a in cache_parser._actions if isinstance(a, argparse._SubParsersAction))
    verify = subs.choices["verify"]
    verify.add_argument("--identity", action="store_true",
                        help="instead: re-run cuTile's front end for each entry of the project's "
                             "kernels and check its TileIR digest matches the recorded one "
                             "(exit 1 naming the kernel on a mismatch, or on an entry it cannot "
                             "check: no digest or workload recorded; needs tileiras)")
    verify.add_argument("--config", metavar="PATH",
                        help="with --identity: the project config (default: "
                             f"${settings.CONFIG_ENV}, else the ctbuild.toml found upward "
                             "from the current directory)")


@guarded
def run_identity(args: argparse.Namespace) -> int:
    from ctbuild.cache import Store

    from ..compile.identity import verify_identity
    from ..cutile import load_compiler_without_torch

    project = load_project(args.config, cache_dir=args.cache_dir)
    path = project.cache_dir
    if not path.is_dir():
        return fail(f"no cache at {path}: pass --cache DIR or set {settings.CACHE_DIR_ENV}")
    kernels = project.kernels()
    with Store(path) as store:
        entries = list(store.compile_entries())
    load_compiler_without_torch()  # the front end and the probe need no torch: ~1 s sooner
    report = verify_identity(kernels, entries, probe().fingerprint)
    if args.json:
        print_json(report.to_json())
    else:
        print(report.text())
    return 0 if report.ok else 1
