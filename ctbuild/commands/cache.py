"""``ctbuild cache ...``: the cache's own CLI (in `ctbuild.cache`), wired in here.

`ctbuild.cache` knows nothing of ctbuild's config files, so this wrapper chooses the cache
directory as every ctbuild command and the runtime do (`ctbuild.settings.choose_cache`) and
passes it on with why, and for ``pull`` the local GPU's arch. It also adds what needs the
project's kernels: ``verify --identity`` (`ctbuild.compile.identity`) and ``prune``
(`ctbuild.compile.prune`).
"""
from __future__ import annotations

import argparse

from .. import settings
from .common import positive_int

PRUNE_EPILOG = """\
examples:
  ctbuild cache prune --config ctbuild.toml --dry-run   what would go
  ctbuild cache prune --config ctbuild.toml --keep 1    keep only what the project plans now

Entries of kernels the project does not declare, and entries that record no kernel
fingerprint, are left alone (`ctbuild cache rm KERNEL` removes a kernel's entries).
"""


def add_parser(sub: argparse._SubParsersAction, name: str, summary: str) -> None:
    from ctbuild.cache.cli import add_cache_parser
    add_cache_parser(sub)
    sub.choices[name].set_defaults(run=run)
    from .identity import add_identity_args
    add_identity_args(sub.choices[name])
    _add_prune(sub.choices[name])


def _add_prune(cache_parser: argparse.ArgumentParser) -> None:
    subs = next(a for a in cache_parser._actions if isinstance(a, argparse._SubParsersAction))
    prune = subs.add_parser(
        "prune", help="drop entries of kernel versions the project no longer plans",
        epilog=PRUNE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Remove the compile entries, tuning records and CUBINs of kernel fingerprints "
                    "(kernel source versions) the project no longer plans, keeping per kernel the "
                    "planned fingerprint and the most recent others, N in all (by when their "
                    "entries were written).")
    prune.add_argument("--config", metavar="PATH",
                       help="the project config (default: $CTBUILD_CONFIG, else the ctbuild.toml "
                            "found upward from the current directory)")
    prune.add_argument("--cache", dest="cache_dir", metavar="DIR",
                       help=f"cache directory (default: ${settings.CACHE_DIR_ENV}, else the "
                            f"config's cache_dir, else ./{settings.DEFAULT_CACHE_DIR})")
    prune.add_argument("--keep", type=positive_int, default=2, metavar="N",
                       help="fingerprints to keep per kernel, the planned one first (default 2)")
    prune.add_argument("--dry-run", action="store_true", help="say what would go; remove nothing")
    prune.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    from ctbuild.cache.cli import run_cache_command
    if getattr(args, "identity", False):
        from .identity import run_identity
        return run_identity(args)
    if args.cache_command == "prune":
        from .prune import run_prune
        return run_prune(args)
    chosen = settings.choose_cache(args.cache_dir, config=getattr(args, "config", None))
    args.cache_dir, args.cache_from = str(chosen.path), chosen.why
    if args.cache_command == "pull":
        args.local_arch = _local_arch()
    return run_cache_command(args)


def _local_arch() -> str | None:
    """This machine's GPU arch (``sm_90``) through the CUDA driver, or None where none is visible:
    `cache pull` checks an image's arch against it (the `cache` package cannot ask cuTile)."""
    try:
        from ..cutile import current_arch
        return str(current_arch(0))
    except Exception:  # no libcuda or no device: pull then needs --arch
        return None
