"""``python -m ctbuild.cache COMMAND ...``: the ``ctbuild cache`` subcommands without ctbuild's
CLI and phases (only the ``ctbuild`` package's ``__init__`` loads first, as for any submodule)."""

import argparse
import logging
import os
import sys

from .cli import add_cache_parser, run_cache_command

PROG = "python -m ctbuild.cache"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="ctbuild's kernel cache tools")
    add_cache_parser(parser.add_subparsers(dest="command", required=True), prog=PROG)
    args = parser.parse_args(["cache", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(format="%(levelname)s: %(message)s")
    try:
        code = run_cache_command(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:  # the reader (e.g. `| head`) closed the pipe: stop quietly, as git does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
