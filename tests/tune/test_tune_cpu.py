"""CPU tests of ``ctbuild tune``: report rendering, record structure, skip-when-tuned with a
real Store, in-place handling and the CLI's arguments. cuTile's measurement is replaced by a
fake ``exhaustive_search`` (the GPU tests in test_tune_gpu.py run the real one)."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import ROOT, run_cli

from ctbuild import cutile

FIXTURE = ROOT / "tests" / "fixtures" / "tune_project"

torch = pytest.importorskip("torch")


# ---- report ----------------------------------------------------------------------------------
def canned_result() -> dict:
    rec = {
        "kernel": "matmul", "arch": "sm_90", "gpu": "NVIDIA H100 80GB HBM3", "config":
        {"TM": 128, "TN": 256, "TK": 64, "num_ctas": 1}, "compile_key": "k1", "mean_us": 201.3,
        "ci_us": 1.1, "default": {"config": {"TM": 128, "TN": 128, "TK": 64, "num_ctas": 1},
                                  "mean_us": 240.2, "ci_us": 1.5},
        "workload": {"A": {"tensor": [4096, 4096], "dtype": "float16", "strides": [4096, 1],
                           "align": 256}},
        "tuning_key": [[[[4096, 4096], "float16", "C"]], []],
        "candidates": [
            {"config": {"TM": 128, "TN": 256, "TK": 64, "num_ctas": 1}, "mean_us": 201.3,
             "ci_us": 1.1, "samples": 10},
            {"config": {"TM": 128, "TN": 128, "TK": 64, "num_ctas": 1}, "mean_us": 240.2,
             "ci_us": 1.5, "samples": 10},
            {"config": {"TM": 64, "TN": 64, "TK": 32, "num_ctas": 1}, "mean_us": 410.0,
             "ci_us": 3.0, "samples": 5}],
        "failures": [{"config": {"TM": 256, "TN": 128, "TK": 64, "num_ctas": 1},
                      "error": "RuntimeError: <illegal address> & stuff"}],
        "space": {"total": 16, "pruned": 8, "kept": 4}, "seconds": 3.2,
        "compiles_during_measurement": 0}
    entry = {"kernel": "matmul", "workload": "A=Tensor((4096, 4096), float16)",
             "status": "tuned", "winner": rec["config"], "mean_us": 201.3, "ci_us": 1.1,
             "default_us": 240.2, "speedup_vs_default": 240.2 / 201.3,
             "failures": rec["failures"], "record": rec, "compiles_during_measurement": 0}
    failed = {"kernel": "rope_inplace", "workload": "Q=...", "status": "failed",
              "note": "tuning process died (exit -11)"}
    return {"gpu": "NVIDIA H100 80GB HBM3", "arch": "sm_90", "driver": "580.1",
            "toolchain": "abc", "cache": "/cache", "tuned": 1, "skipped": 0, "failed": 1,
            "seconds": 4.0, "compiles_during_measurement": 0, "entries": [entry, failed]}


def test_report_renders_chart_winner_default_and_failures(tmp_path):
    from ctbuild.tune.report import render_html, write_report
    page = render_html(canned_result())
    assert page.startswith("<!doctype html>") and "<script src" not in page
    # one kernel with a winner: its winners chart and, collapsed, its candidates' chart
    assert page.count("<svg") == 2 and "★ winner" in page and "(default)" in page
    assert page.count('<section class="card"') == 2 and page.count("<details") == 2
    assert "1.19×" in page                                     # 240.2 / 201.3 over the default
    assert "TM=128, TN=256, TK=64, num_ctas=1" in page
    assert "16.2% faster" in page                      # (240.2 - 201.3) / 240.2
    assert "&lt;illegal address&gt; &amp; stuff" in page  # escaped, never raw
    assert "tuning process died" in page and "1 failed" in page
    html_path, json_path = write_report(tmp_path / "r" / "tune.html", canned_result())
    assert html_path.read_text().startswith("<!doctype html>")
    assert json.loads(json_path.read_text())["entries"][0]["winner"]["TN"] == 256
    # the data is embedded too, and cannot close the script element early
    data = page.split('id="ctbuild-tune-data">', 1)[1].split("</script>", 1)[0]
    assert json.loads(data.replace("<\\/", "</"))["gpu"] == "NVIDIA H100 80GB HBM3"


def test_report_chart_with_no_measurement():
    from ctbuild.tune.report import chart
    assert "No candidate" in chart({"candidates": []})


# ---- tune_workload with a fake measurement ------------------------------------------------------
@pytest.fixture
def fixture_kernels(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURE))
    from ctbuild.project import load_project
    return {k.name: k for k in load_project(FIXTURE / "ctbuild.toml").kernels()}


class FakeStream:
    def synchronize(self):
        pass


def fake_search(times, launches, fail=()):
    """An exhaustive_search stand-in: calls kernel/args per config like cuTile, 'launches'."""
    from cuda.tile.tune._tune import Measurement, TuningResult

    def search(space, stream, grid_fn, kernel, args_fn, hints_fn=None, **kw):
        ok, errors = [], []
        for cfg in space:
            grid_fn(cfg)
            k = kernel(cfg).replace_hints(**({} if hints_fn is None else hints_fn(cfg)))
            if cfg.to_json() in fail:
                errors.append((cfg, RuntimeError, "CUDA_ERROR_ILLEGAL_ADDRESS"))
                continue
            for _ in range(3):
                launches(k, args_fn(cfg))
            ok.append(Measurement(config=cfg, mean_us=times(cfg), num_samples=3,
                                  error_margin_us=0.5))
        if not ok:
            raise ValueError("No valid config found in search space.")
        return TuningResult(best=min(ok, key=lambda m: m.mean_us), successes=ok,
                            failures=errors)
    return search


def fake_timer(times):
    """A `cutile.benchmark_sample` stand-in for the runoff: the config's time, no noise."""
    return lambda stream, grid, kernel, args, flush_l2=True: times(kernel.config)


