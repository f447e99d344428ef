"""How a build's failures read: one line per cause (`ctbuild.compile.failures`)."""
from __future__ import annotations

from ctbuild.compile.failures import cause_line, failure_causes


def test_a_configs_exact_and_relaxed_jobs_are_shown_once() -> None:
    """Both classes of one config fail alike and read alike: the line names the config once and
    counts the jobs (it read 'sm_90 float16 {TT=12}, sm_90 float16 {TT=12}, +1 more')."""
    job = {"kernel": "k", "arch": "sm_90", "error_type": "TypeCheckingError",
           "error": "k.py:6:8: not a power of two",
           "workload": {"X": {"dtype": "float16"}}}
    failures = [{**job, "config": {"TT": 12}}, {**job, "config": {"TT": 12}},
                {**job, "config": {"TT": 24}}]
    [cause] = failure_causes(failures, {})
    assert cause_line(cause) == ("k, 3 jobs (sm_90 float16 {TT=12}, sm_90 float16 {TT=24}, +1 more): "
                                 "TypeCheckingError: k.py:6:8: not a power of two")
