"""The gate a tune's measuring processes wait at while the identity check runs (real
processes, no GPU)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ctbuild.tune.gate import Gate

WAITER = ("import sys; from ctbuild.tune.gate import Gate; "
          "sys.exit(0 if Gate(sys.argv[1]).wait(int(sys.argv[2])) else 3)")


def _waiter(path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WAITER, str(path), str(os.getpid())])


@pytest.mark.parametrize("fails", [False, True])
def test_processes_started_before_the_check_measure_only_after_it_passed(
        tmp_path: Path, fails: bool) -> None:
    """Two processes wait while the check runs; a check that returns lets them go, one that
    raises stops them, and `finish` raises its error in the supervisor."""
    gate = Gate(tmp_path / "gate")
    waiters = [_waiter(gate.path) for _ in range(2)]
    time.sleep(0.5)
    assert all(w.poll() is None for w in waiters)  # nothing opened yet: still waiting

    def check() -> None:
        time.sleep(0.3)
        if fails:
            raise RuntimeError("stale entries")
    gate.after(check)
    assert [w.wait(timeout=60) for w in waiters] == [3 if fails else 0] * 2
    assert gate.stopped() is fails
    if fails:
        with pytest.raises(RuntimeError, match="stale entries"):
            gate.finish()
    else:
        gate.finish()
    assert not list(tmp_path.glob("*.tmp"))


def test_a_waiter_whose_supervisor_died_stops_waiting(tmp_path: Path) -> None:
    """The supervisor is killed before it opens the gate: its child (re-parented) gives up
    rather than waiting forever, also where the supervisor died before the child began to
    wait (it then never saw its parent change)."""
    script = ("import os, subprocess, sys, time; "
              f"p = subprocess.Popen([sys.executable, '-c', {WAITER!r}, sys.argv[1], "
              "str(os.getpid())]); print(p.pid, flush=True)")
    sup = subprocess.run([sys.executable, "-c", script, str(tmp_path / "gate")],
                         capture_output=True, text=True, timeout=60)
    pid = int(sup.stdout.split()[0])
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists() or \
        Path(f"/proc/{pid}/status").read_text().find("zombie") >= 0
    assert not (tmp_path / "gate").exists()
