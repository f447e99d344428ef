"""Longest jobs first (by the cache's recorded compile seconds), and an ETA that ignores start-up."""
from __future__ import annotations

import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "farm_project"))

from cache import Store  # noqa: E402
from ctbuild.build.job_estimates import estimator, tile_volume  # noqa: E402
from ctbuild.build.progress import Progress  # noqa: E402
from farm import Farm  # noqa: E402
from farm.records import JobRecord  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "farm_project"


def _job(key: str, config: dict) -> dict:
    return {"key": key, "kernel": "mm", "arch": "sm_90", "config": config, "payload": key}


def test_recorded_seconds_rank_jobs_longest_first_and_the_farm_follows(tmp_path):
    cache = tmp_path / "c"
    with Store(cache, readonly=False) as store:  # an earlier build's records, other keys
        for old, cfg, secs in (("o1", {"T": 64}, 0.5), ("o2", {"T": 128}, 4.0)):
            store.put_compile(old, b"x", symbol="s",
                              meta={"kernel": "mm", "arch": "sm_90", "config": cfg,
                                    "compile_seconds": secs})
        estimate = estimator(store)
    jobs = [_job("a", {"T": 64}), _job("b", {"T": 256}), _job("c", {"T": 128})]
    # recorded: c 4.0 s, a 0.5 s; b unknown: tile volume 256 gives a small guess
    assert estimate(jobs[2]) == 4.0 and estimate(jobs[0]) == 0.5
    assert 0 < estimate(jobs[1]) < 0.5 and tile_volume({"T": 256, "n": 3, "f": True}) == 256
    order: list[str] = []
    with Farm(cache, "farm_fixture_fns:echo_compile", workers=1, max_batch=1,
              sys_paths=[str(FIXTURE)], estimate=estimate) as farm:
        result = farm.run(jobs, on_record=lambda r: order.append(r.key))
    assert order == ["c", "a", "b"] and result.count("compiled") == 3


def test_eta_counts_from_the_first_ready_worker_not_from_ray_start_up():
    progress = Progress(10, io.StringIO(), tty=False)
    progress.start -= 60.0   # a minute of start-up before any worker was ready
    progress.workers_ready()
    progress.work_start -= 1.0  # one second of compiling since
    progress.record(JobRecord("k", "compiled", 0.5))
    text = progress.status_text()
    assert "1.0 cfg/s" in text and "ETA 9s" in text, text
