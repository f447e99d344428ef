"""Options and error handling shared by the subcommands."""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Callable

from .. import settings
from ..declare import DeclarationError
from ..project import ConfigError, Project, load_project
from ..toolchain import ToolchainError

#: Exit code for bad input (declarations, config, flags), as argparse uses.
EXIT_USAGE = 2


def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type for counts such as ``--workers``."""
    return _whole(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type for counts that may be zero (``--early-workers 0``: none)."""
    return _whole(text, 0)


def positive_seconds(text: str) -> float:
    """argparse type for timeouts such as ``--compile-timeout`` (finite: ``inf`` would never fire)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (a finite number of seconds), got {text}")
    return value


def arch_list(text: str) -> list[str]:
    """argparse type for ``--arch``: comma-separated, none empty (``sm_90,,`` is a typo, not
    ``sm_90``); whether each arch is known is checked with the config (`ctbuild.arch`)."""
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(
            f"{text!r} has an empty arch; give comma-separated archs, e.g. sm_90,sm_100")
    return items


def add_project_args(parser: argparse.ArgumentParser, *, archs: bool = True,
                     cache: bool = True) -> None:
    parser.add_argument("--config", metavar="PATH",
                        help="ctbuild.toml or pyproject.toml with [tool.ctbuild] (default: "
                             f"${settings.CONFIG_ENV}, else the first found upward from the "
                             "current directory)")
    if archs:
        parser.add_argument("--arch", metavar="LIST", type=arch_list,
                            help="target archs, comma-separated, e.g. sm_90,sm_100 "
                                 "(default: the config's archs)")
    if cache:
        parser.add_argument("--cache", metavar="DIR",
                            help=f"cache directory (default: ${settings.CACHE_DIR_ENV}, else the "
                                 f"config's cache_dir, else ./{settings.DEFAULT_CACHE_DIR})")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def add_kernel_arg(parser: argparse.ArgumentParser, verb: str) -> None:
    """``--kernel NAME`` (repeatable): work on these kernels only (`project.select_kernels`)."""
    parser.add_argument("--kernel", metavar="NAME", action="append", dest="kernels",
                        help=f"{verb} only this kernel (repeatable; default: every kernel of "
                             "the project)")


def project_from_args(args: argparse.Namespace) -> Project:
    return load_project(args.config, archs=getattr(args, "arch", None),
                        cache_dir=getattr(args, "cache", None))


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"ctbuild: error: {message}", file=sys.stderr)
    return code


def guarded(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn the errors users cause into one clear line and exit 2, not a traceback."""
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except (ConfigError, DeclarationError, ToolchainError) as exc:
            return fail(str(exc))
    return wrapper
