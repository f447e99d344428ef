"""The ``CTBUILD_RECORD`` file, written by the serving process at its misses: a FIFO or a device
node there is refused at the first miss with one log line and the process serves on (a FIFO
used to block it, /dev/zero to grow it until MemoryError); an existing file is never read whole
(only its last `RECORD_TAIL_BYTES`) to skip lines already recorded."""
from __future__ import annotations

import json
import logging
import os
import stat
import threading
from pathlib import Path

import pytest

from ctbuild.serve import misses
from ctbuild.serve.misses import MissLog

WORKLOAD = {"X": {"tensor": [64, 64], "dtype": "float16"}}


def record_once(log: MissLog, kernel: str = "k", timeout: float = 5.0) -> bool:
    """``log.write_record`` on a thread, which must finish within ``timeout`` (a hang fails)."""
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(log.write_record(kernel, WORKLOAD, "sm_90")),
                              daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "writing the record blocked the serving thread"
    return result[0]


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "CTBUILD_RECORD" in r.getMessage()]


def unblock(fifo: Path) -> None:
    """Open the FIFO's other end, so a reader the old code left blocked on it returns."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def test_a_fifo_is_refused_at_the_first_miss_with_one_line(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    fifo = tmp_path / "misses.jsonl"
    os.mkfifo(fifo)
    log = MissLog(record=fifo)
    try:
        assert record_once(log) is False
        assert record_once(log, "other") is False
    finally:
        unblock(fifo)
    lines = refusals(caplog)
    assert len(lines) == 1 and str(fifo) in lines[0] and "a FIFO" in lines[0], lines
    assert caplog.records[0].levelno == logging.ERROR
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_device_node_is_refused_and_left_as_it_was(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A /dev/null twin (a /dev/zero one would make a regression read without end: the check
    is the same for every character device)."""
    device = tmp_path / "misses.jsonl"
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod of a character device needs root (CAP_MKNOD)")
    link = tmp_path / "link.jsonl"
    link.symlink_to(device)
    for path in (device, link):
        caplog.clear()
        assert record_once(MissLog(record=path)) is False
        lines = refusals(caplog)
        assert len(lines) == 1 and "a character device" in lines[0], lines
    assert stat.S_ISCHR(os.lstat(device).st_mode)


def test_a_link_is_followed_and_only_the_end_of_a_big_file_is_read(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A line older than the tail is written again (proof the start was not read: --from-record
    deduplicates it); one within the tail is not."""
    monkeypatch.setattr(misses, "RECORD_TAIL_BYTES", 4096)
    real = tmp_path / "real.jsonl"
    old = json.dumps({"kernel": "old", "workload": WORKLOAD, "arch": "sm_90"})
    recent = json.dumps({"kernel": "recent", "workload": WORKLOAD, "arch": "sm_90"})
    filler = json.dumps({"kernel": "filler", "workload": {"n": "x" * 100}, "arch": "sm_90"})
    real.write_text("\n".join([old, *[filler] * 100, recent]) + "\n")
    link = tmp_path / "misses.jsonl"
    link.symlink_to(real)
    log = MissLog(record=link)
    assert record_once(log, "recent") is False
    assert record_once(log, "old") is True
    assert record_once(log, "new") is True and record_once(log, "new") is False
    assert link.is_symlink()
    kernels = [json.loads(s)["kernel"] for s in real.read_text().splitlines()]
    assert kernels[-3:] == ["recent", "old", "new"] and kernels.count("recent") == 1
