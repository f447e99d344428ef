"""Longest jobs first (by the cache's recorded compile seconds), and an ETA that ignores start-up.

The farms here run on local worker processes (``local_only``): the scheduler that ranks and
hands out the jobs is the one Ray's workers get too, and no Ray start (seconds a test) is
waited for; test_farm_executor.py and test_farm_early_workers.py run it over Ray's workers."""
from __future__ import annotations

import io
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures" / "farm_project"))
from farm_fixture_fns import read_log  # noqa: E402

from ctbuild.cache import Store  # noqa: E402
from ctbuild.compile.job_estimates import SCOUT_SHARE, estimator, tile_volume  # noqa: E402
from ctbuild.compile.progress import Progress  # noqa: E402
from ctbuild.farm import Farm  # noqa: E402
from ctbuild.farm.records import JobRecord  # noqa: E402

FIXTURE = Path(__file__).parents[1] / "fixtures" / "farm_project"


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
    assert 0 < estimate(jobs[1]) < 0.5
    assert tile_volume({"config": {"T": 256, "n": 3, "f": True}}) == 256
    # a planned job's constants, not its config: a head dimension counts, a row width is capped
    assert tile_volume({"config": {"T": 256}, "constants": [256, 128, 3, 8192]}) == 256 * 128 * 1024
    order: list[str] = []
    with Farm(cache, "farm_fixture_fns:echo_compile", workers=1, max_batch=1,
              sys_paths=[str(FIXTURE)], local_only=True, estimate=estimate) as farm:
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


def _estimator_recording(tmp_path, seconds: float):
    """The estimator of a cache that recorded one earlier compile: mm {"T": 64} on sm_90."""
    with Store(tmp_path / "c", readonly=False) as store:
        store.put_compile("old", b"x", symbol="s", meta={"kernel": "mm", "arch": "sm_90",
                                                          "config": {"T": 64},
                                                          "compile_seconds": seconds})
        return estimator(store)


def test_a_kernel_slower_than_guessed_is_rescaled_and_recorded_jobs_are_not(tmp_path):
    estimate = _estimator_recording(tmp_path, 0.5)
    attn = [{"key": f"a{t}", "kernel": "attn", "arch": "sm_90", "config": {"BM": t}}
            for t in (64, 128)]
    gemm = {"key": "g", "kernel": "gemm", "arch": "sm_90", "config": {"TM": 256, "TN": 256}}
    recorded = _job("r", {"T": 64})
    before = [estimate(j) for j in (*attn, gemm, recorded)]
    assert before[2] > before[1] > before[0] and before[3] == 0.5  # bigger tiles guess longer
    assert estimate.learn(attn[0], before[0] * 20)  # attention is 20x slower than guessed
    assert abs(estimate(attn[1]) / before[1] - 20) < 1e-6
    assert estimate(gemm) == before[2] and estimate(recorded) == 0.5  # others unchanged
    assert not estimate.learn(attn[0], before[0] * 21)  # a small move: no re-rank asked
    assert not estimate.learn(recorded, 9.0) and estimate(recorded) == 0.5


def test_a_job_running_past_its_guess_raises_its_kernels_other_guesses(tmp_path):
    estimate = _estimator_recording(tmp_path, 0.5)
    attn = [{"key": f"a{t}", "kernel": "attn", "arch": "sm_90", "config": {"BM": t}}
            for t in (32, 64, 128)]
    scout, gemm = attn[2], {"key": "g", "kernel": "gemm", "arch": "sm_90", "config": {"TM": 64}}
    recorded = _job("r", {"T": 64})
    jobs = [*attn, gemm, recorded]
    estimate.plan(jobs)
    before = {j["key"]: estimate(j) for j in jobs}
    guessed = estimate.guess(scout)
    assert not estimate.running(scout, guessed / 2)  # within its guess: says nothing
    assert {j["key"]: estimate(j) for j in jobs} == before
    # still running at 10x its guess: its kernel's other configs are guessed 10x longer
    assert estimate.running(scout, guessed * 10)
    assert all(math.isclose(estimate(j), before[j["key"]] * 10) for j in attn[:2])
    assert estimate(gemm) == before["g"] and estimate(recorded) == 0.5  # others unchanged
    assert not estimate.running(scout, guessed * 11)  # a small move: no re-rank asked
    assert not estimate.running(recorded, 60.0) and estimate(recorded) == 0.5
    # its result replaces the bound, even below it
    assert estimate.learn(scout, guessed * 3)
    assert math.isclose(estimate(attn[0]), before["a32"] * 3)
    # a bound below what the results say lowers nothing
    assert not estimate.running(attn[0], estimate.guess(attn[0]) * 2)
    assert math.isclose(estimate(attn[1]), before["a64"] * 3)


