"""Warm-start runtime on a real GPU: cache hits with no compile, strict/default/tune misses,
read-only caches, reset_to_zero, explicit streams, threads.

Needs a warm cache of the examples: ``CTBUILD_TEST_CACHE=DIR`` (e.g. the one
``benchmarks/warm_start.py --cache DIR`` builds), else one is built here (precompile in a local
process pool + tune: a minute or two). Skipped without CUDA.
"""
from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import cuda.tile as ct  # noqa: E402
from gpu_runtime_examples import (  # noqa: E402
    BETWEEN_BUCKETS,
    between_buckets_case,
    capture,
    check,
    gpu_case,
    load_examples,
    replay_checked,
    warm_examples_cache,
)

import ctbuild  # noqa: E402
from ctbuild import Product, Tensor, runtime  # noqa: E402
from ctbuild.cache import Store  # noqa: E402
from ctbuild.dims import dims_of  # noqa: E402
from ctbuild.serve.miss_policy import CacheMissError  # noqa: E402
from ctbuild.serve.served_kernel import STATS  # noqa: E402

pytestmark = pytest.mark.gpu
KERNELS = load_examples()


@ctbuild.autotune(space=Product(TILE=[256, 512]),
                  grid=lambda cfg, w: (ct.cdiv(w.X.shape[0], cfg.TILE),),
                  default={"TILE": 256}, reset_to_zero=("OUT",),
                  workloads=[{"X": Tensor((4096,), "float32"), "OUT": Tensor((4096,), "float32")}])
@ct.kernel
def rt_test_accumulate(X, OUT, TILE: ct.Constant[int]):
    bid = ct.bid(0)
    x = ct.load(X, index=(bid,), shape=(TILE,), padding_mode=ct.PaddingMode.ZERO)
    acc = ct.load(OUT, index=(bid,), shape=(TILE,), padding_mode=ct.PaddingMode.ZERO)
    ct.store(OUT, index=(bid,), tile=acc + x)


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return warm_examples_cache(lambda: tmp_path_factory.mktemp("warm"))


@pytest.fixture
def cache_copy(warm_cache: Path, tmp_path: Path) -> Path:
    import gc
    dst = tmp_path / "cache"
    # SQLite's -shm index is rebuilt from the WAL on open; it may vanish mid-copy. So may the
    # WAL itself, when an earlier test's store is collected (its last connection closing
    # checkpoints the WAL into the database): collect first, and copy again if it happened.
    for attempt in range(2):
        gc.collect()
        try:
            shutil.copytree(warm_cache, dst, ignore=shutil.ignore_patterns("*-shm"))
            return dst
        except shutil.Error:
            shutil.rmtree(dst, ignore_errors=True)
            if attempt:
                raise
    return dst


@pytest.fixture(autouse=True)
def clean_runtime(monkeypatch: pytest.MonkeyPatch):
    for var in ("CTBUILD_MODE", "CTBUILD_RECORD", "CTBUILD_DISABLE_AUTOTUNE", "CTBUILD_TOOLCHAIN"):
        monkeypatch.delenv(var, raising=False)
    runtime.reset()
    yield
    runtime.reset()


def odd_matmul():
    """A shape no workload declares, with dims not divisible by 16: another tuning key and
    another launch signature than anything in the cache (the generic CUBIN covers it)."""
    a = torch.randn(250, 500, dtype=torch.float16, device="cuda")
    b = torch.randn(500, 380, dtype=torch.float16, device="cuda")
    return a, b, torch.empty(250, 380, dtype=torch.float16, device="cuda")


def odd_rmsnorm():
    """A row width no workload declares: its ct.Constant N (the padded width) takes a value
    never built, so no cached CUBIN covers the call. Returns (args, expected OUT)."""
    x = torch.randn(64, 1000, dtype=torch.float16, device="cuda")
    w = torch.randn(1000, dtype=torch.float16, device="cuda")
    out = torch.empty_like(x)
    xf = x.float()
    ref = xf * torch.rsqrt((xf * xf).mean(dim=1, keepdim=True) + 1e-6) * w.float()
    return (x, w, out, 1e-6), ref


