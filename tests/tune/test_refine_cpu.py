"""``ctbuild tune --refine`` on a CPU: its argument errors, and the refine flow with cuTile's
measurement replaced by fixed times (tests/tune/test_refine_gpu.py measures for real): a bucket
whose winner is slow at its small sizes is split there, the sub-buckets are tuned (or what they
lack is named), the bucket's record keeps the split points and `explain` serves a size inside a
sub-bucket from the sub-bucket's record."""
from __future__ import annotations

import re

import pytest
from conftest import ROOT, RUNTIME_TOOLCHAIN

from ctbuild import cutile
from ctbuild.cli import main

torch = pytest.importorskip("torch")

COVERAGE = ROOT / "tests" / "fixtures" / "coverage_project"
TUNE_FIXTURE = ROOT / "tests" / "fixtures" / "tune_project"
GPU = "Fake GPU"


@pytest.mark.parametrize("project,args,needle", [
    (TUNE_FIXTURE, ("--refine",), "no selected kernel (faulty, twice) declares a Dim workload"),
    (COVERAGE, ("--refine", "--verify"), "--refine tunes and writes records, --verify"),
    (COVERAGE, ("--refine", "0"), "from 1 to 4, got '0'"),
    (COVERAGE, ("--refine", "many"), "from 1 to 4, got 'many'"),
])
def test_refine_argument_errors_exit_2(project, args, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(project))
    try:
        code = main(["tune", "--config", str(project / "ctbuild.toml"), "--cache",
                     str(tmp_path), *args])
    except SystemExit as exc:  # argparse's own errors (usage, then one line)
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and needle in err, err
    assert "Traceback" not in err and not (tmp_path / "tuning").exists()


def _fake_measurement(monkeypatch, seconds):
    """Screening (``exhaustive_search``) and the runoff (``benchmark_sample``) report
    ``seconds(config, size)`` instead of timing launches."""
    import cuda.tile as ct
    from cuda.tile.tune._tune import Measurement, TuningResult

    def search(space, stream, grid_fn, kernel, args_fn, hints_fn=None, **kw):
        ok = [Measurement(config=c, mean_us=seconds(c, args_fn(c)[0].shape[0]), num_samples=3,
                          error_margin_us=0.01) for c in space]
        return TuningResult(best=min(ok, key=lambda m: m.mean_us), successes=ok, failures=[])

    monkeypatch.setattr(ct.tune, "exhaustive_search", search)
    monkeypatch.setattr(cutile, "benchmark_sample", lambda stream, grid, kernel, args, f=True:
                        seconds(kernel.config, args[0].shape[0]))
    monkeypatch.setattr(ct, "launch", lambda *a: None)


def _prime(store, kernel, w) -> None:
    """Fake CUBINs for every candidate of ``kernel`` at ``w`` (measuring is faked)."""
    from ctbuild.arch import Arch
    from ctbuild.compile.plan import job_for
    for cfg in kernel.candidates(w, Arch("sm_90")).kept:
        key = job_for(kernel, cfg, w, "sm_90", RUNTIME_TOOLCHAIN).key
        store.put_compile(key, b"\x7fELF-fake-" + key.encode(), symbol="sym", meta={})


class _Stream:
    def synchronize(self) -> None:
        pass


