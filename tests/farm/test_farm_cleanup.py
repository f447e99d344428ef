"""Nothing is left behind: no worker temp dir after a build, no process after a SIGKILLed driver;
SIGTERM and SIGINT end a build with ctbuild's one line."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures" / "farm_project"))
from cli_helpers import FAULTY, ROOT, SMALL, explain, precompile  # noqa: E402

pytestmark = pytest.mark.slow


def _leftovers(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_dir()
            and p.name.startswith(("ctbuild-", "farm-worker-"))]


@pytest.mark.parametrize("early", ["0", "1"])
def test_no_temp_dir_remains_after_a_build(tmp_path, early):
    """With Ray's workers only, and with a local worker compiling while Ray starts."""
    temp = Path(tempfile.mkdtemp(prefix="ct", dir="/tmp"))  # short: Ray's socket paths
    try:
        proc, _, out = precompile("--config", str(SMALL), "--cache", str(tmp_path / "c"),
                                  "--workers", "2", "--early-workers", early, "--json",
                                  "--farm", "ray",
                                  env={"TMPDIR": str(temp)})
        assert proc.returncode == 0 and out["compiled"] == 6, explain(proc)
        assert out["early_workers"] == int(early)
        assert not _leftovers(temp)
        assert (temp / "ray").is_dir()  # the build really ran with this TMPDIR
    finally:
        subprocess.run(["rm", "-rf", str(temp)], check=False)


def _stat(pid: int) -> tuple[int, int] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return None  # a zombie has exited
    return int(fields[1]), int(fields[19])


def _descendants(root: int) -> dict[int, int]:
    """pid -> start time of every live descendant of ``root``."""
    table = {int(n): st for n in os.listdir("/proc") if n.isdigit() and (st := _stat(int(n)))}
    found: dict[int, int] = {}
    frontier = {root}
    while frontier:
        frontier = {pid for pid, (ppid, _) in table.items() if ppid in frontier} - set(found)
        found.update({pid: table[pid][1] for pid in frontier})
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _hung_build(tmp_path: Path, **popen: object) -> tuple[subprocess.Popen, dict[int, int]]:
    """A precompile whose workers hang on a job, once Ray, both its workers and the local one
    are up; returns the driver and pid -> start time of every process it started."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(FARM_FIXTURE_HANG="1", PYTHONPATH=str(ROOT))
    driver = subprocess.Popen(
        [sys.executable, "-m", "ctbuild", "precompile", "--config", str(FAULTY), "--cache",
         str(tmp_path / "c"), "--workers", "2", "--early-workers", "1", "--compile-timeout",
         "600", "--farm", "ray"], cwd=ROOT, env=env, **popen)  # type: ignore[call-overload]
    deadline = time.monotonic() + 180
    while True:  # until both workers run: Ray and all its agents are up by then
        started = _descendants(driver.pid)
        if sum("FarmWorker" in _cmdline(p) for p in started) >= 2:
            break
        assert driver.poll() is None, "the driver exited before its workers started"
        assert time.monotonic() < deadline, "the workers never started"
        time.sleep(0.5)
    time.sleep(1.0)
    started = _descendants(driver.pid)
    assert len(started) >= 4, started  # GCS, raylet, agents, workers, the reaper
    # the local worker that compiled while Ray started is one of them (on its hung job)
    assert any("ctbuild.farm.local_workers" in _cmdline(p) for p in started), started
    return driver, started


def _none_alive(started: dict[int, int], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    alive = started
    while alive and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = {p: t for p, t in started.items() if (st := _stat(p)) and st[1] == t}
    assert not alive, {p: _cmdline(p) for p in alive}


def test_sigkill_of_the_driver_leaves_no_process_it_started(tmp_path):
    driver, started = _hung_build(tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        driver.kill()
        driver.wait()
        _none_alive(started)
    finally:
        if driver.poll() is None:
            driver.kill()


def test_sigterm_stops_the_build_with_one_line(tmp_path):
    """SIGTERM to the driver alone (``docker stop``, a CI timeout; Ctrl-C's SIGINT takes the
    same path): ctbuild's one line and 143, no native dump of Ray's on stderr, and no process
    left, not even the compiler a killed worker was running."""
    driver, started = _hung_build(tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, start_new_session=True)
    try:
        driver.send_signal(signal.SIGTERM)
        _, err = driver.communicate(timeout=120)
        assert driver.returncode == 128 + signal.SIGTERM, err
        assert err.splitlines() == ["ctbuild: interrupted by SIGTERM; what finished is kept "
                                    "(nothing failed was cached): re-run the same command to "
                                    "continue"], err
        _none_alive(started)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