def test_a_kernels_long_config_goes_out_while_its_first_job_still_runs(tmp_path):
    # "s": a kernel compiled before (0.105 s a job); "pd": one never compiled, guessed from
    # its tile volumes: p1 0.112 s (its scout, first out), p2 0.1005 s (last, below the s jobs)
    with Store(tmp_path / "c", readonly=False) as store:
        for i in range(4):
            store.put_compile(f"old{i}", b"x", symbol="s", meta={
                "kernel": "s", "arch": "sm_90", "config": {"n": i}, "compile_seconds": 0.105})
        estimate = estimator(store)
    log, p2_began, ranked = (str(tmp_path / n) for n in ("compiles.log", "p2-began", "ranked"))
    pd = {"kernel": "pd", "arch": "sm_90", "log": log}
    p1 = {**pd, "key": "p1", "payload": "p1", "config": {"T": 1024}, "until": p2_began}
    p2 = {**pd, "key": "p2", "payload": "p2", "config": {"T": 16}, "mark": p2_began}
    small = [{"key": f"s{i}", "payload": f"s{i}", "kernel": "s", "arch": "sm_90",
              "config": {"n": i}, "log": log} for i in range(4)]
    # the first s job lasts until the estimates, told that p1 still runs, rank p2 above them
    small[0]["until"] = ranked
    jobs = [p2, *small, p1]
    estimate.plan(jobs)
    assert [j["key"] for j in sorted(jobs, key=lambda j: -estimate(j))] == [
        "p1", "s0", "s1", "s2", "s3", "p2"]

    def running(job: dict, elapsed: float) -> bool:
        moved = estimate.running(job, elapsed)
        if estimate(p2) > estimate(small[0]):
            Path(ranked).touch()
        return moved

    with Farm(tmp_path / "c", "farm_fixture_fns:echo_compile", workers=2, max_batch=1,
              sys_paths=[str(FIXTURE)], local_only=True, estimate=estimate,
              learn=estimate.learn, running=running) as farm:
        result = farm.run(jobs)
    assert result.count("compiled") == 6
    events = [(sign, key) for sign, key, _ in read_log(log)]
    began = [key for sign, key in events if sign == "+"]
    # p1 and an s job went out first; p2 next, on the worker that s job left, while p1 ran
    assert {began[0], began[1]} == {"p1", "s0"} and began[2] == "p2", events
    assert events.index(("+", "p2")) < events.index(("-", "p1")), events


class _FlipAfterFirst:
    """An estimate that ranks "x*" jobs first until a job finishes, then "y*" jobs."""

    def __init__(self) -> None:
        self.learned = 0

    def __call__(self, job: dict) -> float:
        first = "y" if self.learned else "x"
        return 10.0 if job["key"].startswith(first) else 1.0

    def learn(self, job: dict, seconds: float) -> bool:
        self.learned += 1
        return self.learned == 1


def test_the_farm_re_ranks_jobs_not_yet_handed_out_when_estimates_change(tmp_path):
    est = _FlipAfterFirst()
    jobs = [{"key": k, "payload": k} for k in ("y1", "x1", "y2", "x2", "x3")]
    order: list[str] = []
    with Farm(tmp_path / "c", "farm_fixture_fns:echo_compile", workers=1, max_batch=1,
              sys_paths=[str(FIXTURE)], local_only=True, estimate=est, learn=est.learn) as farm:
        result = farm.run(jobs, on_record=lambda r: order.append(r.key))
    assert result.count("compiled") == 5 and est.learned == 5
    # x1 went out alone (a long job never queues behind another); after its result the y
    # jobs outrank the x jobs left
    assert order == ["x1", "y1", "y2", "x2", "x3"], order


