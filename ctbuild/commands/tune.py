"""``ctbuild tune`` (placeholder until tuning lands)."""
from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction, name: str, summary: str) -> None:
    p = sub.add_parser(name, help=summary, description=summary)
    p.set_defaults(run=lambda args: 2)
