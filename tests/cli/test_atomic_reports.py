"""Reports other programs read (``--report``, ``--json-out``, ``CTBUILD_LEDGER``) are written
whole or not at all."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctbuild.atomic_write import write_json


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("cannot be written")


def test_a_write_that_fails_midway_leaves_the_previous_report(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    write_json(report, {"jobs": list(range(1000))})
    before = report.read_bytes()
    assert json.loads(before)["jobs"][-1] == 999
    # json.dump has written part of the text when it reaches the value it cannot convert
    with pytest.raises(RuntimeError, match="cannot be written"):
        write_json(report, {"jobs": list(range(100_000)), "last": _Unprintable()})
    assert report.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