def test_warm_launch_of_every_example_is_correct_with_no_compile(warm_cache: Path) -> None:
    runtime.configure(cache_dir=warm_cache, mode="strict")
    jit0 = STATS.jit_compiles
    for name, tuned in KERNELS.items():
        for i in range(len(tuned.workloads)):
            for seed in (0, 1):  # the second call with fresh tensors takes the hot path
                args, expected = gpu_case(tuned, i, seed)
                tuned(*args)
                torch.cuda.synchronize()
                check(name, args, expected)
        prov = tuned.runtime.provenance()
        assert prov["origins"]["cache"] == prov["launches"] == 2 * len(tuned.workloads), prov
        assert prov["misses"] == {}
        assert len(prov["entries"]) <= 2 * len(tuned.workloads)
    assert STATS.jit_compiles == jit0


@pytest.mark.parametrize("name", sorted(BETWEEN_BUCKETS))
def test_a_dim_kernel_between_bucket_bounds_is_served_from_the_cache(warm_cache: Path,
                                                                      name: str) -> None:
    """A `Dim` example at a size that is no bucket bound (ROWS=1000): strict mode serves it
    with the record of the bucket above and a CUBIN precompiled for the range (exact or
    relaxed class; for this softmax the row count's divisibility is not in the signature, so
    exact), never the generic fallback, with no compile; the result matches torch."""
    runtime.configure(cache_dir=warm_cache, mode="strict")
    tuned = KERNELS[name]
    jit0 = STATS.jit_compiles
    for seed in (0, 1):
        args, expected = between_buckets_case(tuned, seed)
        tuned(*args)
        torch.cuda.synchronize()
        check(name, args, expected)
    prov = tuned.runtime.provenance()
    assert prov["origins"]["cache"] == prov["launches"] == 2 and prov["misses"] == {}, prov
    entry = prov["entries"][0]
    sizes, dims = BETWEEN_BUCKETS[name], dims_of(tuned.dynamic_workloads[0])
    assert not any(n in dims[d].buckets for d, n in sizes.items())  # no size was tuned itself
    assert entry["bucket"] == {d: dims[d].bucket_of(n) for d, n in sizes.items()}, entry
    assert entry["config_from"] in ("cache", "memory") and entry["cubin_from"] == "cache", entry
    assert entry["cubin_class"] in ("exact", "relaxed"), entry
    assert STATS.jit_compiles == jit0


def test_strict_mode_serves_covered_calls_and_raises_on_a_real_miss(warm_cache: Path) -> None:
    runtime.configure(cache_dir=warm_cache, mode="strict")
    jit0 = STATS.jit_compiles
    a, b, c = odd_matmul()  # undeclared shape: the generic CUBIN serves it, no compile
    KERNELS["matmul"](a, b, c)
    torch.cuda.synchronize()
    torch.testing.assert_close(c.float(), (a.float() @ b.float()), rtol=2e-2, atol=5e-2)
    entry = KERNELS["matmul"].runtime.provenance()["entries"][-1]
    assert entry["cubin_class"] == "generic" and STATS.jit_compiles == jit0
    args, _ = odd_rmsnorm()  # a constant value never built: nothing covers it
    with pytest.raises(CacheMissError) as err:
        KERNELS["rmsnorm"](*args)
    text = str(err.value)
    assert "'rmsnorm'" in text and "sm_90" in text and err.value.key in text
    assert "ctbuild tune" in text or "ctbuild precompile" in text


def test_a_zero_size_batch_is_served(warm_cache: Path) -> None:
    """An empty batch is a real serving call: strict mode serves it from the cache (the
    signature of a size-0 dim is derived as the dispatcher derives it, so a cached CUBIN
    covers it), no compile, no error, outputs stay empty; the next full batch is correct."""
    runtime.configure(cache_dir=warm_cache, mode="strict")
    jit0 = STATS.jit_compiles
    half = dict(dtype=torch.float16, device="cuda")
    x, y, out = (torch.empty(0, **half) for _ in range(3))
    KERNELS["silu_mul"](x, y, out)  # grid (0,)
    a, b = torch.empty(0, 4096, **half), torch.randn(4096, 4096, **half)
    c = torch.empty(0, 4096, **half)
    KERNELS["matmul"](a, b, c)  # grid (0, 32)
    torch.cuda.synchronize()
    assert out.shape == (0,) and c.shape == (0, 4096)
    assert STATS.jit_compiles == jit0
    for name in ("silu_mul", "matmul"):
        prov = KERNELS[name].runtime.provenance()
        assert prov["origins"].get("jit", 0) == 0, prov
        args, expected = gpu_case(KERNELS[name], 0, 0)
        KERNELS[name](*args)
        torch.cuda.synchronize()
        check(name, args, expected)