def _prime(store, tuned, w, device, fp, skip=()):
    from ctbuild.arch import Arch
    from ctbuild.compile.plan import job_for
    for cfg in tuned.candidates(w, Arch(device.arch)).kept:
        if cfg.to_json() in skip:
            continue
        key = job_for(tuned, cfg, w, device.arch, fp).key
        store.put_compile(key, b"\x7fELF-fake-" + key.encode(), symbol="sym", meta={})


def test_record_structure_and_skip_when_tuned(tmp_path, monkeypatch, fixture_kernels):
    import cuda.tile as ct

    from ctbuild.cache import Store
    from ctbuild.tune import session as tune_session
    from ctbuild.tune import tuner as tuning
    twice = fixture_kernels["twice"]
    device = tuning.Device(0, "sm_90", "Fake GPU", "580.0")
    store, fp = Store(tmp_path / "cache"), "fp-test"
    w = twice.workloads[0]
    _prime(store, twice, w, device, fp, skip=[{"TILE": 512, "occupancy": 2}])
    calls = []
    monkeypatch.setattr(ct.tune, "exhaustive_search", fake_search(
        lambda cfg: 100.0 / cfg.TILE + cfg.occupancy, lambda k, a: calls.append(k.config)))
    monkeypatch.setattr(cutile, "benchmark_sample",
                        fake_timer(lambda cfg: 100.0 / cfg.TILE + cfg.occupancy))
    monkeypatch.setattr(ct, "launch", lambda stream, grid, k, args: calls.append(("final",
                                                                                   k.config)))
    rec = tuning.tune_workload(twice, w, store=store, toolchain_fp=fp, device=device,
                               stream=FakeStream(), input_device="cpu", timeout_s=None)
    rec = rec.to_json()
    for field in ("kernel", "kernel_fp", "arch", "gpu", "driver", "toolchain", "tuning_key",
                  "workload", "config", "compile_key", "mean_us", "ci_us", "default",
                  "candidates", "failures", "tuned_at", "choice", "runoff"):
        assert field in rec, field
    assert rec["config"] == {"TILE": 512, "occupancy": 1}, (rec["runoff"], rec["choice"])
    assert rec["default"]["config"] == {"TILE": 256, "occupancy": 1}
    assert rec["default"]["mean_us"] == pytest.approx(100 / 256 + 1)
    assert [c["mean_us"] for c in rec["candidates"]] == sorted(c["mean_us"]
                                                               for c in rec["candidates"])
    assert len(rec["candidates"]) == 5 and rec["failures"][0]["error"].startswith("missing")
    assert rec["compiles_during_measurement"] == 0
    assert calls[-1] == ("final", rec["config"])          # one clean launch of the winner
    assert store.has_compile(rec["compile_key"])
    json.dumps(rec)                                        # JSON-able
    rkey = tuning.record_key(twice, w, device, fp)
    assert store.get_tuning(rkey)["config"] == rec["config"]

    # skip-when-tuned, with the real store; --retune measures again
    entries = tune_session.entries_for([twice])
    opts = tune_session.TuneOptions(timeout_s=None)
    kw = dict(device=device, toolchain_fp=fp, stream=FakeStream(), input_device="cpu")
    out = tune_session.tune_entries(entries, store, opts, **kw)
    assert [s["status"] for s in out] == ["skipped"] and out[0]["winner"] == rec["config"]
    opts.retune = True
    out = tune_session.tune_entries(entries, store, opts, **kw)
    assert [s["status"] for s in out] == ["tuned"]
    # another GPU name or toolchain is another record
    other = tuning.Device(0, "sm_90", "Other GPU", "580.0")
    assert tuning.record_key(twice, w, other, fp) != rkey
    assert tuning.record_key(twice, w, device, "fp-other") != rkey


