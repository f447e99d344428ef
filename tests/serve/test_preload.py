"""`runtime.preload` and the cold-start ledger on a CPU: a real cache on disk, the device
stubbed as an H100, and ``ct.launch`` stubbed to ask the served kernel for its CUBIN as cuTile's
dispatcher would (once per kernel object and signature: its in-memory launch cache)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from conftest import RUNTIME_TOOLCHAIN, python_json, run_cli  # noqa: E402
from gpu_runtime_examples import host_tensors, load_examples  # noqa: E402

from ctbuild import runtime  # noqa: E402
from ctbuild.cache import Store  # noqa: E402
from ctbuild.serve import preload as preload_mod  # noqa: E402
from ctbuild.serve.cache_reader import CacheReader  # noqa: E402
from ctbuild.serve.ledger import LEDGER, Ledger, format_ledger  # noqa: E402
from ctbuild.serve.standins import StandIns  # noqa: E402

KERNELS = load_examples()
GPU = "NVIDIA H100 80GB HBM3"
CUBIN = b"\x7fELF" + bytes(range(256)) * 64


class HostStandIns(StandIns):
    """Stand-ins on the host: this test has no CUDA device (test_runtime_gpu.py makes real
    ones)."""

    def __init__(self, device: int) -> None:
        self.torch, self.device = torch, device

    def tensor(self, spec: Any) -> Any:
        return torch.empty_strided(spec.shape, spec.strides, dtype=getattr(torch, spec.dtype))


@pytest.fixture
def served(runtime_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
           ) -> tuple[Any, list]:
    """(the runtime context over a cache with records and CUBINs of rmsnorm and silu_mul on
    this "H100", the list of CUBINs the stubbed launches were served)."""
    import ctbuild.serve.kernel_runtime as rtmod
    from ctbuild.arch import Arch
    from ctbuild.keys import record_key_for
    from ctbuild.serve.live_args import workload_spec
    from ctbuild.serve.resolve import Resolver
    from ctbuild.serve.served_kernel import CubinSource
    from ctbuild.signature import derive_signature, signature_text
    from ctbuild.specs import spec_to_json
    store = runtime_store  # in tmp_path / "cache"
    source = CubinSource(store, RUNTIME_TOOLCHAIN)
    for name in ("rmsnorm", "silu_mul"):
        tuned = KERNELS[name]
        w = workload_spec(tuned, tuned.bind(*host_tensors(tuned.workloads[0])))
        cfg = tuned.default_config(w)
        sig = derive_signature(tuned.kernel, tuned.kernel_args(cfg, w))
        ckey = source.key_for(tuned, cfg, sig, "sm_90")
        store.put_compile(ckey, CUBIN + name.encode(), symbol=sig.symbol,
                          meta={"kernel": name, "compile_seconds": 2.5})
        store.put_tuning(record_key_for(tuned, tuned.tuning_key(w), "sm_90", GPU,
                                        RUNTIME_TOOLCHAIN),
                         {"kernel": name, "arch": "sm_90", "gpu": GPU, "compile_key": ckey,
                          "config": cfg.to_json(), "seconds": 30.0, "format": 1,
                          "toolchain": RUNTIME_TOOLCHAIN,
                          "workload": {n: spec_to_json(v) for n, v in w.items()}})
    store.close()
    served: list = []
    loaded: dict[tuple[int, str], bytes] = {}  # the dispatcher's in-memory launch cache

    def launch(stream: Any, grid: tuple, kernel: Any, kargs: tuple) -> None:
        t = kernel.tuned
        spec = workload_spec(t, t.bind(*kargs[:len(t.params)]))
        sig = derive_signature(t.kernel, t.kernel_args(kernel.config, spec))
        key = (id(kernel), signature_text(sig))
        if key not in loaded:
            loaded[key] = kernel.serve(sig, None, Arch("sm_90"))[0]
        served.append((grid, loaded[key]))

    monkeypatch.setattr(rtmod.ct, "launch", launch)
    monkeypatch.setattr(Resolver, "_device_for", lambda self, w: 0)
    monkeypatch.setattr(rtmod, "current_stream_getter", lambda: (lambda d: 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(preload_mod, "StandIns", HostStandIns)
    ctx = runtime.configure(cache_dir=tmp_path / "cache", mode="strict")
    monkeypatch.setattr(ctx, "device_info", lambda d: ("sm_90", GPU))
    return ctx, served


def test_a_preloaded_first_call_reads_nothing_from_disk_and_resolves_nothing(
        served, monkeypatch) -> None:
    """The preload serves each record's CUBIN to a launch of no block (cuTile loads its
    module then); the first call finds the entry the preload made and launches it."""
    ctx, launched = served
    assert isinstance(ctx.store, CacheReader)
    report = runtime.preload(background=False).wait()
    assert {k: report[k] for k in ("records", "cubins", "resolved", "modules", "left",
                                   "missing")} == \
        {"records": 2, "cubins": 2, "resolved": 2, "modules": 2, "left": 0, "missing": 0}
    assert report["bytes"] == 2 * len(CUBIN) + len("rmsnormsilu_mul")
    assert sorted(launched) == [((0, 1, 1), CUBIN + b"rmsnorm"), ((0, 1, 1), CUBIN + b"silu_mul")]
    assert ctx.store.held_cubins == {}  # each dropped once served
    reads: list[str] = []
    original = ctx.store._rows
    monkeypatch.setattr(ctx.store, "_rows", lambda ns, *a: (reads.append(ns), original(ns, *a))[1])
    tuned = KERNELS["rmsnorm"]
    entries = list(tuned.runtime._entries)
    tuned(*host_tensors(tuned.workloads[0]))
    assert reads == [] and tuned.runtime._entries == entries and len(entries) == 1
    assert launched[-1] == (entries[0].grid, CUBIN + b"rmsnorm") and entries[0].grid != (0, 1, 1)
    assert tuned.runtime.provenance()["launches"] == 1


def test_preload_on_a_thread_of_named_kernels_and_bounded(served, monkeypatch) -> None:
    job = runtime.preload([KERNELS["silu_mul"]])
    report = job.wait(60)
    assert job.done.is_set() and report["records"] == 1 and report["gpu"] == GPU
    monkeypatch.setattr(preload_mod, "MAX_RECORDS", 1)
    served[0].store.held_tuning.clear()
    report = runtime.preload(background=False).report
    assert report["records"] == 1 and report["left"] == 1


def test_a_kernel_whose_module_is_still_importing_is_prepared_once_it_is(
        served, monkeypatch) -> None:
    """A fingerprint taken while the kernel's module still runs could miss what is defined
    below the kernel: the preload leaves such a kernel for later (``undeclared``), and one
    that waits prepares it as soon as the import is over."""
    import sys
    spec = sys.modules[KERNELS["rmsnorm"].module].__spec__
    monkeypatch.setattr(spec, "_initializing", True, raising=False)
    ctx = served[0]
    report = runtime.preload(background=False).wait()
    assert report["resolved"] == 1 and report["undeclared"] == 1
    assert KERNELS["rmsnorm"].runtime._entries == []
    assert list(ctx.store.held_cubins.values())[0].cubin == CUBIN + b"rmsnorm"  # kept for later
    # one that waited for it in vain lets its CUBIN go (read at its first call, if any)
    report = runtime.preload(background=False, wait_for_kernels=0.1).wait()
    assert report["undeclared"] == 1
    assert CUBIN + b"rmsnorm" not in [c.cubin for c in ctx.store.held_cubins.values()]
    job = runtime.preload(wait_for_kernels=60)
    assert not job.done.wait(0.3)  # still waiting for rmsnorm's module
    spec._initializing = False
    report = job.wait(60)
    assert job.done.is_set() and report["resolved"] == 1 and report["undeclared"] == 0
    assert len(KERNELS["rmsnorm"].runtime._entries) == 1


def test_the_ledger_counts_a_first_call_and_what_the_cache_saved(served, monkeypatch,
                                                                  tmp_path: Path) -> None:
    monkeypatch.setattr(LEDGER, "phases_ms", {})
    monkeypatch.setattr(LEDGER, "avoided", {"tuning_s": 0.0, "compile_s": 0.0, "records": 0,
                                            "cubins": 0})
    monkeypatch.setenv("CTBUILD_LEDGER", str(tmp_path / "ledger.json"))
    runtime.configure(cache_dir=served[0].cache_dir, mode="strict")
    monkeypatch.setattr(runtime.context(), "device_info", lambda d: ("sm_90", GPU))
    tuned = KERNELS["silu_mul"]
    tuned(*host_tensors(tuned.workloads[0]))
    got = json.loads((tmp_path / "ledger.json").read_text())
    assert {"cache_open", "first_resolve", "cubin_load", "first_launch"} <= set(got["phases_ms"])
    assert got["avoided"] == {"tuning_s": 30.0, "compile_s": 2.5, "records": 1, "cubins": 1}
    out = run_cli("doctor", "--ledger", str(tmp_path / "ledger.json"))
    assert out.returncode == 0 and "first_launch" in out.stdout and "30.0 s of tuning" in out.stdout
    bad = run_cli("doctor", "--ledger", str(tmp_path / "none.json"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "CTBUILD_LEDGER" in bad.stderr


def test_a_preloaded_process_writes_its_ledger_when_the_preload_is_done(
        served, monkeypatch, tmp_path: Path) -> None:
    """A preloaded call has no first launch of its own (the slow path ran on the preload's
    thread): the ledger is written as the preload ends, with its seconds."""
    monkeypatch.setattr(LEDGER, "phases_ms", {})
    monkeypatch.setenv("CTBUILD_LEDGER", str(tmp_path / "ledger.json"))
    report = runtime.preload(background=False).wait()
    got = json.loads((tmp_path / "ledger.json").read_text())
    # the report's seconds (rounded to 0.1 ms) and the ledger's phase are one measurement
    assert got["phases_ms"]["preload"] == pytest.approx(report["seconds"] * 1e3, abs=0.1)
    assert {"first_resolve", "cubin_load"} <= set(got["phases_ms"])
    assert "first_launch" not in got["phases_ms"]
    out = run_cli("doctor", "--ledger", str(tmp_path / "ledger.json"))
    assert out.returncode == 0 and "preload" in out.stdout


def test_a_ledger_phase_is_timed_once() -> None:
    ledger = Ledger()
    with ledger.first("first_resolve"):
        pass
    first = ledger.phases_ms["first_resolve"]
    with ledger.first("first_resolve"):
        sum(range(10000))
    ledger.saved("tuning", None)
    assert ledger.phases_ms["first_resolve"] == first and ledger.avoided["records"] == 1
    assert "first_resolve" in format_ledger(ledger.to_json())


def test_ctbuild_preload_env_starts_one_at_import(tmp_path: Path) -> None:
    """``CTBUILD_PRELOAD=1``: ``import ctbuild`` starts a preload (`runtime.preloading()`);
    where it cannot run (here: no GPU) its report says why and the program goes on."""
    import os
    code = ("import json, torch, ctbuild; from ctbuild import runtime; job = runtime.preloading();"
            " print(json.dumps(None if job is None else job.wait(60)))")
    env = {**os.environ, "CTBUILD_CACHE_DIR": str(tmp_path / "cache")}
    for flag, started in (("1", True), ("0", False)):
        env["CTBUILD_PRELOAD"] = flag
        report = python_json(code, env=env, timeout=120)
        if not started:
            assert report is None
        elif torch.cuda.is_available():
            assert "error" in report or report["records"] == 0
        else:  # torch's own error said "not compiled with CUDA"
            assert report["error"].startswith("no CUDA GPU visible to torch") and report["seconds"] >= 0
