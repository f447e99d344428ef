"""A `Dim` bucket's winner over all its sizes, and its splits, on a CPU: the argument errors,
and the flow with cuTile's measurement replaced by fixed times (tests/tune/test_refine_gpu.py
measures for real): a winner good at every size is found where one exists; where none is, the
bucket is split, the bucket's record keeps the split points, the sub-bucket's record is written
from the times measured and `explain` serves a size inside a sub-bucket from it."""
from __future__ import annotations

import re

import cuda.tile as ct
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
    (COVERAGE, ("--refine", "-1"), "from 1 to 4, got '-1'"),
    (COVERAGE, ("--refine", "2", "--no-refine"), "--refine N and --no-refine contradict"),
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


@ct.kernel
def split_limit(X, TILE: ct.Constant[int]):
    ct.store(X, index=(ct.bid(0),), tile=ct.load(X, index=(ct.bid(0),), shape=(TILE,)))


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


def _tune(runtime_store, monkeypatch, seconds, **opts):
    """Tune dyn_add's bucket N<=4096 (sizes raced: 257, 512, 513, 1024, 1025, 2048, 2049 and 4096) with
    ``seconds(config, n)`` as its measurements: (entry, summary)."""
    from ctbuild.project import load_project
    from ctbuild.tune.session import TuneOptions, entries_for, tune_entries
    from ctbuild.tune.tuner import Device
    monkeypatch.syspath_prepend(str(COVERAGE))
    add = next(k for k in load_project(COVERAGE / "ctbuild.toml").kernels()
               if k.name == "dyn_add")
    entry = next(e for e in entries_for([add]) if add.buckets[e.workload].to_json() ==
                 {"N": 4096})
    _fake_measurement(monkeypatch, seconds)
    _prime(runtime_store, add, entry.workload)
    [s] = tune_entries([entry], runtime_store, TuneOptions(timeout_s=None, retune=True, **opts),
                       device=Device(0, "sm_90", GPU, "580.0"),
                       toolchain_fp=RUNTIME_TOOLCHAIN, stream=_Stream(), input_device="cpu")
    assert s["status"] == "tuned", (s.get("note"), s.get("traceback"))
    return entry, s


def test_a_bucket_no_config_serves_well_is_split_and_served(runtime_store, monkeypatch
                                                            ) -> None:
    """TILE=1024 is 10% faster from N=1500 up and 10% slower below: the bucket is split at
    N=1025 (the largest size raced below 1500); its sub-bucket's record serves N<=1025."""
    from ctbuild import runtime
    from ctbuild.commands.tune import span_lines
    from ctbuild.compile.coverage import refined_buckets, refined_lines
    from ctbuild.specs import Tensor
    from ctbuild.tune.report import _regret_text

    def seconds(cfg, n):
        fast = (cfg.TILE == 1024) == (n >= 1500)
        return 10.0 * (1 + 0.001 * cfg.occupancy) * (1.0 if fast else 1.1)

    entry, s = _tune(runtime_store, monkeypatch, seconds)
    add = entry.kernel
    assert s["winner"]["TILE"] == 1024
    [split] = s["record"]["refined"]["splits"]
    assert split["sizes"] == {"N": 1025} and 9.9 < split["regret_pct"] < 10.2
    lines = span_lines(s)
    assert len(lines) == 1 and re.search(r"sub-bucket N<=1025 has its own winner \(the "
                                         r"bucket's was 10\.\d% slower there\)$", lines[0])
    runtime.configure(store=runtime_store, mode="default")
    for n, sub in ((257, True), (300, True), (1025, True), (1026, False), (2000, False)):
        t = Tensor((n,), "float32")
        e = add.explain(t, t, t, arch="sm_90", gpu=GPU)
        assert e["config_from"] == "record", (n, e)
        assert e["config"]["TILE"] == (2048 if sub else 1024), (n, e)
        assert e["sub_bucket"] == ({"N": 1025} if sub else None), (n, e)
    assert "N≤1025" in _regret_text(s["record"])  # the --report page
    refined = refined_buckets(runtime_store.path, [add])
    assert refined_lines(refined) == [
        f"dyn_add          bucket N<=4096 split at N<=1025 ({GPU}, sm_90)"]
    # --no-refine: one winner for the whole bucket, and why it was not split.
    _, s = _tune(runtime_store, monkeypatch, seconds, refine=0)
    assert s["record"]["refined"]["splits"] == []
    assert s["record"]["regret"]["unsplit"] == "splitting is off (--no-refine)"
    assert re.search(r"not split further, worst loss 10\.\d% .*: splitting is off", span_lines(s)[0])