def test_failures_are_recorded_and_all_failed_writes_nothing(tmp_path, monkeypatch,
                                                             fixture_kernels):
    import cuda.tile as ct

    from ctbuild.cache import Store
    from ctbuild.tune import tuner as tuning
    faulty = fixture_kernels["faulty"]
    device = tuning.Device(0, "sm_90", "Fake GPU", "580.0")
    store, fp = Store(tmp_path / "cache"), "fp-test"
    w = faulty.workloads[0]
    _prime(store, faulty, w, device, fp)
    bad = [{"MODE": 2, "TILE": 256}, {"MODE": 3, "TILE": 256}]
    monkeypatch.setattr(ct.tune, "exhaustive_search", fake_search(
        lambda cfg: 5.0 + cfg.MODE, lambda k, a: None, fail=bad))
    monkeypatch.setattr(cutile, "benchmark_sample", fake_timer(lambda cfg: 5.0 + cfg.MODE))
    monkeypatch.setattr(ct, "launch", lambda *a: None)
    rec = tuning.tune_workload(faulty, w, store=store, toolchain_fp=fp, device=device,
                               stream=FakeStream(), input_device="cpu",
                               exclude={json.dumps({"MODE": 4, "TILE": 256}, sort_keys=True):
                                        "process: died"})
    assert rec.config == {"MODE": 0, "TILE": 256}
    failed = {json.dumps(f["config"], sort_keys=True): f["error"] for f in rec.failures}
    assert len(failed) == 3 and "ILLEGAL_ADDRESS" in failed[json.dumps(bad[0], sort_keys=True)]
    assert "process: died" in failed[json.dumps({"MODE": 4, "TILE": 256}, sort_keys=True)]

    monkeypatch.setattr(ct.tune, "exhaustive_search", fake_search(
        lambda cfg: 1.0, lambda k, a: None, fail=[c.to_json() for c in faulty.candidates(
            w, __import__("ctbuild").Arch("sm_90")).kept]))
    rec = tuning.tune_workload(faulty, w, store=Store(tmp_path / "c2"), toolchain_fp=fp,
                               device=device, stream=FakeStream(), input_device="cpu")
    assert rec.config is None and rec.compile_key is None
    assert len(rec.failures) == 5
    assert not list(Store(tmp_path / "c2").tuning_records())


