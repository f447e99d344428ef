"""A farm of local worker processes only (no Ray installed, or a build too small to wait for
Ray): the same workers, queue and records; a worker that dies is replaced by a new local one.

Real worker processes and a real diskcache; the compile functions are the generic farm
fixtures (the farm knows nothing of cuTile)."""
from __future__ import annotations

import sys
from pathlib import Path

from ctbuild.cache import Store
from ctbuild.farm import Farm

FIXTURE = Path(__file__).parents[1] / "fixtures" / "farm_project"
sys.path.insert(0, str(FIXTURE))


def test_local_only_farm_compiles_and_replaces_a_dead_worker(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # any `import ray` would fail
    jobs = [{"key": f"k{i}", "payload": f"p{i}"} for i in range(5)]
    jobs.append({"key": "boom", "payload": "x"})
    with Farm(tmp_path / "c", "farm_fixture_fns:die_on_boom", workers=2, local_only=True,
              max_retries=1, setup_fn="farm_fixture_fns:setup", setup_args=("tc",),
              sys_paths=[str(FIXTURE)], expect={"toolchain": "tc"}) as farm:
        result = farm.run(jobs)
        assert farm.reaper is not None  # a SIGKILLed driver takes its workers along
    assert farm.reaper is None and not farm.started
    status = {r.key: r for r in result.records}
    assert all(status[f"k{i}"].status == "compiled" for i in range(5)), status
    assert status["boom"].status == "failed" and status["boom"].error_type == "WorkerDied"
    assert status["boom"].attempts == 2  # retried on a new local worker, then given up
    assert result.local_only and result.workers == 0 and result.early_workers == 2
    assert result.restarts == 2 and result.fatal is None
    with Store(tmp_path / "c") as store:
        assert all(store.has_compile(f"k{i}") for i in range(5))
        assert not store.has_compile("boom")
