"""``python -m cache COMMAND ...``: the ``ctbuild cache`` subcommands without the rest of ctbuild."""

import argparse
import logging
import sys

from .cli import add_cache_parser, run_cache_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m", description="ctbuild's kernel cache tools")  # usage: "python -m cache ..."
    add_cache_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["cache", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(format="%(levelname)s: %(message)s")
    return run_cache_command(args)


if __name__ == "__main__":
    sys.exit(main())