def test_inplace_restore_leaves_one_clean_launch(tmp_path, monkeypatch, examples_on_path):
    """restore= arguments: every sample starts from the snapshot; afterwards the caller's
    tensors are as after one launch of the winner (the fake kernel adds 1 in place)."""
    import cuda.tile as ct
    from demo_kernels.rope import rope_inplace

    from ctbuild.cache import Store
    from ctbuild.tune import tuner as tuning
    from ctbuild.tune.inputs import make_inputs
    device = tuning.Device(0, "sm_90", "Fake GPU", "580.0")
    store, fp = Store(tmp_path / "cache"), "fp-test"
    spec = rope_inplace.workloads[0]
    _prime(store, rope_inplace, spec, device, fp)
    small = make_inputs(rope_inplace, spec, "cpu")
    q0 = small.Q.clone()
    seen = []

    def launch_inplace(k, args):
        seen.append(bool(torch.equal(args[0], q0)))   # each sample starts from the original
        args[0].add_(1)

    monkeypatch.setattr(ct.tune, "exhaustive_search", fake_search(
        lambda cfg: cfg.TOKENS * 1.0, launch_inplace))
    monkeypatch.setattr(cutile, "benchmark_sample", fake_timer(lambda cfg: cfg.TOKENS * 1.0))
    monkeypatch.setattr(ct, "launch", lambda stream, grid, k, args: args[0].add_(1))
    rec = tuning.tune_workload(rope_inplace, small, store=store, toolchain_fp=fp, device=device,
                               stream=FakeStream(), write=False)
    assert all(seen) and len(seen) == 27
    assert torch.equal(small.Q, q0 + 1)
    assert rec.source == "online" and rec.workload["Q"]["tensor"] == [4096, 32, 128]


def test_make_inputs_specs_and_hook(fixture_kernels):
    from ctbuild.serve.live_args import spec_of
    from ctbuild.specs import Tensor
    from ctbuild.tune.inputs import make_inputs
    twice = fixture_kernels["twice"]
    w = make_inputs(twice, twice.workloads[0], "cpu")
    assert torch.equal(w.X, torch.arange(1 << 18, dtype=torch.float32))   # the inputs hook
    assert w.OUT.shape == (1 << 18,) and w.OUT.dtype == torch.float32
    faulty = fixture_kernels["faulty"]
    strided = {"X": Tensor((64, 8), "float16", (16, 1)), "OUT": Tensor((64,), "bfloat16")}
    w = make_inputs(faulty, strided, "cpu")
    assert w.X.stride() == (16, 1) and w.X.dtype == torch.float16
    assert spec_of(w.OUT).dtype == "bfloat16" and spec_of(w.X).strides == (16, 1)


# ---- the CLI ------------------------------------------------------------------------------------
def test_cli_help_lists_options():
    r = run_cli("tune", "--help")
    assert r.returncode == 0
    for opt in ("--config", "--cache", "--json", "--report", "--retune", "--compile-missing",
                "--kernel", "--timeout"):
        assert opt in r.stdout


BAD_ARGUMENTS = [
    (("--timeout", "-1"), "must be > 0"),
    (("--timeout", "soon"), "not a number"),
    (("--kernel", "nope"), "unknown kernel"),
    (("--config", "/nonexistent/ctbuild.toml"), "does not exist"),
    (("--tie-band", "60"), "outside (0, 50)"),
    (("--gpus", "7"), "GPU 7, which is not there"),
]


@pytest.fixture(scope="module")
def bad_tune_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple, object]:
    """`ctbuild tune` with each of `BAD_ARGUMENTS` (each its own empty cache), two processes at
    a time: each is seconds of imports on one core, and the tests check one each."""
    def tune(args: tuple) -> object:
        return run_cli("tune", "--config", str(FIXTURE / "ctbuild.toml"), "--cache",
                       str(tmp_path_factory.mktemp("cache")), *args)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip((a for a, _ in BAD_ARGUMENTS), pool.map(tune, (a for a, _ in BAD_ARGUMENTS))))


@pytest.mark.parametrize("args,needle", BAD_ARGUMENTS)
def test_cli_bad_arguments_exit_2(args, needle, bad_tune_runs):
    r = bad_tune_runs[args]
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr


@pytest.mark.skipif(__import__("conftest").cuda_available(), reason="checks the no-GPU path")
def test_cli_without_gpu_says_so_and_its_quick_exit_runs_atexit_handlers(tmp_path):
    """`ctbuild tune` leaves without the interpreter's teardown (`cli.QUICK_EXIT`): its last
    line and the atexit handlers of what it imported (here a kernel module's) still run."""
    marker = tmp_path / "atexit-ran"
    (tmp_path / "probe.py").write_text(
        f"import atexit\natexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n")
    (tmp_path / "ctbuild.toml").write_text(
        f'modules = ["tune_kernels.twice", "probe"]\npaths = [".", {str(FIXTURE)!r}]\narchs = ["sm_90"]\n')
    r = run_cli("tune", "--config", str(tmp_path / "ctbuild.toml"),
                "--cache", str(tmp_path / "cache"))
    assert r.returncode == 1 and "needs a CUDA GPU" in r.stderr, r.stderr
    assert marker.read_text() == "ran"


def test_dim_bucket_winner_is_good_at_every_size(tmp_path, monkeypatch):
    """A Dim bucket's record: at the bucket's top alone the tie rule picks the default among
    ties; raced at the bucket's lower bound and midpoints too, the winner is a config within the
    band at every size (the default loses 10% below N=1500)."""
    import cuda.tile as ct

    from ctbuild.cache import Store
    from ctbuild.project import load_project
    from ctbuild.tune import tuner as tuning
    project_dir = ROOT / "tests" / "fixtures" / "coverage_project"
    monkeypatch.syspath_prepend(str(project_dir))
    add = next(k for k in load_project(project_dir / "ctbuild.toml").kernels()
               if k.name == "dyn_add")
    device = tuning.Device(0, "sm_90", "Fake GPU", "580.0")
    store, fp = Store(tmp_path / "cache"), "fp-test"
    w = next(r for r, b in add.buckets.items() if b.to_json() == {"N": 4096})
    _prime(store, add, w, device, fp)

    def seconds(cfg, n):  # at 4096 all within 1% (ties); below 1500 TILE=1024 is 10% slower
        return 10.0 * (1 + 0.001 * cfg.occupancy) * (1.1 if n < 1500 and cfg.TILE == 1024 else 1)

    monkeypatch.setattr(ct.tune, "exhaustive_search", fake_search(
        lambda cfg: seconds(cfg, 4096), lambda k, a: None))
    monkeypatch.setattr(cutile, "benchmark_sample", lambda stream, grid, kernel, args, f=True:
                        seconds(kernel.config, args[0].shape[0]))
    monkeypatch.setattr(ct, "launch", lambda *a: None)
    kw = dict(store=store, toolchain_fp=fp, device=device, stream=FakeStream(),
              input_device="cpu")
    # At the bucket's top alone, the tie rule picks the default among ties.
    rec = tuning.tune_workload(add, w, settings=tuning.TuneSettings(span=False), **kw)
    assert rec.config == {"TILE": 1024, "occupancy": 2}                 # the declared default
    assert rec.choice["rule"] == "default config among ties" and len(rec.choice["ties"]) == 4
    assert rec.runoff["rounds"] == 5 and rec.runoff["stopped"] == "decided"
    assert rec.regret is None
    # Over the bucket's sizes, the default loses 10% below 1500: a config good everywhere wins.
    rec = tuning.tune_workload(add, w, **kw)
    assert rec.config["TILE"] == 2048 and rec.choice["rule"] == \
        "smallest worst loss over the bucket's sizes"
    assert rec.regret["bucket"] == {"N": 4096}
    by_size = {s["sizes"]["N"]: s for s in rec.regret["sizes"]}
    assert sorted(by_size) == [257, 512, 513, 1024, 1025, 2048, 2049, 2896, 4095, 4096]
    assert all(s["regret_pct"] <= 0.2 for s in by_size.values())
    assert by_size[257]["fastest"]["TILE"] == 2048 and rec.regret["unsplit"] is None
    assert rec.refined["splits"] == []
    assert {"screen", "runoff", "span"} <= set(rec.phase_seconds)