@pytest.mark.parametrize("bad", [-1, 5, True, 1.5, "2"])
def test_max_splits_out_of_range_is_refused_naming_the_kernel(bad) -> None:
    import ctbuild
    from ctbuild.declare import DeclarationError
    with pytest.raises(DeclarationError, match=r"split_limit.*max_splits must be a whole "
                                                 r"number from 0 to 4"):
        ctbuild.autotune(space={"TILE": [16]}, grid=lambda cfg, w: (1,), max_splits=bad,
                         name=f"split_limit_{bad!r}")(split_limit)


def test_a_kernels_own_max_splits_wins_over_refine_and_no_refine_over_both() -> None:
    from types import SimpleNamespace

    from ctbuild.tune.session import TuneOptions
    own = SimpleNamespace(max_splits=4)
    assert TuneOptions().settings(own).max_splits == 4
    assert TuneOptions(refine=1).settings(SimpleNamespace(max_splits=None)).max_splits == 1
    assert TuneOptions(refine=0).settings(own).max_splits == 0  # --no-refine


def test_a_key_that_cannot_tell_split_points_apart_leaves_the_bucket_unsplit(
        runtime_store, monkeypatch) -> None:
    """A pow2 tuning key gives N=257..300 one key: a split there would overwrite the bucket's
    own record, so the bucket stays whole and its record says why."""
    import ctbuild
    from ctbuild import Dim, Tensor
    from ctbuild.tune.tuner import Device, tune_workload
    pow2 = ctbuild.autotune(space={"TILE": [16, 32]}, grid=lambda cfg, w: (1,),
                            key=ctbuild.key(bucket={"X": {0: ctbuild.pow2}}),
                            workloads=[{"X": Tensor((Dim("N", 1, 300, buckets=[300]),),
                                                    "float32")}],
                            name="split_pow2")(split_limit)
    [w] = pow2.workloads

    def seconds(cfg, n):  # TILE=16 10% faster up to N=257 (raced), 10% slower at 300
        return 10.0 * (1.0 if (cfg.TILE == 16) == (n < 280) else 1.1)

    _fake_measurement(monkeypatch, seconds)
    _prime(runtime_store, pow2, w)
    rec = tune_workload(pow2, w, store=runtime_store, toolchain_fp=RUNTIME_TOOLCHAIN,
                        device=Device(0, "sm_90", GPU, "580.0"), stream=_Stream(),
                        input_device="cpu", timeout_s=None)
    assert rec.refined["splits"] == []
    assert "tuning key gives the split point" in rec.regret["unsplit"], rec.regret


def test_sizes_of_another_layout_class_get_their_own_winner(runtime_store, monkeypatch) -> None:
    """TILE=2048 is 10% faster where N is a multiple of 16 (another CUBIN: shape
    divisibility), TILE=1024 at the other sizes: no interval of sizes separates them, one
    winner per layout class does. The record keeps both, the bucket is not split, and the
    runtime serves each size with its class's winner."""
    from ctbuild import runtime
    from ctbuild.specs import Tensor

    def seconds(cfg, n):
        fast = (cfg.TILE == 2048) == (n % 16 == 0)
        return 10.0 * (1 + 0.001 * cfg.occupancy) * (1.0 if fast else 1.1)

    entry, s = _tune(runtime_store, monkeypatch, seconds)
    rec = s["record"]
    assert {k: v["config"]["TILE"] for k, v in rec["by_class"].items()} == \
        {"N:16": 2048, "N:n": 1024}, rec
    assert rec["config"]["TILE"] == 2048 and rec["refined"]["splits"] == []
    from ctbuild.commands.tune import span_lines
    [line] = span_lines(s)
    assert re.search(r'a winner per layout class: N:16 \{"TILE": 2048, .*N:n \{"TILE": 1024',
                     line), line
    assert rec["regret"]["worst_pct"] < 1 and {r["layout_class"] for r in
                                               rec["regret"]["sizes"]} == {"N:16", "N:n"}
    from ctbuild.dims import concretize
    odd = concretize(entry.kernel.buckets[entry.workload].declared, {"N": 513})
    _prime(runtime_store, entry.kernel, odd)  # the CUBINs of the sizes not divisible by 16
    runtime.configure(store=runtime_store, mode="default")
    for n in (513, 1000, 2049, 4000, 4096, 1024, 3008):
        t = Tensor((n,), "float32")
        e = entry.kernel.explain(t, t, t, arch="sm_90", gpu=GPU)
        assert e["config_from"] == "record" and \
            e["config"]["TILE"] == (2048 if n % 16 == 0 else 1024), (n, e)
        assert e.get("layout_class") == (None if n % 16 == 0 else "N:n"), (n, e)
    from ctbuild.tune.report import _regret_text
    page = _regret_text(rec)
    assert "A winner per layout class" in page and "N:n TILE=1024" in page, page
    assert "N:n [1]" in _regret_text({**rec, "by_class": {"N:n": [1]}})  # hostile: shown, no crash
    # --no-refine keeps one winner for the whole bucket
    _, s = _tune(runtime_store, monkeypatch, seconds, refine=0)
    assert s["record"]["by_class"] is None
    # a hostile by_class entry is skipped: the record's own config serves
    from ctbuild.bucket_map import class_winners
    assert class_winners({"N:n": {"config": [1]}, "N:16": "x", 3: {"config": {}}}, "k") == {}
    assert class_winners({str(i): {"config": {}} for i in range(33)}, "k") == {}


