"""Serving coverage on a CPU: dynamic dims and buckets, signature classes planned and compiled
with the real tileiras, the runtime's lookup order (exact -> relaxed -> generic) and `explain`,
coverage in `ctbuild plan`, device-aware grids, and the miss loop's discovery of recorded
workloads."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cuda.tile as ct
import pytest
from conftest import ROOT, RUNTIME_TOOLCHAIN, run_cli

import ctbuild
from ctbuild import Dim, Product, Tensor

PROJECT = ROOT / "tests" / "fixtures" / "coverage_project"


@pytest.fixture
def cov(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(PROJECT))
    import cov_kernels.kernels as k
    return k


def test_dim_buckets_and_validation() -> None:
    from ctbuild import Dim
    m = Dim("M", 1, 8192)
    assert m.buckets[:4] == (1, 2, 4, 8) and m.buckets[-1] == 8192
    assert [m.bucket_of(n) for n in (1, 3, 17, 4095, 4097, 8191)] == [1, 4, 32, 4096, 8192, 8192]
    assert m.bucket_of(0) is None and m.bucket_of(8193) is None
    assert Dim("T", 3, 1000).buckets == (4, 8, 16, 32, 64, 128, 256, 512, 1000)
    assert Dim("T", 1, 100, buckets=[10, 50]).buckets == (10, 50, 100)
    for bad in (("M", 0, 4), ("M", 8, 4), ("not a name", 1, 4)):
        with pytest.raises(ValueError):
            Dim(*bad)
    with pytest.raises(ValueError, match="below lo"):
        Dim("M", 4, 100, buckets=[2])


def test_buckets_expand_to_representative_workloads(cov) -> None:
    from ctbuild.specs import Tensor
    k = cov.dyn_matmul
    assert len(k.workloads) == 14 and len(k.dynamic_workloads) == 1
    sizes = sorted(w.A.shape[0] for w in k.workloads)
    assert sizes == [1 << i for i in range(14)]
    assert all(w.A.shape[0] == w.C.shape[0] for w in k.workloads)
    # The tuning key of a call is its bucket's: M=3000 and M=4096 share one record.
    a = k.explain(Tensor((3000, 4096), "float16"), Tensor((4096, 4096), "float16"),
                  Tensor((3000, 4096), "float16"), arch="sm_90")
    b = k.explain(Tensor((4096, 4096), "float16"), Tensor((4096, 4096), "float16"),
                  Tensor((4096, 4096), "float16"), arch="sm_90")
    assert a["bucket"] == b["bucket"] == {"M": 4096}
    assert a["tuning_key"] == b["tuning_key"]


def test_weaken_is_deterministic_and_normalises_size_one(cov) -> None:
    """M=1 (calling convention v2, shape constant 1) and M=17 weaken to one relaxed signature;
    every layout of one dtype pattern weakens to one generic signature."""
    from ctbuild.signature import derive_signature, signature_text
    from ctbuild.signature_classes import GENERIC_WEAKENING, RELAXED, Weakening, weaken
    from ctbuild.specs import Tensor
    k = cov.dyn_matmul
    cfg = k.default_config(k.workloads[0])
    dyn = ((0,), ()), None, ((0,), ())
    relaxed = Weakening(RELAXED, (*dyn, None, None, None))

    def sig(m, a_strides=None, align=256):
        w = {"A": Tensor((m, 4096), "float16", a_strides, align),
             "B": Tensor((4096, 4096), "float16"), "C": Tensor((m, 4096), "float16")}
        return derive_signature(k.kernel, k.kernel_args(cfg, k.bind(**w)))

    one, odd = sig(1), sig(17)
    assert one.calling_convention.code != odd.calling_convention.code
    texts = {signature_text(weaken(s, relaxed, "dyn_matmul")) for s in (one, odd, sig(4095))}
    assert len(texts) == 1
    assert weaken(one, relaxed, "dyn_matmul").calling_convention.code == \
        odd.calling_convention.code
    generic = {signature_text(weaken(s, GENERIC_WEAKENING, "dyn_matmul"))
               for s in (one, odd, sig(4096), sig(64, (1, 64)), sig(33, None, 2))}
    assert len(generic) == 1
    # Pure: the same input gives the same text and symbol every time.
    w1, w2 = weaken(odd, relaxed, "dyn_matmul"), weaken(odd, relaxed, "dyn_matmul")
    assert signature_text(w1) == signature_text(w2) and w1.symbol == w2.symbol


def test_plan_coverage_json_and_summary(cov) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:  # the JSON and the text plan at once
        proc, text = pool.map(lambda extra: run_cli("plan", "--config", str(PROJECT / "ctbuild.toml"),
                                                    *extra), [("--json",), ()])
    assert proc.returncode == 0, proc.stderr
    kernels = {k["name"]: k for k in json.loads(proc.stdout)["kernels"]}
    mm = kernels["dyn_matmul"]["coverage"]
    assert mm["dynamic_dims"]["M"]["lo"] == 1 and mm["dynamic_dims"]["M"]["hi"] == 8192
    assert mm["buckets"] == 14 and mm["classes"]["generic"] == 1
    assert mm["cubins"] == sum(mm["classes"].values()) == kernels["dyn_matmul"]["jobs"]
    add = kernels["dyn_add"]["coverage"]
    assert add["buckets"] == 6 and add["classes"]["relaxed"] >= 1
    assert mm["uncoverable_constants"] == []
    assert text.returncode == 0 and "M in [1, 8192]" in text.stdout and "generic" in text.stdout


def test_constant_derived_from_a_dynamic_dim_warns(tmp_path: Path) -> None:
    cfg = tmp_path / "ctbuild.toml"
    cfg.write_text(f'modules = ["cov_kernels.derived"]\npaths = ["{PROJECT}"]\n')
    proc = run_cli("plan", "--config", str(cfg), "--json")
    # bad_grid is in the same module: the plan must refuse it with exit 2, naming it.
    assert proc.returncode == 2, proc.stdout
    assert "bad_grid" in proc.stderr and "ZeroDivisionError" in proc.stderr
    assert "X=Tensor((64,), float32)" in proc.stderr and "Traceback" not in proc.stderr


def test_derived_constants_found(cov, monkeypatch: pytest.MonkeyPatch) -> None:
    import cov_kernels.derived as d

    from ctbuild.compile.coverage import derived_constants
    found = derived_constants(d.seq_constant)
    assert [f["parameter"] for f in found] == ["SEQ"] and "declare the values" in \
        found[0]["message"].lower()
    assert derived_constants(cov.dyn_center_rows) == []  # COLS comes from a static dim


def test_grid_sees_the_nominal_device(cov) -> None:
    from ctbuild.device_table import nominal_device
    from ctbuild.project import load_project
    project = load_project(PROJECT / "ctbuild.toml")
    dev = nominal_device("sm_90", project.devices)
    assert (dev.name, dev.sm_count) == ("NVIDIA H200", 132)
    assert nominal_device("sm_100").sm_count == 148
    k = cov.persistent_scale
    w = max(k.workloads, key=lambda w: w.X.shape[0])
    cfg = k.default_config(w)
    assert k.grid(cfg, w, dev) == (132,)
    assert k.grid(cfg, w, nominal_device("sm_100")) == (148,)


def test_bad_devices_table(tmp_path: Path) -> None:
    cfg = tmp_path / "ctbuild.toml"
    cfg.write_text(f'modules = ["cov_kernels.kernels"]\npaths = ["{PROJECT}"]\n'
                   '[devices]\nsm_90 = { sm_count = 0 }\n')
    proc = run_cli("plan", "--config", str(cfg))
    assert proc.returncode == 2 and "sm_count" in proc.stderr and "Traceback" not in proc.stderr


@pytest.fixture
def compiled_add(cov, runtime_store, monkeypatch: pytest.MonkeyPatch):
    """A cache holding, compiled by the real tileiras, dyn_add's default-config CUBINs of the
    4096 bucket (exact and relaxed) and its generic CUBIN; no tuning record."""
    from ctbuild import runtime
    from ctbuild.compile.compiler import compile_job
    from ctbuild.compile.plan import job_for, relaxed_weakening
    from ctbuild.signature_classes import GENERIC_WEAKENING
    k = cov.dyn_add
    rep = next(w for w in k.workloads if w.X.shape[0] == 4096)
    cfg = k.default_config(rep)
    monkeypatch.setattr("ctbuild.toolchain.probe", _fake_probe)
    jobs = {"exact": job_for(k, cfg, rep, "sm_90", RUNTIME_TOOLCHAIN),
            "relaxed": job_for(k, cfg, rep, "sm_90", RUNTIME_TOOLCHAIN,
                               relaxed_weakening(k, cfg, rep)),
            "generic": job_for(k, cfg, rep, "sm_90", RUNTIME_TOOLCHAIN, GENERIC_WEAKENING)}
    assert len({j.key for j in jobs.values()}) == 3
    for job in jobs.values():
        out = compile_job(job.to_json())
        runtime_store.put_compile(job.key, out["cubin"], symbol=out["symbol"], meta=out["meta"])
    runtime.configure(store=runtime_store, mode="strict")
    return k, cfg, jobs


class _FakeToolchain:
    fingerprint = RUNTIME_TOOLCHAIN


def _fake_probe():
    """compile_job checks the job's key against this process's toolchain fingerprint; the
    runtime cache records RUNTIME_TOOLCHAIN, so the worker must see the same."""
    return _FakeToolchain()


def test_lookup_order_and_explain(compiled_add) -> None:
    from ctbuild.serve.miss_policy import CacheMissError
    from ctbuild.specs import Tensor
    k, cfg, jobs = compiled_add

    def explain(n, align=256, strides=None, dtype="float32"):
        t = Tensor((n,), dtype, strides, align)
        return k.explain(t, t, t, arch="sm_90", gpu="NVIDIA H200")

    exact = explain(4096)
    assert (exact["cubin_class"], exact["compile_key"]) == ("exact", jobs["exact"].key)
    assert exact["bucket"] == {"N": 4096} and exact["cached"] and exact["config"] == cfg.to_json()
    assert exact["config_from"] == "default"  # no tuning record: the default config
    # Size 1 switches the dispatcher to calling convention v2 with a shape constant: its own
    # signature is not built, the relaxed CUBIN serves it.
    one = explain(1)
    assert (one["cubin_class"], one["compile_key"]) == ("relaxed", jobs["relaxed"].key)
    for n in (17, 4095, 100001):  # their own signature IS the relaxed one: an exact hit
        e = explain(n)
        assert (e["cubin_class"], e["compile_key"]) == ("exact", jobs["relaxed"].key), n
    for e in (explain(4096, align=4), explain(64, strides=(2,)), explain(7, strides=(0,))):
        assert (e["cubin_class"], e["compile_key"]) == ("generic", jobs["generic"].key)
    assert exact["why"] == ["declared, but not tuned on this GPU (no tuning record)"]
    miss = explain(4096, dtype="float16")  # a dtype never declared: nothing covers it
    assert miss["cubin_class"] == "miss" and not miss["cached"]
    assert miss["why"][0] == "X: dtype float16, declared float32"
    assert miss["nearest"].startswith("Workload(X=Tensor((Dim('N', 1, 16777216),), float32)")
    assert miss["fix"].startswith("add {'X': Tensor((N,), 'float16'), ")  # the module's N
    # Above the Dim's range its relaxed CUBIN would serve, but no build planned or tuned that
    # size: a miss naming the range, never "exact" with no bucket.
    beyond = explain(1 << 25)
    assert (beyond["cubin_class"], beyond["bucket"], beyond["cached"]) == ("miss", None, False)
    assert beyond["why"][0] == ("X dim 0: size 33554432 is above the range [1, 16777216] of "
                                "Dim('N', 1, 16777216)")
    assert beyond["fix"] == ("widen N to Dim('N', 1, 33554432, buckets=(1, 256, 4096, 65536, "
                             "1048576, 16777216, 33554432)) in workloads=[...]")
    assert "(runtime.configure(store=...))" in beyond["cache"]
    # Strict mode resolves every covered call (a tuning miss is counted, not raised) ...
    t = Tensor((1,), "float32")
    res = k.runtime.resolve((t, t, t), arch="sm_90", gpu="NVIDIA H200")
    assert res.cubin_class == "relaxed" and k.runtime.ctx.misses.total("dyn_add") == {"tuning": 1}
    # ... and raises only when nothing covers the call.
    h = Tensor((4096,), "float16")
    with pytest.raises(CacheMissError):
        k.runtime.resolve((h, h, h), arch="sm_90", gpu="NVIDIA H200")
    big = Tensor((1 << 25,), "float32")  # ... or when no declaration covers the size
    with pytest.raises(CacheMissError, match=r"size 33554432 is above the range"):
        k.runtime.resolve((big, big, big), arch="sm_90", gpu="NVIDIA H200")


def test_recorded_workloads_are_discovered_for_tuning(cov, runtime_store,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from ctbuild.compile.plan import job_for
    from ctbuild.specs import Tensor, Workload
    from ctbuild.tune.recorded import recorded_workloads
    from ctbuild.tune.session import entries_for
    k = cov.dyn_matmul
    odd = Workload({"A": Tensor((3000, 1000), "float16"), "B": Tensor((1000, 4096), "float16"),
                    "C": Tensor((3000, 4096), "float16")})
    declared = k.workloads[5]
    for w in (odd, declared):
        job = job_for(k, k.default_config(w), w, "sm_90", RUNTIME_TOOLCHAIN)
        runtime_store.put_compile(job.key, b"cubin", symbol=job.symbol, meta={
            **{f: getattr(job, f) for f in ("kernel", "module", "kernel_fp", "arch", "config",
                                            "workload")}, "class": "exact"})
    found = recorded_workloads(runtime_store, [k], "sm_90")
    assert found == {"dyn_matmul": [odd]}
    assert recorded_workloads(runtime_store, [k], "sm_100") == {}
    entries = entries_for([k], (), found)
    assert len(entries) == len(k.workloads) + 1 and entries[-1].workload == odd


def test_jit_without_tileiras_is_a_counted_miss_not_a_compile(cov, runtime_store,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """Where tileiras is absent, a JIT attempt raises CacheMissError (not FileNotFoundError)
    and counts as a failure, never in ``jit_compiles``."""
    import cuda.tile._compile as cc
    from cuda.tile._cext import default_tile_context

    from ctbuild import runtime
    from ctbuild.serve.miss_policy import CacheMissError
    from ctbuild.serve.served_kernel import STATS, ServedKernel
    from ctbuild.signature import derive_signature
    from ctbuild.specs import Tensor

    def absent():
        raise FileNotFoundError("'tileiras' compiler not found")

    monkeypatch.setattr(cc, "_find_compiler_bin", absent)
    ctx = runtime.configure(store=runtime_store, mode="default")
    k = cov.dyn_add
    cfg = k.default_config(k.workloads[0])
    t = Tensor((4096,), "float16")
    signature = derive_signature(k.kernel, k.kernel_args(cfg, k.bind(t, t, t)))
    served = ServedKernel(k, cfg, ctx.source)
    before = (STATS.jit_compiles, STATS.jit_failures)
    with pytest.raises(CacheMissError, match="cannot be JIT-compiled"):
        served.jit_compile(signature, default_tile_context, "sm_90")
    assert (STATS.jit_compiles, STATS.jit_failures) == (before[0], before[1] + 1)
    assert runtime.stats()["jit_compiles"] == before[0]


def test_a_pulled_cache_image_serves_what_explain_says(compiled_add, tmp_path: Path) -> None:
    """The cache pushed as an OCI image (a layout on disk) and pulled into a fresh directory
    serves the same CUBINs: explain and the runtime's resolve agree with the original cache."""
    from ctbuild import runtime
    from ctbuild.cache import Store
    from ctbuild.cache.oci.image import pull, push
    from ctbuild.cache.oci.layout import Layout
    from ctbuild.specs import Tensor
    k, cfg, jobs = compiled_add
    t4096, t1 = Tensor((4096,), "float32"), Tensor((1,), "float32")
    before = [k.explain(t, t, t, arch="sm_90", gpu="NVIDIA H200") for t in (t4096, t1)]
    push(k.runtime.ctx.store, Layout(tmp_path / "oci", create=True), "v1")
    pulled = pull(Layout(tmp_path / "oci"), "v1", tmp_path / "pulled", arch="sm_90")
    assert pulled["compile_entries"] == 3 and pulled["archs"] == ["sm_90"]
    runtime.configure(store=Store(tmp_path / "pulled", readonly=True), mode="strict")
    assert k.runtime.ctx.store.path == tmp_path / "pulled"  # explain and resolve read the pulled cache
    after = [k.explain(t, t, t, arch="sm_90", gpu="NVIDIA H200") for t in (t4096, t1)]
    def same(e: dict) -> dict:  # all but which cache answered
        return {k: v for k, v in e.items() if k != "cache"}
    assert [same(e) for e in after] == [same(e) for e in before]
    assert [e["compile_key"] for e in after] == [jobs["exact"].key, jobs["relaxed"].key]
    assert all(e["cached"] for e in after)
    res = k.runtime.resolve((t1, t1, t1), arch="sm_90", gpu="NVIDIA H200")
    assert res.cubin_class == "relaxed"


