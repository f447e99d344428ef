"""Every command's ``--config`` help says where the config is looked for when the flag is not
given, as `settings.project_config` looks: ``$CTBUILD_CONFIG``, else upward from the current
directory (the help said "found in the current directory")."""
from __future__ import annotations

import argparse
from collections.abc import Iterator

from ctbuild.cli import build_parser


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _parsers(child)


def test_every_config_help_says_it_is_found_upward() -> None:
    helps = {p.prog: a.help or "" for p in _parsers(build_parser()) for a in p._actions
             if "--config" in a.option_strings}
    assert len(helps) >= 5, helps  # plan, precompile, tune, cache prune, cache verify, doctor
    for prog, text in helps.items():
        assert "$CTBUILD_CONFIG" in text and "upward from the current directory" in text, \
            f"{prog}: {text}"