def test_a_class_with_a_wave_table_is_served_per_call_by_it(runtime_store, monkeypatch) -> None:
    """A record whose unaligned sizes have a table (`ctbuild.waves`): each such call is served
    the finalist the table predicts fastest from the finalists' grids at the call (dyn_add:
    a block per TILE elements; 1 block at a time, so its waves are its blocks); a multiple of
    16 the record's winner. `explain` names the class it chose for."""
    from ctbuild import runtime
    from ctbuild.dims import concretize
    from ctbuild.specs import Tensor
    entry, s = _tune(runtime_store, monkeypatch,
                     lambda cfg, n: 10.0 * (1 + 0.001 * cfg.occupancy) * (cfg.TILE / 1024))
    key, rec = next((k, r) for k, r in runtime_store.tuning_records()
                    if r.get("tuning_key") == s["record"]["tuning_key"])
    assert rec["config"] == {"TILE": 1024, "occupancy": 2}
    small, large = {"TILE": 1024, "occupancy": 1}, {"TILE": 2048, "occupancy": 1}
    rec["by_class"] = {"N:n": {"config": small, "waves": {"slots": 1, "finalists": [
        small, large], "refs": [{"sizes": {"N": 1025}, "us": [10.0, 10.0], "blocks": [2, 1]},
                                {"sizes": {"N": 3000}, "us": [30.0, 20.0], "blocks": [3, 2]}]}}}
    runtime_store.put_tuning(key, rec)
    _prime(runtime_store, entry.kernel,
           concretize(entry.kernel.buckets[entry.workload].declared, {"N": 513}))
    runtime.configure(store=runtime_store, mode="default")
    # N=1000: one block each; from the refs, TILE=1024 15 us, 2048 20 us. N=2100: three
    # blocks against two; 45 us against 40 us.
    for n, want in ((1000, small), (2100, large), (2096, rec["config"])):
        t = Tensor((n,), "float32")
        e = entry.kernel.explain(t, t, t, arch="sm_90", gpu=GPU)
        assert e["config"] == want and e["config_from"] == "record", (n, e)
        assert e.get("layout_class") == (None if n % 16 == 0 else "N:n"), (n, e)


def test_a_bucket_whose_lossy_sizes_a_table_serves_is_not_flagged_as_unsplit() -> None:
    """The split's groups lose 30% at some raced size, but a wave table serves that class and
    every raced size is served within 1%: the bucket line says nothing is left (the report
    judges the same `served_worst`); where calls still lose 30%, it says why."""
    from ctbuild.commands.tune import span_lines
    from ctbuild.tune.report import _regret_text
    for served, flagged in ((1.0, False), (30.0, True)):
        rec = {"choice": {"band": {"percent": 2.0}}, "regret": {
            "worst_pct": 30.0, "max_pct": served, "unsplit": "the split limit (3) is reached",
            "sizes": [{"sizes": {"N": 513}, "regret_pct": served, "fastest": {"TILE": 64}}]}}
        lines = span_lines({"kernel": "k", "status": "tuned", "record": rec})
        assert any("not split further" in x for x in lines) is flagged
        assert ("Not split further" in _regret_text(rec)) is flagged