@ctbuild.autotune(space=Product(TILE=[16]),
                  grid=lambda cfg, w: (ct.cdiv(w.X.shape[0], cfg.TILE),),
                  workloads=[{"X": Tensor((Dim("L", 1, 64),), "float32")}])
@ct.kernel
def range_probe(X, TILE: ct.Constant[int]):
    ct.store(X, index=(ct.bid(0),), tile=ct.load(X, index=(ct.bid(0),), shape=(TILE,)))


def test_a_size_beyond_a_dim_is_a_miss_when_called(stub_gpu: list[tuple], runtime_store,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A call with L=128 (declared up to 64) whose signature a cached CUBIN has: strict mode
    refuses it (before, it launched the default config silently); default mode launches it
    and counts a range miss."""
    torch = pytest.importorskip("torch")
    from ctbuild import runtime
    from ctbuild.serve.miss_policy import CacheMissError
    from ctbuild.signature import derive_signature
    x = torch.zeros(128)
    cfg = range_probe.default_config(range_probe.workloads[0])
    spec = range_probe.bind(Tensor((128,), "float32"))  # x's layout
    sig = derive_signature(range_probe.kernel, range_probe.kernel_args(cfg, spec))
    key = runtime.context().source.key_for(range_probe, cfg, sig, "sm_90")
    runtime_store.put_compile(key, b"fake cubin", symbol=sig.symbol,
                              meta={"kernel": "range_probe"})
    for mode in ("strict", "default"):
        ctx = runtime.configure(store=runtime_store, mode=mode)
        monkeypatch.setattr(ctx, "device_info", lambda d: ("sm_90", "NVIDIA H100 80GB HBM3"))
        assert range_probe.explain(x, arch="sm_90")["cubin_class"] == "miss"
        if mode == "strict":
            with pytest.raises(CacheMissError, match=r"size 128 is above the range \[1, 64\]"):
                range_probe(x)
            assert stub_gpu == []
        else:
            range_probe(x)
            assert len(stub_gpu) == 1 and ctx.misses.total("range_probe")["range"] == 1


def test_explain_names_a_constant_and_a_rank_no_workload_declares(
        runtime_store, monkeypatch: pytest.MonkeyPatch) -> None:
    """add_eps declares eps=1e-5 (a ct.Constant through args=) on 64x256 tensors."""
    from ctbuild import runtime
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "fixtures" / "identity_project"))
    from idkernels.eps import add_eps
    runtime.configure(store=runtime_store, mode="strict")
    x = Tensor((64, 256), "float32")
    eps = add_eps.explain(x, x, 1e-6, arch="sm_90")
    assert eps["cubin_class"] == "miss" and eps["why"] == [
        "eps: ct.Constant value 1e-06, declared 1e-05"]
    assert eps["fix"] == ("add {'X': Tensor((64, 256), 'float32'), 'OUT': Tensor((64, 256), "
                          "'float32'), 'eps': 1e-06} to workloads=[...]")
    batched = Tensor((2, 64, 256), "float32")
    rank = add_eps.explain(batched, batched, 1e-5, arch="sm_90")
    assert rank["why"][0] == "X: rank 3 (2, 64, 256), declared rank 2"