def test_refine_splits_tunes_and_serves_sub_buckets(runtime_store, monkeypatch) -> None:
    from ctbuild import runtime
    from ctbuild.commands.tune import refine_lines
    from ctbuild.compile.coverage import refined_buckets, refined_lines
    from ctbuild.dims import Bucket
    from ctbuild.project import load_project
    from ctbuild.specs import Tensor
    from ctbuild.tune.report import _regret_text
    from ctbuild.tune.session import TuneOptions, entries_for, tune_entries
    from ctbuild.tune.tuner import Device
    monkeypatch.syspath_prepend(str(COVERAGE))
    add = next(k for k in load_project(COVERAGE / "ctbuild.toml").kernels()
               if k.name == "dyn_add")
    entry = next(e for e in entries_for([add]) if add.buckets[e.workload].to_json() ==
                 {"N": 4096})

    def seconds(cfg, n):  # the default (TILE=1024) is 10% slower below 1500 only
        return 10.0 * (1 + 0.001 * cfg.occupancy) * (1.1 if n < 1500 and cfg.TILE == 1024 else 1)

    _fake_measurement(monkeypatch, seconds)
    _prime(runtime_store, add, entry.workload)
    device = Device(0, "sm_90", GPU, "580.0")
    kw = dict(device=device, toolchain_fp=RUNTIME_TOOLCHAIN, stream=_Stream(),
              input_device="cpu")
    opts = TuneOptions(timeout_s=None, refine=1)
    # The regret is 10% at N=257 and N=647 (1628: 0.1%, within the band). One split allowed:
    # the worst is kept, the other named; its sub-bucket has no CUBIN yet: named, not recorded.
    [s] = tune_entries([entry], runtime_store, opts, **kw)
    assert s["status"] == "tuned" and s["winner"]["TILE"] == 1024
    refined = s["refined"]
    [split] = refined["splits"]
    assert split["status"] == "failed" and "pass --compile-missing" in split["note"]
    assert [p["sizes"] for p in refined["left_out"]] == [
        {"N": 647 if split["sizes"] == {"N": 257} else 257}]
    assert s["record"]["refined"]["splits"] == []
    # With the CUBINs there, --refine 2 (no --retune) refines from the recorded regret.
    bucket = add.buckets[entry.workload]
    for n in (257, 647):
        _prime(runtime_store, add, Bucket(bucket.declared, (("N", n),)).representative)
    opts.refine = 2
    [s] = tune_entries([entry], runtime_store, opts, **kw)
    assert s["status"] == "skipped"
    splits = s["refined"]["splits"]
    assert [(p["sizes"], p["status"]) for p in splits] == [({"N": 257}, "tuned"),
                                                           ({"N": 647}, "tuned")]
    assert all(p["winner"]["TILE"] != 1024 for p in splits)
    assert [p["sizes"] for p in s["record"]["refined"]["splits"]] == [{"N": 257}, {"N": 647}]
    lines = refine_lines(s)
    assert len(lines) == 2 and lines[0].startswith("refine   dyn_add        sub-bucket N<=257: "
                                                   "tuned, winner {")
    assert re.search(r"N<=647: tuned, .* the bucket's winner was 10\.\d% slower there$", lines[1])
    # The runtime serves sizes inside each sub-bucket from the sub-bucket's record.
    runtime.configure(store=runtime_store, mode="default")
    for n, i in ((257, 0), (300, 1), (647, 1), (2000, None)):
        t = Tensor((n,), "float32")
        e = add.explain(t, t, t, arch="sm_90", gpu=GPU)
        want = s["record_key"] if i is None else splits[i]["record_key"]
        assert (e["record_key"], e["config_from"]) == (want, "record"), n
        assert e["config"] == (s["winner"] if i is None else splits[i]["winner"]), n
        assert e["sub_bucket"] == (None if i is None else splits[i]["sizes"]), n
    assert "Split by <code>--refine</code> into sub-buckets up to N≤257; N≤647" in \
        _regret_text(s["record"])  # the --report page
    # A retune without --refine keeps the split points (the sub-buckets keep their records).
    [s] = tune_entries([entry], runtime_store, TuneOptions(timeout_s=None, retune=True), **kw)
    assert s["status"] == "tuned" and [p["sizes"] for p in s["record"]["refined"]["splits"]] == \
        [{"N": 257}, {"N": 647}]
    # ctbuild plan lists the refined bucket (its current kernel version only).
    refined = refined_buckets(runtime_store.path, [add])
    assert [(r["bucket"], [p["sizes"] for p in r["splits"]], r["gpu"])
            for r in refined["dyn_add"]] == [({"N": 4096}, [{"N": 257}, {"N": 647}], GPU)]
    assert refined_lines(refined) == [
        f"dyn_add          bucket N<=4096 split at N<=257; N<=647 ({GPU}, sm_90)"]