def test_two_long_jobs_never_queue_on_one_worker_while_another_is_idle(tmp_path):
    cost = {"h1": 10.0, "h2": 9.0}
    # each long job lasts until the other has begun: at once on two workers, and until the
    # guard (then the check below fails) were one queued behind the other
    started = {k: str(tmp_path / f"{k}.started") for k in cost}
    jobs = [{"key": k, "payload": k, "mark": started["h1"], "until": started["h2"]}
            if k == "h1" else
            {"key": k, "payload": k, "mark": started["h2"], "until": started["h1"]}
            if k == "h2" else {"key": k, "payload": k}
            for k in ("h1", "h2", "s1", "s2", "s3", "s4")]
    with Farm(tmp_path / "c", "farm_fixture_fns:echo_compile", workers=2,
              sys_paths=[str(FIXTURE)], local_only=True,
              estimate=lambda j: cost.get(j["key"], 0.1)) as farm:
        result = farm.run(jobs)
    by_key = {r.key: r for r in result.records}
    assert result.count("compiled") == 6
    assert by_key["h1"].worker != by_key["h2"].worker  # each long job had a worker to itself


def test_each_unrecorded_kernels_largest_config_is_assumed_as_long_as_the_longest_job(tmp_path):
    estimate = _estimator_recording(tmp_path, 30.0)
    attn = [{"key": f"a{t}", "kernel": "attn", "arch": "sm_90", "config": {"BM": t}}
            for t in (32, 64, 128)]
    recorded = _job("r", {"T": 64})
    jobs = [*attn, recorded]
    plain = [estimate(j) for j in jobs]
    estimate.plan(jobs)
    # the recorded 30 s job is the longest; attention's largest config is assumed about as
    # long, short enough that the longest goes first
    assert estimate(attn[2]) == 30.0 * SCOUT_SHARE and [estimate(j) for j in attn[:2]] == plain[:2]
    assert estimate(recorded) == 30.0
    estimate.learn(attn[0], plain[0] * 3)  # attention's first result: guesses x3, no scout
    assert abs(estimate(attn[2]) - plain[2] * 3) < 1e-9


def test_nothing_queues_behind_a_long_job_while_another_worker_can_take_it(tmp_path):
    # the long job lasts until every small one is in (until the guard, were one behind it)
    small_done = tmp_path / "small-done"
    jobs = [{"key": "h", "payload": "h", "until": str(small_done)},
            *({"key": f"s{i}", "payload": f"s{i}"} for i in range(20))]
    done: list[str] = []

    def on_record(rec: JobRecord) -> None:
        done.append(rec.key)
        if len(done) == 20 and "h" not in done:
            small_done.touch()

    with Farm(tmp_path / "c", "farm_fixture_fns:echo_compile", workers=2, max_batch=2,
              sys_paths=[str(FIXTURE)], local_only=True,
              estimate=lambda j: 10.0 if j["key"] == "h" else 0.1
              ) as farm:
        result = farm.run(jobs, on_record=on_record)
    by_key = {r.key: r for r in result.records}
    assert result.count("compiled") == 21
    # the small jobs all went to the other worker, none waited behind the 4 s job
    assert all(by_key[f"s{i}"].worker != by_key["h"].worker for i in range(20))


def test_records_say_when_each_job_ran_after_the_first_worker_was_ready(tmp_path):
    log = tmp_path / "compiles.log"  # every compile's begin and end, in their real order
    jobs = [{"key": k, "payload": k, "sleep": 0.1, "log": str(log)} for k in ("j1", "j2", "j3")]
    with Farm(tmp_path / "c", "farm_fixture_fns:echo_compile", workers=1, max_batch=1,
              sys_paths=[str(FIXTURE)], local_only=True,
              estimate=lambda j: {"j1": 3, "j2": 2}.get(j["key"], 1)
              ) as farm:
        result = farm.run([*jobs, {"key": "j1", "payload": "dup"}])
        again = farm.run(jobs)  # all cached now: no worker ran them
    # one worker, one job at a time, in the order j1, j2, j3 (longest first)
    assert [(sign, key) for sign, key, _ in read_log(log)] == [
        ("+", "j1"), ("-", "j1"), ("+", "j2"), ("-", "j2"), ("+", "j3"), ("-", "j3")]
    assert [r.key for r in result.records] == ["j1", "j2", "j3"]
    started = [r.started for r in result.records]
    finished = [r.finished for r in result.records]
    # the records follow the runs: each starts after the first worker was ready and before it
    # finishes, both in the order the jobs ran, and the last finished within the run. (As the
    # driver saw them: a job's start is when it saw the worker free for it, which may be a
    # moment before the previous job's record was stored, so they are not checked disjoint.)
    assert all(s is not None and f is not None and 0 <= s <= f for s, f in zip(started, finished))
    assert started == sorted(started) and finished == sorted(finished), (started, finished)
    assert finished[-1] <= round(result.run_seconds, 3)
    assert all(r.status == "cached" and r.started is None for r in again.records)