def test_default_mode_jit_compiles_records_and_writes_back(cache_copy: Path,
                                                           tmp_path: Path) -> None:
    record = tmp_path / "misses.jsonl"
    runtime.configure(cache_dir=cache_copy, mode="default", record=record)
    rmsnorm = KERNELS["rmsnorm"]
    jit0 = STATS.jit_compiles
    args, ref = odd_rmsnorm()
    rmsnorm(*args)
    torch.cuda.synchronize()
    torch.testing.assert_close(args[2].float(), ref, rtol=2e-2, atol=5e-2)
    assert STATS.jit_compiles == jit0 + 1
    prov = rmsnorm.runtime.provenance()
    assert prov["origins"]["jit"] == 1 and prov["misses"]["tuning"] == 1
    assert prov["classes"]["miss"] == 1
    line = json.loads(record.read_text().splitlines()[0])
    assert line["kernel"] == "rmsnorm" and line["arch"] == "sm_90"
    assert line["workload"]["X"]["tensor"] == [64, 1000]
    assert runtime.context().writebacks == 1
    # a fresh process (context) now finds the CUBIN: no compile
    runtime.configure(cache_dir=cache_copy, mode="strict", disable_autotune=True)
    args, ref = odd_rmsnorm()
    rmsnorm(*args)
    torch.cuda.synchronize()
    torch.testing.assert_close(args[2].float(), ref, rtol=2e-2, atol=5e-2)
    assert STATS.jit_compiles == jit0 + 1
    assert rmsnorm.runtime.provenance()["origins"]["default"] == 1


def test_read_only_cache(warm_cache: Path) -> None:
    ro = Store(warm_cache, readonly=True)
    runtime.configure(store=ro, mode="strict")
    tuned = KERNELS["rmsnorm"]
    args, expected = gpu_case(tuned, 0)
    tuned(*args)
    torch.cuda.synchronize()
    check("rmsnorm", args, expected)
    runtime.configure(store=ro, mode="default")
    a, b, c = odd_matmul()
    KERNELS["matmul"](a, b, c)
    torch.cuda.synchronize()
    torch.testing.assert_close(c.float(), (a.float() @ b.float()), rtol=2e-2, atol=5e-2)
    assert runtime.context().writebacks == 0


def test_tune_mode_tunes_online_and_records(cache_copy: Path) -> None:
    runtime.configure(cache_dir=cache_copy, mode="tune")
    silu = KERNELS["silu_mul"]
    x, y = (torch.randn(1 << 16, dtype=torch.float16, device="cuda") for _ in range(2))
    out = torch.empty_like(x)
    silu(x, y, out)
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), torch.nn.functional.silu(x.float()) * y.float(),
                               rtol=2e-2, atol=2e-2)
    prov = silu.runtime.provenance()
    assert prov["origins"]["tuned"] + prov["origins"]["jit"] == 1, prov
    assert prov["entries"][0]["config_from"] == "online"
    rkey = prov["entries"][0]
    store = Store(cache_copy)
    from ctbuild.keys import tuning_record_key
    key = tuning_record_key(kernel_fp=silu.fingerprint, tuning_key=rkey["tuning_key"],
                            arch=rkey["arch"], gpu=rkey["gpu"],
                            toolchain_fp=runtime.context().toolchain_fp)
    rec = store.get_tuning(key)
    assert rec is not None and rec["config"] == rkey["config"]


def test_tune_mode_measures_uncached_candidates_through_jit(cache_copy: Path) -> None:
    """An odd size changes the signature (no CUBIN cached): online tuning JIT-compiles the
    candidates through the runtime's served kernels and still records a winner."""
    runtime.configure(cache_dir=cache_copy, mode="tune")
    silu = KERNELS["silu_mul"]
    jit_before = runtime.stats()["jit_compiles"]
    x, y = (torch.randn(1000, dtype=torch.float16, device="cuda") for _ in range(2))
    out = torch.empty_like(x)
    silu(x, y, out)
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), torch.nn.functional.silu(x.float()) * y.float(),
                               rtol=2e-2, atol=2e-2)
    assert runtime.stats()["jit_compiles"] > jit_before
    entry = silu.runtime.provenance()["entries"][0]
    assert entry["config_from"] == "online"
    from ctbuild.keys import tuning_record_key
    key = tuning_record_key(kernel_fp=silu.fingerprint, tuning_key=entry["tuning_key"],
                            arch=entry["arch"], gpu=entry["gpu"],
                            toolchain_fp=runtime.context().toolchain_fp)
    rec = Store(cache_copy).get_tuning(key)
    assert rec is not None and rec["config"] == entry["config"] and rec["candidates"]


