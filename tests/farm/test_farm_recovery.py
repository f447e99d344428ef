"""A worker process that dies mid-job (os._exit): its job is retried on another worker."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures" / "farm_project"))
from cli_helpers import SMALL, explain, precompile  # noqa: E402

from ctbuild.cache import Store  # noqa: E402


def test_worker_death_retried_elsewhere(tmp_path):
    sentinel, report = tmp_path / "died", tmp_path / "report.json"
    proc, _, out = precompile("--config", str(SMALL), "--cache", str(tmp_path / "cache"),
                              "--workers", "2", "--json", "--report", str(report),
                              env={"FARM_FIXTURE_DIE_ONCE": str(sentinel)})
    assert proc.returncode == 0, explain(proc)
    assert sentinel.exists(), "the fixture never killed a worker: the test proves nothing"
    dead_pid = sentinel.read_text()
    assert out["compiled"] == 6 and out["failed"] == 0 and out["restarts"] >= 1
    rows = json.loads(report.read_text())["jobs"]
    victim = next(r for r in rows if r["config"] == {"TILE": 128, "occupancy": 2})
    assert victim["status"] == "compiled" and victim["attempts"] == 2, json.dumps(victim)
    assert victim["worker"] and not victim["worker"].endswith(f":{dead_pid}")
    with Store(tmp_path / "cache") as store:
        assert all(store.has_compile(r["key"]) for r in rows)


def test_worker_that_always_dies_fails_after_bounded_retries(tmp_path):
    """A job that kills every worker it runs on is recorded as failed after max_retries."""
    from ctbuild.farm import run_jobs
    fixture = str(Path(__file__).parents[1] / "fixtures" / "farm_project")
    jobs = [{"key": f"d{i}", "payload": "x", "action": "ok"} for i in range(3)]
    jobs.append({"key": "boom", "payload": "x", "action": "ok"})
    result = run_jobs(jobs, tmp_path / "c", "farm_fixture_fns:die_on_boom", workers=2,
                      sys_paths=[fixture], max_retries=1)
    by_key = {r.key: r for r in result.records}
    assert by_key["boom"].status == "failed" and by_key["boom"].error_type == "WorkerDied"
    assert by_key["boom"].attempts == 2 and "retries exhausted" in by_key["boom"].error
    assert all(by_key[f"d{i}"].status == "compiled" for i in range(3))
    with Store(tmp_path / "c") as store:
        assert not store.has_compile("boom")
