"""The farm as a generic executor (real Ray, real diskcache; compile function from a fixture)."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from ctbuild.cache import Store
from ctbuild.farm import Farm, FarmError, run_jobs
from ctbuild.farm.cluster import IDLE_DAEMONS, child_processes

FIXTURE = Path(__file__).parents[1] / "fixtures" / "farm_project"
sys.path.insert(0, str(FIXTURE))


def _jobs(actions):
    return [{"key": f"k{i:03d}", "payload": f"p{i}", "action": a, "kernel": "echo",
             "arch": "sm_90", "config": {"i": i}} for i, a in enumerate(actions)]


def test_generic_jobs_failures_isolated_and_never_cached(tmp_path):
    actions = ["ok"] * 12 + ["fail", "empty"] + ["ok"] * 6
    jobs = _jobs(actions)
    jobs.append(dict(jobs[0]))  # a duplicate key is built once
    with Farm(tmp_path / "c", "farm_fixture_fns:echo_compile", workers=2,
              setup_fn="farm_fixture_fns:setup", setup_args=("tc1",), sys_paths=[str(FIXTURE)],
              expect={"toolchain": "tc1"}) as farm:
        seen = []
        window_began = time.monotonic()
        result = farm.run(jobs, on_record=seen.append)
        window = time.monotonic() - window_began
        # the embedded Ray's daemons that a build needs nothing from run on idle CPU only;
        # the GCS and the raylet, which scheduling waits on, keep their priority
        children = child_processes(os.getpid())
        for daemon in IDLE_DAEMONS:
            assert [os.sched_getscheduler(p) for p, cmd in children if daemon in cmd] == \
                [os.SCHED_IDLE], (daemon, children)
        core = [p for p, cmd in children if "gcs_server" in cmd or "raylet/raylet" in cmd]
        assert len(core) == 2 and all(os.sched_getscheduler(p) == os.SCHED_OTHER for p in core)
    assert result.workers == 2 and len(result.records) == 20 and len(seen) == 20
    assert result.fatal is None
    steps = result.startup_steps  # where the start-up went: Ray, then workers, then warm
    assert 0 < steps["ray"] <= steps["spawned"] <= steps["ready"] == round(result.startup_seconds, 3)
    # worker-seconds: the compiles ran while their workers were open to jobs, and the two
    # workers were open at most from the first one ready to the run's end, inside this window
    assert sum(r.seconds for r in result.records) <= result.worker_seconds \
        <= 2 * (window - result.startup_seconds)
    by_key = {r.key: r for r in result.records}
    assert by_key["k012"].status == "failed" and by_key["k012"].error_type == "ValueError"
    assert by_key["k012"].first_error_line == "ValueError: planted failure for k012"
    assert by_key["k013"].status == "failed" and "empty CUBIN" in by_key["k013"].error
    # Every good job landed. (A job Ray re-delivers after a lost reply finds its own CUBIN and
    # reports "cached", so the exact split between the two statuses is not asserted.)
    landed = {r.key for r in result.records if r.status in ("compiled", "cached")}
    assert landed == {f"k{i:03d}" for i, a in enumerate(actions) if a == "ok"}, result.records
    # every worker that compiled a job reported its set-up, under its slot's name (which slots
    # report is timing: one Ray worker may still be warming when twenty quick jobs are done)
    reported = {i["worker"]: i["slot"] for i in result.worker_info}
    assert reported and set(reported.values()) <= {"w0", "w1"}
    assert {r.worker for r in result.records if r.status == "compiled"} <= set(reported)
    assert all(i["pid_env"] == i["slot"] for i in result.worker_info)  # FARM_WORKER is set
    with Store(tmp_path / "c") as store:
        for r in result.records:
            assert store.has_compile(r.key) == (r.status == "compiled"), r
        hit = store.get_compile("k000")
        assert hit.cubin.startswith(b"p0|") and hit.symbol == "sym_k000"
        assert hit.meta["kernel"] == "echo" and hit.meta["config"] == {"i": 0}
        assert hit.meta["toolchain"] == "fixture-toolchain"
    # incremental: cached keys are skipped in the driver; the failed ones are tried again
    again = run_jobs(jobs, tmp_path / "c", "farm_fixture_fns:echo_compile",
                     sys_paths=[str(FIXTURE)], workers=1)
    assert again.count("cached") == 18 and again.count("failed") == 2
    assert again.count("compiled") == 0 and again.workers == 1
    # all cached: Ray is not even started
    ok_jobs = [j for j in jobs if j["action"] == "ok"]
    third = run_jobs(ok_jobs, tmp_path / "c", "farm_fixture_fns:echo_compile")
    assert third.workers == 0 and third.count("cached") == 18 and third.startup_seconds == 0
    assert third.startup_steps == {}


def test_fatal_error_aborts_and_toolchain_mismatch_refused(tmp_path):
    jobs = _jobs(["ok"] * 3 + ["mismatch"] + ["ok"] * 30)
    result = run_jobs(jobs, tmp_path / "c", "farm_fixture_fns:echo_compile", workers=1,
                      sys_paths=[str(FIXTURE)], fatal_errors=("CompileMismatchError",),
                      max_batch=1)
    assert result.fatal and "toolchain differs" in result.fatal
    statuses = [r.status for r in result.records]
    assert statuses[:3] == ["compiled"] * 3 and statuses[3] == "failed"
    aborted = [r for r in result.records if r.error_type == "Aborted"]
    assert aborted and all("aborted" in r.error for r in aborted)
    assert result.count("compiled") < 34  # it stopped, it did not grind through everything
    with Store(tmp_path / "c") as store:
        assert not any(store.has_compile(r.key) for r in result.records if not r.ok)

    with pytest.raises(FarmError, match="driver has 'tc-driver'"):
        run_jobs(_jobs(["ok"]), tmp_path / "c2", "farm_fixture_fns:echo_compile",
                 workers=1, sys_paths=[str(FIXTURE)], setup_fn="farm_fixture_fns:setup",
                 setup_args=("tc-worker",), expect={"toolchain": "tc-driver"})
    with Store(tmp_path / "c2") as store:
        assert not store.has_compile("k000")


def test_bad_options_are_refused(tmp_path):
    with pytest.raises(ValueError, match="workers"):
        Farm(tmp_path, "farm_fixture_fns:echo_compile", workers=0)
    with pytest.raises(TypeError, match="unknown farm option"):
        Farm(tmp_path, "farm_fixture_fns:echo_compile", wrokers=2)
    with pytest.raises(ValueError, match="str 'key'"):
        Farm(tmp_path, "farm_fixture_fns:echo_compile").run([{"payload": 1}])