def test_reset_to_zero_and_explicit_stream(cache_copy: Path) -> None:
    runtime.configure(cache_dir=cache_copy, mode="default")
    x = torch.randn(4096, device="cuda")
    out = torch.full_like(x, 7.0)
    rt_test_accumulate(x, out)
    rt_test_accumulate(x, out)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x)  # zeroed before every launch: not 7 + 2x
    side = torch.cuda.Stream()
    out2 = torch.full_like(x, 3.0)
    torch.cuda.synchronize()
    rt_test_accumulate.launch(side, x, OUT=out2)
    side.synchronize()
    torch.testing.assert_close(out2, x)


def test_a_served_call_launches_on_the_current_stream(warm_cache: Path) -> None:
    """Once an entry serves its layout by its own code (C or Python), a call inside
    ``torch.cuda.stream(side)`` runs on ``side``: queued behind a sleep there, its output not
    yet written when the default stream is done; a torch copy checks the method."""
    runtime.configure(cache_dir=warm_cache, mode="strict")
    silu = KERNELS["silu_mul"]
    (x, y, out), expected = gpu_case(silu, 0)
    for _ in range(3):
        silu(x, y, out)
    torch.cuda.synchronize()

    def queued_behind_a_sleep(launch: Callable[[], object]) -> bool:
        out.zero_()
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)  # about 0.1 s on the side stream
            launch()
        torch.cuda.default_stream().synchronize()
        queued = not side.query() and out.float().abs().sum().item() == 0
        side.synchronize()
        return queued

    assert queued_behind_a_sleep(lambda: out.copy_(x))
    assert queued_behind_a_sleep(lambda: silu(x, y, out))
    check("silu_mul", (x, y, out), expected)
    assert queued_behind_a_sleep(lambda: silu.launch(torch.cuda.current_stream(), x, y, out))
    assert silu.runtime.provenance()["launches"] == 5


def test_hot_path_reuses_the_entry(warm_cache: Path) -> None:
    runtime.configure(cache_dir=warm_cache, mode="strict")
    silu = KERNELS["silu_mul"]
    args, expected = gpu_case(silu, 0)
    for _ in range(20):
        silu(*args)
    torch.cuda.synchronize()
    check("silu_mul", args, expected)
    assert len(silu.runtime._entries) == 1
    assert silu.runtime.provenance()["launches"] == 20


def test_served_kernels_are_captured_in_a_cuda_graph_and_replayed(warm_cache: Path) -> None:
    """Every example captured with ``torch.cuda.graph`` (warmed on a side stream first, as
    torch asks) and replayed on new inputs copied into the captured tensors: each replay
    matches torch, and nothing is resolved or launched outside the graph meanwhile."""
    runtime.configure(cache_dir=warm_cache, mode="strict")
    for tuned in KERNELS.values():
        static, _ = gpu_case(tuned)
        graph = capture(tuned, static)
        for seed in (1, 2):
            replay_checked(graph, tuned, static, seed)
        assert len(tuned.runtime._entries) == 1 and tuned.runtime.provenance()["launches"] == 2


GRAPH_ACROSS_RESET = """
import gc, sys
import torch
sys.path.insert(0, sys.argv[2])
from gpu_runtime_examples import capture, gpu_case, load_examples, replay_checked
from ctbuild import runtime
tuned = load_examples()["silu_mul"]
runtime.configure(cache_dir=sys.argv[1], mode="strict")
static, _ = gpu_case(tuned)
graph = capture(tuned, static)
runtime.reset()                                   # the runtime that launched it is gone
runtime.configure(cache_dir=sys.argv[1], mode="strict")
gc.collect()
replay_checked(graph, tuned, static, seed=1)
del graph
gc.collect()
torch.cuda.synchronize()
print("replayed and destroyed")
"""


