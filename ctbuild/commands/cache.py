"""``ctbuild cache ...``: the cache's own CLI (in the `cache` package), wired in here."""
from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction, name: str, summary: str) -> None:
    from cache.cli import add_cache_parser, run_cache_command
    add_cache_parser(sub)
    sub.choices[name].set_defaults(run=run_cache_command)
