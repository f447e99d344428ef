"""``ctbuild cache ...``: the cache's own CLI (in the `cache` package), wired in here.

The `cache` package knows nothing of ctbuild's config files, so this wrapper tells it the
cache_dir of the project config found in the current directory, if any, and for ``pull`` the
local GPU's arch. It also adds
``verify --identity``, which needs the project's kernels and cuTile (see `ctbuild.build.identity`).
"""
from __future__ import annotations

import argparse

from ..project import ConfigError, load_project


def add_parser(sub: argparse._SubParsersAction, name: str, summary: str) -> None:
    from cache.cli import add_cache_parser
    add_cache_parser(sub)
    sub.choices[name].set_defaults(run=run)
    from .identity import add_identity_args
    add_identity_args(sub.choices[name])


def run(args: argparse.Namespace) -> int:
    from cache.cli import run_cache_command
    if getattr(args, "identity", False):
        from .identity import run_identity
        return run_identity(args)
    try:
        args.config_cache_dir = str(load_project().cache_dir)
    except ConfigError:
        args.config_cache_dir = None
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