def test_a_cuda_graph_captured_before_a_runtime_reset_replays_and_is_destroyed(
        warm_cache: Path) -> None:
    """A graph captured from a runtime that `runtime.reset` (or a new `configure`) then
    replaced still replays correctly, and destroying it does not crash the process: the
    replaced runtime's kernel objects stay alive, as cuTile unloads a kernel object's CUBINs
    when it is freed (on an H200 the process died of a segfault at exit, when torch's
    compiled graphs were destroyed after a test had reset the runtime). In a subprocess, so
    a crash fails this test alone."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", GRAPH_ACROSS_RESET, str(warm_cache),
                           str(Path(__file__).resolve().parent.parent)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "replayed and destroyed" in proc.stdout, \
        f"rc={proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"


def test_a_preloaded_kernel_is_served_from_memory(warm_cache: Path) -> None:
    """`runtime.preload` makes each tuned record's hot-path entry and has cuTile load its
    module, launching nothing; the first calls then resolve nothing, read nothing from disk,
    load no module (the dispatcher never asks for a CUBIN again), and are correct."""
    runtime.configure(cache_dir=warm_cache, mode="strict")
    report = runtime.preload(background=False).wait()
    assert report["records"] >= len(KERNELS) and report["cubins"] == report["records"]
    assert report["resolved"] == report["modules"] == report["records"] and report["bytes"] > 0
    store = runtime.context().store
    reads: list[str] = []
    original = store._rows
    store._rows = lambda ns, *a: (reads.append(ns), original(ns, *a))[1]
    for name, tuned in KERNELS.items():
        entries, hits = list(tuned.runtime._entries), STATS.hits
        args, expected = gpu_case(tuned)
        tuned(*args)
        torch.cuda.synchronize()
        check(name, args, expected)
        assert tuned.runtime._entries == entries and STATS.hits == hits, name
        assert tuned.runtime.provenance()["launches"] == 1, name
    assert reads == []


def test_an_alignment_the_key_does_not_hold_is_caught_and_served_by_its_class(
        warm_cache: Path) -> None:
    """C at an address 2 bytes off 16, same shape, strides and dtype: the hot-path key matches
    the aligned call's entry, but its pinned kernel sees another launch signature and refuses
    it before launching. The call is resolved again (a weaker CUBIN class covers it), correct,
    counted by its class; from then on the kernel's keys hold pointer % 16."""
    runtime.configure(cache_dir=warm_cache, mode="strict")
    mm = KERNELS["matmul"]
    (a, b, c), expected = gpu_case(mm, 0)
    for _ in range(3):
        mm(a, b, c)
    torch.cuda.synchronize()
    check("matmul", (a, b, c), expected)
    assert mm.runtime.provenance()["keys"] == "contiguity"
    buf = torch.zeros(c.numel() + 8, dtype=c.dtype, device="cuda")
    c_odd = buf[1:1 + c.numel()].view(c.shape)
    assert c_odd.stride() == c.stride() and c_odd.data_ptr() % 16 == 2
    jit0, misses0 = STATS.jit_compiles, STATS.misses
    for _ in range(2):
        mm(a, b, c_odd)
    mm(a, b, c)
    torch.cuda.synchronize()
    check("matmul", (a, b, c_odd), expected)
    check("matmul", (a, b, c), expected)
    prov = mm.runtime.provenance()
    assert prov["keys"] == "alignment" and prov["launches"] == 6
    assert prov["classes"]["exact"] == 4
    assert prov["classes"]["relaxed"] + prov["classes"]["generic"] == 2
    assert (STATS.jit_compiles, STATS.misses) == (jit0, misses0)


def test_sixteen_threads_first_calls(warm_cache: Path) -> None:
    runtime.configure(cache_dir=warm_cache, mode="strict")
    silu = KERNELS["silu_mul"]
    cases = [gpu_case(silu, i % 2, seed=i) for i in range(16)]
    torch.cuda.synchronize()
    barrier = threading.Barrier(16)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            barrier.wait()
            silu(*cases[i][0])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert not errors, errors
    for args, expected in cases:
        check("silu_mul", args, expected)
    # one cuTile kernel object per config and pinned signature, however many threads raced
    pairs = {(json.dumps(e.kernel.config.to_json(), sort_keys=True), e.kernel.pin)
             for e in silu.runtime._entries}
    assert len(silu.runtime.resolver.kernel_objects()) == len(pairs)
