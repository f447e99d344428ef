"""A usage error is one line on stderr, exit 2, naming what is wrong and whose ``--help``
explains the options (argparse's default printed the whole usage block above it)."""
from __future__ import annotations

import pytest
from conftest import run_cli

CASES = [
    (("tune", "--tie-band", "60"), "tie band 60% is outside (0, 50)%", "ctbuild tune --help"),
    (("tune", "--refine", "9"), "from 1 to 4, got '9'", "ctbuild tune --help"),
    (("plan", "--bogus"), "unrecognized arguments: --bogus", "ctbuild plan --help"),
    (("cache", "ls", "--bogus"), "unrecognized arguments: --bogus", "ctbuild cache --help"),
    (("frob",), "invalid choice: 'frob'", "ctbuild --help"),
]


@pytest.mark.parametrize("argv,problem,helps", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_a_usage_error_is_one_line(argv: tuple[str, ...], problem: str, helps: str) -> None:
    out = run_cli(*argv)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "usage:" not in out.stderr, out.stderr
    assert problem in out.stderr and f"(see '{helps}')" in out.stderr
    assert out.stdout == ""