def test_fleet_order_longest_first_and_slow_gpu():
    from ctbuild.space import Config
    from ctbuild.tune.choice import Timing
    from ctbuild.tune.fleet import GpuListError, longest_first, parse_gpus, slow_gpus
    assert parse_gpus("all", 3) == [0, 1, 2] and parse_gpus("1,1", 2) == [1, 1]
    for bad in ("0,x", ",", "all"):
        with pytest.raises(GpuListError, match="--gpus"):
            parse_gpus(bad, 0 if bad == "all" else 2)
    order = longest_first(list("abcdef"), {"a": 9, "b": 1, "c": 5, "d": 4, "e": 3, "f": 1}.get)
    assert order == ["a", "c", "d", "e", "b", "f"]                 # ties keep their order
    t = {"x": 10.0, "y": 20.0}

    def lane(scale):
        return {k: Timing(Config({"k": k}, "k"), v * scale, 0.1, 5) for k, v in t.items()}
    assert slow_gpus([0, 1, 2], [[lane(1.0), lane(1.01), lane(1.08)]]) == [
        {"lane": 2, "gpu": 2, "ratio": pytest.approx(1.08 / 1.01, abs=1e-4)}]


@pytest.mark.skipif(__import__("conftest").cuda_available(),
                    reason="needs measuring processes that die: no GPU visible")
def test_fleet_moves_the_keys_of_a_dead_measuring_process(tmp_path):
    """Two lanes; every measuring process dies (here: no GPU) with no candidate to blame: each
    key is reported, moved to the other lane, and reported again with the move noted."""
    from ctbuild.cache import Store
    from ctbuild.project import load_project
    from ctbuild.tune.fleet import FleetRun, tune_fleet
    from ctbuild.tune.session import TuneOptions, entries_for
    from ctbuild.tune.tuner import Device
    entries = entries_for(load_project(FIXTURE / "ctbuild.toml").kernels())
    run = FleetRun(str(FIXTURE / "ctbuild.toml"), str(tmp_path), TuneOptions(timeout_s=None),
                   [0, 1])
    seen: list[dict] = []
    out, report = tune_fleet(run, entries, Store(tmp_path), Device(0, "sm_90", "Fake", "580"),
                             "fp", emit=seen.append)
    assert [s["status"] for s in out] == ["failed"] * len(entries) == ["failed", "failed"]
    assert sorted(report["moved"]) == [e.index for e in entries]
    assert all(s["note"].startswith("tuning process died") and "moved to another GPU" in
               s["note"] for s in out), out
    assert len(seen) == 4 and report["slow_gpus"] == []
    # each lane's share of the measuring is reported (nothing measured: its processes died);
    # a key is blamed on the one lane that claimed it
    lanes = report["lanes"]
    assert [(lane["gpu"], lane["measure_s"]) for lane in lanes] == [(0, 0.0), (1, 0.0)]
    assert sum(lane["entries"] for lane in lanes) == 2
    assert isinstance(report["screen_wall_s"], float)  # reported; its value is a timing


def test_a_lane_summary_adds_its_records_measuring_seconds():
    from ctbuild.tune.fleet import lane_summary
    lane = [{"record": {"measure_seconds": 10.25, "phase_seconds": {"screen": 1.25}}},
            {"record": {"measure_seconds": 0.5}}, {"record": {"measure_seconds": None}},
            {"record": None, "status": "failed"}, {"status": "skipped"}]
    assert lane_summary(3, lane) == {"gpu": 3, "entries": 5, "measure_s": 10.75}


def test_fleet_finals_only_for_keys_whose_race_ran_out_of_budget():
    from ctbuild.records import TuningRecord
    from ctbuild.tune.fleet import undecided
    def rec(stopped, rule="fastest, no tie", splits=()):
        return TuningRecord(kernel="k", runoff={"stopped": stopped}, choice={"rule": rule},
                            refined={"splits": list(splits)})
    assert undecided(rec("budget: seconds")) and undecided(rec("budget: rounds"))
    assert not undecided(rec("decided")) and not undecided(rec("one candidate left"))
    assert not undecided(rec("budget: seconds", "smallest worst loss over the bucket's sizes"))
    assert not undecided(rec("budget: seconds", splits=[{"sizes": {"N": 8}}]))
    assert not undecided(TuningRecord(kernel="k"))  # no race: one finalist
