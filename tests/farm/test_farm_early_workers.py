"""Local workers compile while the embedded Ray starts; Ray's workers then take over.

Real Ray, real worker processes, a real diskcache; the compile functions are the generic farm
fixtures (the farm knows nothing of cuTile)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ctbuild.cache import Store
from ctbuild.farm import Farm
from ctbuild.farm.worker import LOCK_NAME, TEMP_PREFIX, UNLOCKED_GRACE, sweep_orphans

FIXTURE = Path(__file__).parents[1] / "fixtures" / "farm_project"
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(FIXTURE))
from farm_fixture_fns import read_log  # noqa: E402

pytestmark = pytest.mark.slow


def _jobs(n: int, sleep: float) -> list[dict]:
    return [{"key": f"k{i:03d}", "payload": f"p{i}", "sleep": sleep} for i in range(n)]


def _pid(worker: str | None) -> int:
    return int((worker or ":0").rsplit(":", 1)[1])


#: Jobs per batch in the hand-over test: a local worker a Ray worker replaces finishes the one
#: batch it holds (local workers hold one at a time), so at most this many of its compiles
#: start after Ray's first.
HANDOVER_BATCH = 6
#: Jobs of the hand-over test.
JOBS = 100


def test_local_workers_compile_until_rays_workers_take_over(tmp_path):
    log = tmp_path / "compiles.log"  # every compile's begin and end, in their real order
    # 15 s of jobs for the local worker alone: Ray's workers come up well within that even on
    # a loaded 2-core machine, so both kinds compile
    jobs = [{**job, "log": str(log)} for job in _jobs(JOBS, 0.15)]
    with Farm(tmp_path / "c", "farm_fixture_fns:echo_compile", workers=2, early_workers=1,
              setup_fn="farm_fixture_fns:setup", setup_args=("tc1",), max_batch=HANDOVER_BATCH,
              sys_paths=[str(FIXTURE)], expect={"toolchain": "tc1"}) as farm:
        window_began = time.monotonic()
        farm.start_in_background()
        result = farm.run(jobs)
        window = time.monotonic() - window_began
    assert result.fatal is None and result.count("compiled") == JOBS
    assert result.early_workers == 1 and result.workers == 2
    steps = result.startup_steps
    # the local worker was up before Ray was: the build's start-up is the local worker's
    assert 0 < steps["early"] <= steps["ready"] < steps["ray"] <= steps["spawned"], steps
    assert steps["ready"] == round(result.startup_seconds, 3)
    info = {i["slot"]: i for i in result.worker_info}
    # the local worker and the Ray workers that came up report (a second Ray worker still
    # warming when the jobs run out, as on a loaded machine, has nothing to report yet)
    assert "e0" in info and set(info) - {"e0"} and set(info) <= {"e0", "w0", "w1"}, info
    assert all(i["toolchain"] == "tc1" and i["pid_env"] == s for s, i in info.items())
    by_pid = {}
    for rec in result.records:
        by_pid.setdefault(_pid(rec.worker), []).append(rec.key)
    local = info["e0"]["pid"]
    assert by_pid.get(local), "the local worker compiled nothing"
    assert set(by_pid) - {local}, "Ray's workers compiled nothing"
    events = read_log(log)
    assert {k for sign, k, _ in events if sign == "+"} == {j["key"] for j in jobs}
    # ... and it took no more jobs once a Ray worker was up: only the batch it held then
    first_ray = next(i for i, (sign, _, pid) in enumerate(events) if sign == "+" and pid != local)
    local_after = [k for sign, k, pid in events[first_ray:] if sign == "+" and pid == local]
    assert len(local_after) <= HANDOVER_BATCH, (local_after, events)
    # never more compiles at once than worker slots: a Ray worker waits for the local one it
    # replaces (each compile's begin and end as the compiles themselves logged them)
    running = most = 0
    for sign, _, _ in events:
        running += 1 if sign == "+" else -1
        most = max(most, running)
    assert most <= 2, events
    # worker-seconds: every compile ran while its worker was open to jobs, and never more
    # than two were open at once (the local one, then the Ray worker that waited for it): no
    # worker is open before the first is ready, none after the run, and this test's own
    # window holds both ends
    busy = sum(r.seconds for r in result.records)
    assert busy <= result.worker_seconds <= 2 * (window - result.startup_seconds), \
        (busy, result.worker_seconds, window, result.startup_seconds)
    # the local worker left once a Ray worker replaced it (and was reaped, not left a zombie)
    with pytest.raises(ProcessLookupError):
        os.kill(local, 0)
    with Store(tmp_path / "c") as store:
        assert all(store.has_compile(r.key) for r in result.records)


def test_a_job_that_kills_the_local_worker_is_retried_on_ray(tmp_path):
    jobs = _jobs(6, 0.0) + [{"key": "boom", "payload": "x"}]
    with Farm(tmp_path / "c", "farm_fixture_fns:die_on_boom", workers=2, early_workers=1,
              sys_paths=[str(FIXTURE)], max_retries=1,
              estimate=lambda job: 10.0 if job["key"] == "boom" else 1.0) as farm:
        farm.start_in_background()
        result = farm.run(jobs)
    by_key = {r.key: r for r in result.records}
    # longest first: the local worker, up first, took "boom" and died; Ray's retry died too
    assert by_key["boom"].status == "failed" and by_key["boom"].error_type == "WorkerDied"
    assert by_key["boom"].attempts == 2 and result.restarts == 2
    assert all(by_key[f"k{i:03d}"].status == "compiled" for i in range(6))
    assert result.early_workers == 1


def test_a_fatal_error_on_a_local_worker_stops_the_build(tmp_path):
    jobs = [{"key": "bad", "payload": "x", "action": "mismatch"}] + _jobs(6, 0.3)
    with Farm(tmp_path / "c", "farm_fixture_fns:echo_compile", workers=2, early_workers=1,
              sys_paths=[str(FIXTURE)], fatal_errors=("CompileMismatchError",),
              estimate=lambda job: 10.0 if job["key"] == "bad" else 1.0) as farm:
        farm.start_in_background()
        result = farm.run(jobs)
        local = [i["pid"] for i in farm.early_info]
    # longest first: the local worker, up first, hit the toolchain mismatch; nothing after it
    assert result.fatal and "toolchain differs" in result.fatal
    by_key = {r.key: r for r in result.records}
    assert by_key["bad"].status == "failed" and _pid(by_key["bad"].worker) in local
    assert {r.error_type for r in result.records if r.key != "bad" and not r.ok} <= {"Aborted"}
    for pid in local:  # the local worker was stopped with the build
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_no_local_workers_when_turned_off(tmp_path):
    """(Without a background start there are none either: `test_farm_executor` sees only Ray's
    slots.)"""
    with Farm(tmp_path / "c", "farm_fixture_fns:echo_compile", workers=1, early_workers=0,
              sys_paths=[str(FIXTURE)]) as farm:
        farm.start_in_background()
        result = farm.run(_jobs(3, 0.0))
    assert result.early_workers == 0 and result.count("compiled") == 3
    assert "early" not in result.startup_steps
    assert {i["slot"] for i in result.worker_info} == {"w0"}


_HOLDER = "import sys, time; from ctbuild.farm.worker import hold_temp_dir; hold_temp_dir(sys.argv[1]); " \
          "print('locked', flush=True); time.sleep(600)"


def test_sweep_removes_only_the_temp_dirs_of_dead_workers(tmp_path):
    def make(name: str) -> Path:
        path = tmp_path / f"{TEMP_PREFIX}{name}"
        path.mkdir()
        (path / "scratch.ptx").write_text("x")
        return path

    live, dead, young, old = make("live"), make("dead"), make("young"), make("old")
    # a worker between creating its lock file and locking it: the file is there, still empty
    creating = make("creating")
    (creating / LOCK_NAME).touch()
    other = tmp_path / "not-ours"
    other.mkdir()
    holders = {}
    for path in (live, dead):
        holders[path] = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path)],
                                         stdout=subprocess.PIPE, text=True,
                                         env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert holders[path].stdout.readline().strip() == "locked"
    holders[dead].kill()
    holders[dead].wait()
    stale = time.time() - UNLOCKED_GRACE - 10  # a lockless dir: only once it is old
    os.utime(old, (stale, stale))
    try:
        assert sweep_orphans(str(tmp_path)) == 2
        assert live.is_dir() and young.is_dir() and other.is_dir() and creating.is_dir()
        assert not dead.exists() and not old.exists()
        holders[live].kill()
        holders[live].wait()
        assert sweep_orphans(str(tmp_path), own=str(young)) == 1 and not live.exists()
        assert young.is_dir()
    finally:
        for proc in holders.values():
            proc.kill()
            proc.wait()


_RACER = """
import os, shutil, sys, tempfile
from ctbuild.farm.worker import hold_temp_dir, sweep_orphans, TEMP_PREFIX
parent = sys.argv[1]
for _ in range(int(sys.argv[2])):
    path = tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=parent)
    fd = hold_temp_dir(path)
    sweep_orphans(parent, own=path)
    open(os.path.join(path, "scratch"), "w").close()  # raises if a sweeper took our directory
    shutil.rmtree(path)  # as FarmWorker.close: the directory goes first, then the lock
    os.close(fd)
"""


def test_workers_warming_up_at_once_never_sweep_each_others_live_dirs(tmp_path):
    """Many workers creating, locking and sweeping in one parent at the same time (as 64 local
    workers do): none loses the directory it holds."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, str(tmp_path), "150"], env=env,
                               stderr=subprocess.PIPE, text=True) for _ in range(8)]
    errors = [(p.wait(), p.stderr.read()) for p in racers]
    assert all(code == 0 for code, _ in errors), [e for c, e in errors if c]
