"""Nothing is left behind: no worker temp dir after a build, no process after a SIGKILLed driver."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "farm_project"))
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


def test_sigkill_of_the_driver_leaves_no_process_it_started(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(FARM_FIXTURE_HANG="1", PYTHONPATH=str(ROOT))
    driver = subprocess.Popen(
        [sys.executable, "-m", "ctbuild", "precompile", "--config", str(FAULTY), "--cache",
         str(tmp_path / "c"), "--workers", "2", "--early-workers", "1", "--compile-timeout",
         "600", "--farm", "ray"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
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
        assert any("farm.local_workers" in _cmdline(p) for p in started), started
        driver.kill()
        driver.wait()
        deadline = time.monotonic() + 30
        alive = started
        while alive and time.monotonic() < deadline:
            time.sleep(0.5)
            alive = {p: t for p, t in started.items() if (st := _stat(p)) and st[1] == t}
        assert not alive, {p: _cmdline(p) for p in alive}
    finally:
        if driver.poll() is None:
            driver.kill()
