"""The ``ctbuild`` command line. Each subcommand lives in `ctbuild.commands.<name>` and is
imported only when used, so ``ctbuild cache stats`` on a GPU node never imports Ray."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from . import __version__

#: Subcommands in help order: module name under ctbuild.commands, one-line summary.
COMMANDS = {
    "plan": "list kernels x workloads x archs, their configs and the compile jobs",
    "precompile": "compile every planned config to CUBINs in the cache (CPU, Ray)",
    "tune": "measure the precompiled candidates on this GPU and record the winners",
    "cache": "inspect, verify, trim, export and import the kernel cache",
    "doctor": "check the toolchain, CUDA_HOME, the GPU and the cache directory",
}

EPILOG = """\
typical flow:
  ctbuild plan --config examples/ctbuild.toml --arch sm_90,sm_100
  ctbuild precompile --config examples/ctbuild.toml --cache /cache     # docker build, CPU
  ctbuild tune --config examples/ctbuild.toml --cache /cache           # one GPU node
  CTBUILD_CACHE_DIR=/cache python serve.py                             # warm start

Run 'ctbuild COMMAND --help' for each command's options.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ctbuild", description="Precompile and autotune cuTile kernels at build time.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ctbuild {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, summary in COMMANDS.items():
        module = importlib.import_module(f"ctbuild.commands.{name}")
        module.add_parser(sub, name, summary)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="ctbuild: %(levelname)s: %(message)s")
    if not args.command:
        parser.print_help()
        return 2
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
