"""Reports other programs read (``--report``, ``CTBUILD_LEDGER``) are written whole or not at
all, and only as regular files: a link is followed, a FIFO or device node refused, never
replaced (`ctbuild.cache.user_files`)."""
from __future__ import annotations

import json
import os
import stat
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


def test_precompile_refuses_a_fifo_or_device_report_before_building(tmp_path: Path, capsys) -> None:
    """Refused at once, in one line, the node left as it was (a rename would have made it a
    regular file: as root, `--report /dev/null` replaced the system's /dev/null)."""
    from ctbuild.cli import main
    os.mkfifo(tmp_path / "fifo")
    nodes = [tmp_path / "fifo"]
    try:
        os.mknod(tmp_path / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        nodes.append(tmp_path / "null")
    except PermissionError:  # not root: the FIFO alone
        pass
    for node in nodes:
        assert main(["precompile", "--config", str(tmp_path / "none.toml"), "--report", str(node)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and f"--report {node}" in err, err
        assert "not a regular file" in err and not stat.S_ISREG(os.lstat(node).st_mode)


def test_tune_report_refuses_a_fifo_up_front_and_writes_through_a_link(tmp_path: Path) -> None:
    from ctbuild.commands.tune import report_problem
    from ctbuild.tune.report import write_report
    os.mkfifo(tmp_path / "fifo")
    assert "not a regular file" in (report_problem(str(tmp_path / "fifo")) or "")
    (tmp_path / "page.html.json").symlink_to(tmp_path / "fifo")
    assert "a FIFO" in (report_problem(str(tmp_path / "page.html")) or "")  # its data file too
    (tmp_path / "page.html.json").unlink()
    link = tmp_path / "link.html"
    link.symlink_to(tmp_path / "real.html")
    assert report_problem(str(link)) is None
    write_report(link, {"entries": []})
    assert link.is_symlink() and (tmp_path / "real.html").read_text().startswith("<!doctype html>")
    assert json.loads((tmp_path / "link.html.json").read_text()) == {"entries": []}


def test_the_ledger_refuses_a_fifo_with_one_warning_and_writes_through_a_link(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """CTBUILD_LEDGER is written by the serving process: a FIFO there must neither block it
    nor be replaced, and it warns once, not at every write."""
    from ctbuild.serve.ledger import Ledger
    os.mkfifo(tmp_path / "fifo")
    monkeypatch.setenv("CTBUILD_LEDGER", str(tmp_path / "fifo"))
    ledger = Ledger()
    ledger.write_env()
    ledger.write_env()
    warned = [r.getMessage() for r in caplog.records if "ledger" in r.getMessage()]
    assert len(warned) == 1 and "a FIFO" in warned[0], warned
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    link = tmp_path / "ledger.json"
    link.symlink_to(tmp_path / "real.json")
    monkeypatch.setenv("CTBUILD_LEDGER", str(link))
    ledger.write_env()
    assert link.is_symlink() and json.loads((tmp_path / "real.json").read_text())["pid"] == os.getpid()
