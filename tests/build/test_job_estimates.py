"""A first build's compile estimates: a kernel without records is guessed from its TileIR's size
(what the body check's real front end gave) and its tile volume, so a kernel with small tiles
but much code (a paged decode's loop over gathered pages) is started before one with wide
tiles and little code, where the tile volume alone ranks them the other way; what a build
learns rescales those guesses; records a cache cannot vouch for are skipped. Real cuTile
front end and tileiras (tests/fixtures/estimate_project)."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from ctbuild.arch import Arch
from ctbuild.cache import Store
from ctbuild.cli import main
from ctbuild.compile.body_check import check_bodies
from ctbuild.compile.compiler import compile_job
from ctbuild.compile.job_estimates import (
    IR_BASE,
    SCOUT_SHARE,
    JobEstimator,
    estimator,
    guess,
)
from ctbuild.compile.plan import make_plan
from ctbuild.toolchain import probe

PROJECT = ROOT / "tests" / "fixtures" / "estimate_project"
sys.path.insert(0, str(PROJECT))
from estimate_kernels import paged_sum, wide_add  # noqa: E402


@pytest.fixture(scope="module")
def planned() -> tuple[list[dict], dict[tuple[str, str], int]]:
    """The fixture's jobs on sm_90 (as the farm gets them) and the body check's TileIR sizes."""
    plan = make_plan([paged_sum, wide_add], [Arch("sm_90")], probe().fingerprint)
    sizes: dict[tuple[str, str], int] = {}
    assert check_bodies(plan, None, sizes) == []
    return [job.to_json() for job in plan.jobs.values()], sizes


def test_the_kernel_with_more_tileir_ranks_first_where_tile_volume_says_otherwise(planned):
    jobs, sizes = planned
    assert sizes[("paged_sum", "sm_90")] > 2 * sizes[("wide_add", "sm_90")] > 0
    estimate = JobEstimator({}, sizes)
    ranked = sorted(jobs, key=lambda j: -estimate(j))
    kernels = [j["kernel"] for j in ranked]
    n_paged = kernels.count("paged_sum")
    assert n_paged and kernels[:n_paged] == ["paged_sum"] * n_paged, kernels
    by_volume = sorted(jobs, key=lambda j: -guess(j))  # no TileIR size: the old order
    assert by_volume[0]["kernel"] == "wide_add"
    # each guess is the model's: TileIR KiB x (base + a term growing with the tile volume)
    for job in jobs:
        size = sizes[(job["kernel"], job["arch"])]
        assert estimate(job) == guess(job, size) and size / 1024 * IR_BASE <= estimate(job)
    # a build's scouts (each kernel's largest config) rank just below the job guessed longest
    estimate.plan(jobs)
    ranked = sorted(jobs, key=lambda j: -estimate(j))
    wide = [j for j in ranked if j["kernel"] == "wide_add"]
    assert ranked[0]["kernel"] == "paged_sum"
    assert estimate(wide[0]) == SCOUT_SHARE * estimate(ranked[0]) > estimate(wide[1])


def test_plan_estimates_from_tileir_and_says_so(capsys):
    code = main(["plan", "--config", str(PROJECT / "ctbuild.toml"), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    costs = {k["name"]: k["estimate"] for k in json.loads(out)["kernels"]}
    paged, wide = costs["paged_sum"], costs["wide_add"]
    assert paged["tileir_bytes"] > wide["tileir_bytes"] > 0
    assert paged["compile_seconds"] / paged["jobs"] > wide["compile_seconds"] / wide["jobs"]
    assert main(["plan", "--config", str(PROJECT / "ctbuild.toml")]) == 0
    assert "TileIR size, tile sizes" in capsys.readouterr().out


def test_a_compiled_job_rescales_its_kernels_tileir_guesses(planned):
    jobs, sizes = planned
    estimate = JobEstimator({}, sizes)
    first, second = [j for j in jobs if j["kernel"] == "paged_sum"][:2]
    other = next(j for j in jobs if j["kernel"] == "wide_add")
    before = {j["key"]: estimate(j) for j in (second, other)}
    seconds = compile_job(first)["seconds"]  # real front end and tileiras
    estimate.learn(first, seconds)
    ratio = seconds / guess(first, sizes[("paged_sum", "sm_90")])
    assert math.isclose(estimate(second), before[second["key"]] * ratio)
    assert estimate(other) == before[other["key"]]  # another kernel: unchanged


@pytest.mark.parametrize("seconds", ["NaN", "Infinity", "-1", "0", "true", '"3"', "null"])
def test_records_that_are_no_compile_time_are_skipped(tmp_path: Path, planned, seconds) -> None:
    """Entries another writer of a shared cache could leave (Python's json reads NaN): the
    estimate skips them and guesses, and an unreadable time of writing does not matter."""
    jobs, sizes = planned
    job = jobs[0]
    other = {**job, "kernel": "wide_add", "config": {"ROWS": 16}}
    with Store(tmp_path / "c", readonly=False) as store:
        store.put_compile("bad", b"x", symbol="s", meta={})  # a real blob, then its entry:
        store._ns.compile.set("bad", json.dumps(
            {"kernel": job["kernel"], "arch": "sm_90", "config": job["config"],
             "digest": store.get_compile("bad").meta["digest"], "symbol": "s", "size": 1,
             "created": 1.0})[:-1] + f', "compile_seconds": {seconds}}}')
        store._ns.compile.set("odd-time", json.dumps(
            {**store.get_compile("bad").meta, "kernel": "wide_add", "config": {"ROWS": 16},
             "compile_seconds": 2.0, "created": "yesterday"}))
        assert {k for k, _ in store.compile_entries()} == {"bad", "odd-time"}
        estimate = estimator(store, sizes)
    assert estimate(job) == guess(job, sizes[(job["kernel"], job["arch"])])
    assert estimate(other) == 2.0
