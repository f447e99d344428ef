"""Runtime and the cache on a CPU machine: corrupt CUBINs, read-only caches, threads, imports."""
from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import cuda.tile as ct  # noqa: E402
from conftest import RUNTIME_TOOLCHAIN, count_slow_calls, python_json  # noqa: E402
from gpu_runtime_examples import ROOT, host_tensors, load_examples  # noqa: E402

import ctbuild  # noqa: E402
from ctbuild import Product, Tensor, runtime  # noqa: E402
from ctbuild.cache import Store  # noqa: E402
from ctbuild.serve.served_kernel import CubinSource, ServedKernel  # noqa: E402
from ctbuild.signature import derive_signature  # noqa: E402
from ctbuild.space import Config  # noqa: E402
from ctbuild.specs import Workload  # noqa: E402

KERNELS = load_examples()
GPU = "NVIDIA H100 80GB HBM3"
TC = RUNTIME_TOOLCHAIN


@pytest.fixture
def store(runtime_store: Store) -> Store:
    return runtime_store


def _signature_and_key(source: CubinSource, name: str, cfg: Config):
    tuned = KERNELS[name]
    w = tuned.workloads[0]
    sig = derive_signature(tuned.kernel, tuned.kernel_args(cfg, w))
    return sig, source.key_for(tuned, cfg, sig, "sm_90")


def test_corrupt_cubin_is_never_served(store: Store) -> None:
    tuned = KERNELS["silu_mul"]
    cfg = tuned.default_config(tuned.workloads[0])
    source = CubinSource(store, TC)
    sig, key = _signature_and_key(source, "silu_mul", cfg)
    cubin = b"\x7fELF" + bytes(range(256)) * 4
    store.put_compile(key, cubin, symbol=sig.symbol, meta={"kernel": "silu_mul"})
    assert source.lookup(tuned, cfg, sig, "sm_90") == (cubin, sig.symbol)
    blobs = [p for p in (store.path / "blobs").rglob("*.val")]
    assert len(blobs) == 1
    data = bytearray(blobs[0].read_bytes())
    data[100] ^= 0xFF
    blobs[0].write_bytes(bytes(data))
    assert source.lookup(tuned, cfg, sig, "sm_90") is None
    assert source.lookup(tuned, cfg, sig, "sm_90") is None  # and stays a miss


def test_foreign_symbol_is_not_served(store: Store) -> None:
    tuned = KERNELS["silu_mul"]
    cfg = tuned.default_config(tuned.workloads[0])
    source = CubinSource(store, TC)
    sig, key = _signature_and_key(source, "silu_mul", cfg)
    store.put_compile(key, b"\x7fELF cubin", symbol="some_other_symbol", meta={"kernel": "x"})
    assert source.lookup(tuned, cfg, sig, "sm_90") is None


def test_read_only_cache_serves_lookups(store: Store) -> None:
    tuned = KERNELS["matmul"]
    w = tuned.workloads[0]
    cfg = Config({"TM": 64, "TN": 64, "TK": 32, "num_ctas": 1}, "matmul")
    from ctbuild.keys import tuning_record_key
    rkey = tuning_record_key(kernel_fp=tuned.fingerprint, tuning_key=tuned.tuning_key(w),
                             arch="sm_90", gpu=GPU, toolchain_fp=TC)
    store.put_tuning(rkey, {"kernel": "matmul", "arch": "sm_90", "config": cfg.to_json(),
                            "compile_key": "c" * 32})
    sig, key = _signature_and_key(CubinSource(store, TC), "matmul", cfg)
    store.put_compile(key, b"\x7fELF cubin", symbol=sig.symbol, meta={"kernel": "matmul"})
    store.close()
    ro = Store(store.path, readonly=True)
    assert ro.readonly
    ctx = runtime.configure(store=ro, mode="strict")
    res = tuned.runtime.resolve(host_tensors(w, values=False), arch="sm_90", gpu=GPU)
    assert res.config == cfg and res.config_from == "cache" and res.cubin_from == "cache"
    assert ctx.source.lookup(tuned, cfg, sig, "sm_90") == (b"\x7fELF cubin", sig.symbol)
    # a JIT result is never written to a read-only cache
    assert ctx.write_back.put(tuned, cfg, "z" * 32, b"x", sig.symbol, "sm_90", sig, None) is False


def test_sixteen_threads_build_one_served_kernel_per_config(store: Store) -> None:
    runtime.configure(store=store, mode="default")
    tuned = KERNELS["silu_mul"]
    rt = tuned.runtime
    configs = [Config(c, "silu_mul") for c in tuned.space.enumerate()]
    barrier = threading.Barrier(16)
    got: list[list] = [[] for _ in range(16)]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            barrier.wait()
            for cfg in configs[i % 3:] + configs[: i % 3]:
                got[i].append(rt.served_kernel(cfg))
            args = host_tensors(tuned.workloads[i % 2], values=False)  # resolve reads none
            got[i].append(rt.resolve(args, arch="sm_90", gpu=GPU).served)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(rt.resolver.served) == len(configs)
    for cfg in configs:
        objs = {id(k) for g in got for k in g if k.config == cfg}
        assert len(objs) <= 1
    assert all(isinstance(k, ServedKernel) for g in got for k in g)
    assert len({id(g[-1]) for g in got}) == 1  # both workloads resolve to the default config


def test_served_kernel_is_built_on_cpu_with_the_config_hints(store: Store) -> None:
    runtime.configure(store=store)
    tuned = KERNELS["rmsnorm"]
    k = tuned.runtime.served_kernel(Config({"occupancy": 4, "num_worker_warps": 8}, "rmsnorm"))
    assert k._compiler_options.occupancy == 4 and k._compiler_options.num_worker_warps == 8
    assert k is tuned.runtime.served_kernel(Config({"occupancy": 4, "num_worker_warps": 8}))


def test_a_replaced_runtime_keeps_its_kernel_objects_alive(store: Store) -> None:
    """`runtime.reset` and a new `configure` drop the kernels' runtimes, not their kernel
    objects: cuTile unloads a kernel object's CUBINs when it is freed, and a CUDA graph
    captured before may still launch them (`tests/serve/test_runtime_gpu.py` replays one).
    Bounded: the oldest go once `MAX_KEPT_ALIVE` are held."""
    import gc
    import weakref

    from ctbuild.serve import served_kernel
    old = runtime.configure(store=store)
    tuned = KERNELS["rmsnorm"]
    held = weakref.ref(tuned.runtime.served_kernel(tuned.default_config(tuned.workloads[0])))
    replaced = weakref.ref(old)
    del old
    runtime.reset()
    runtime.configure(store=store)
    gc.collect()
    assert held() is not None and tuned.runtime.resolver.served == {}
    # what is held is the kernel object: not the replaced context (its store, its miss policy)
    assert held().source.store is None and replaced() is None
    with pytest.raises(RuntimeError, match="'rmsnorm': its runtime was replaced"):
        held().source.on_miss(held(), None, None, "sm_90")   # a call that raced the reset
    assert served_kernel._KEPT_ALIVE.maxlen == served_kernel.MAX_KEPT_ALIVE


WARM_SCRIPT = r"""
import json, sys
sys.path[:0] = [{root!r}, {examples!r}]
import ctbuild
from demo_kernels.matmul import matmul
import torch
a = torch.zeros(4096, 4096, dtype=torch.float16)
res = matmul.runtime.resolve((a, a.clone(), a.clone()), arch="sm_90", gpu="H100")
try:
    matmul(a, a, a)
except Exception as exc:
    err = str(exc)
print(json.dumps({{"config": res.config.to_json(), "err": err,
                  "mods": sorted(m for m in sys.modules
                                 if m.split(".")[0] == "ray" or m.startswith("ctbuild.farm"))}}))
"""


def test_warm_path_imports_neither_ray_nor_farm(tmp_path: Path) -> None:
    script = WARM_SCRIPT.format(root=str(ROOT), examples=str(ROOT / "examples"))
    env = {"PATH": "/usr/bin:/bin", "CTBUILD_CACHE_DIR": str(tmp_path / "c"),
           "CTBUILD_MODE": "default", "HOME": str(tmp_path)}
    got = python_json(script, env=env, cwd=tmp_path)
    assert got["mods"] == []
    assert got["config"] == {"TM": 128, "TN": 128, "TK": 64, "num_ctas": 1}
    assert "kernel 'matmul'" in got["err"]


READY_SCRIPT = r"""
import json, sys
sys.path[:0] = [{root!r}, {examples!r}]
{torch}
import ctbuild
from ctbuild import fingerprint_source
from ctbuild.serve import layout_guard
before = "ctbuild.serve.kernel_runtime" in sys.modules
from demo_kernels.rmsnorm import rmsnorm
print(json.dumps({{"before": before,
                  "serve": "ctbuild.serve.kernel_runtime" in sys.modules,
                  "guard": layout_guard.native_guard.cache_info().currsize,
                  "analysed": len(fingerprint_source._ANALYSED)}}))
"""


@pytest.mark.parametrize("serving", [True, False])
def test_a_serving_process_readies_the_runtime_as_kernels_are_declared(tmp_path: Path,
                                                                        serving: bool) -> None:
    """Where torch is imported (a serving process), the first declaration imports the serve
    phase and self-tests the C hot path, and each declaration analyses its kernel's source:
    none of it is left to a first call. A process without torch (a CLI, a compile worker)
    readies nothing."""
    script = READY_SCRIPT.format(root=str(ROOT), examples=str(ROOT / "examples"),
                                 torch="import torch" if serving else "")
    got = python_json(script, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, cwd=tmp_path)
    assert not got["before"]
    if serving:
        assert got["serve"] and got["guard"] == 1 and got["analysed"] >= 1
    else:
        assert not got["serve"] and got["guard"] == 0 and got["analysed"] == 0


def test_import_fails_loudly_on_another_cutile(monkeypatch: pytest.MonkeyPatch) -> None:
    import cuda.tile as ct

    from ctbuild.cutile import UnsupportedCuTileError, check
    monkeypatch.setattr(ct, "__version__", "1.8.0")
    with pytest.raises(UnsupportedCuTileError, match="1.7.0"):
        check()


def test_hot_path_skips_the_slow_path(stub_gpu: list[tuple],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first call of a layout, calls cost a key + dict lookup + ct.launch: no lock,
    no resolution (the launch and the device are stubbed: this runs on a CPU)."""
    launches = stub_gpu
    tuned = KERNELS["rmsnorm"]
    slow = count_slow_calls(tuned, monkeypatch)
    rt = tuned.runtime
    args = host_tensors(tuned.workloads[0])
    for _ in range(5):
        tuned(*args)
    again = host_tensors(tuned.workloads[0], seed=1)  # new tensors, same layout
    tuned(*again)
    assert len(slow) == 1 and len(launches) == 6
    stream, grid, kernel, kargs = launches[-1]
    assert grid == (4096,) and kargs[:4] == again and kargs[4] == 4096
    prov = rt.provenance()
    assert prov["launches"] == 6 and prov["keys"] == "contiguity"
    assert kernel.pinned  # the launch signature is guarded where the key does not look
    tuned(again[0], again[1], again[2], 1e-5)  # another scalar value: resolved once more
    tuned(X=again[0], W=again[1], OUT=again[2], eps=1e-5)  # keywords: same entry
    assert len(slow) == 2 and launches[-1][3][3] == 1e-5


def test_a_scalar_that_varies_does_not_grow_memory(stub_gpu: list[tuple],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Each eps is a new layout; past the memo's bound (``CTBUILD_MAX_LAYOUTS``) its rows fold
    into totals, and the counts stay whole."""
    tuned = KERNELS["rmsnorm"]
    monkeypatch.setattr(tuned.runtime.ctx.settings, "max_layouts", 3)
    x, w, out, _ = host_tensors(tuned.workloads[0])
    eps = [1e-6 * (i + 1) for i in range(10)]
    for e in eps:
        tuned(x, w, out, e)
    tuned(x, w, out, eps[-1])  # the last entry is still served from the memo
    rt = tuned.runtime
    prov = rt.provenance()
    assert len(stub_gpu) == 11 and prov["launches"] == 11
    assert sum(prov["classes"].values()) == 11 and sum(prov["origins"].values()) == 11
    assert len(rt._entries) <= 3 and len(rt._fast) <= 3
    assert prov["dropped_rows"] + len(prov["entries"]) == 10


@ctbuild.autotune(space=Product(TILE=[64]),
                  grid=lambda cfg, w: (ct.cdiv(w.X.shape[0], cfg.TILE),),
                  args=lambda cfg, w: (w.X, w.OUT, w.X.storage_offset(), cfg.TILE),
                  default={"TILE": 64},
                  workloads=[{"X": Tensor((256,), "float16"), "OUT": Tensor((256,), "float16")}])
@ct.kernel
def rt_offset_copy(X, OUT, OFFSET: int, TILE: ct.Constant[int]):
    """OUT = X, told where X starts in its storage."""
    bid = ct.bid(0)
    ct.store(OUT, index=(bid,), tile=ct.load(X, index=(bid,), shape=(TILE,)))


def test_a_declaration_reading_offsets_keys_by_address(stub_gpu: list[tuple],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``args`` passes X's storage offset: two views of one shape and stride at different
    offsets must not share an entry, even when their alignments agree (the layout key would
    launch the second with the first one's offset)."""
    launches = stub_gpu
    slow = count_slow_calls(rt_offset_copy, monkeypatch)
    base = torch.randn(512, dtype=torch.float16)
    out = torch.empty(256, dtype=torch.float16)
    for x in (base[:256], base[8:264], base[:256], base[1:257]):
        rt_offset_copy(x, out)
    assert [la[3][2] for la in launches] == [0, 8, 0, 1]
    assert len(slow) == 3
    prov = rt_offset_copy.runtime.provenance()
    assert prov["keys"] == "address" and len(prov["entries"]) == 3
    assert not launches[0][2].pinned


def test_what_a_declaration_reads_sets_what_keys_hold() -> None:
    from ctbuild.serve.declaration_reads import DeclarationReads
    x = torch.zeros(8, 16, dtype=torch.float16)
    reads = DeclarationReads()
    with reads:
        _ = (x.shape[0], x.size(1), x.is_contiguous(), x.dtype, x.ndim, x.dim(), len(x),
             x.numel(), x.device, x.element_size(), x.itemsize)
    assert (reads.needs, reads.why) == ("contiguity", None)
    for read, level in ((lambda: x.stride(0), "layout"), (lambda: x.stride(), "layout"),
                        (lambda: x.data_ptr(), "address"), (lambda: x.storage_offset(), "address"),
                        (lambda: x.t(), "address"), (lambda: x.view(-1), "address"),
                        (lambda: x[1:], "address"), (lambda: x + 1, "address")):
        reads = DeclarationReads()
        with reads:
            _ = (x.shape, read(), x.dtype)
        assert reads.needs == level, (read, reads.needs)


def test_a_non_contiguous_call_makes_keys_hold_strides(stub_gpu: list[tuple],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The default tuning key shows the stride pattern of a non-contiguous tensor: once one is
    seen, keys hold strides, so two views of one shape with different strides (and tuning
    keys) never share an entry."""
    launches = stub_gpu
    tuned = KERNELS["silu_mul"]
    slow = count_slow_calls(tuned, monkeypatch)
    n = tuned.workloads[0]["X"].shape[0]
    x, y, out = (torch.randn(n, dtype=torch.float16) for _ in range(3))
    tuned(x, y, out)
    assert tuned.runtime.provenance()["keys"] == "contiguity"
    wide = torch.randn(2 * n, dtype=torch.float16)
    tuned(wide[::2], y, out)
    tuned(torch.randn(4 * n, dtype=torch.float16)[::4], y, out)
    tuned(wide[::2], y, out)
    prov = tuned.runtime.provenance()
    assert prov["keys"] == "layout" and len(slow) == 3 and len(launches) == 4
    assert [e["tuning_key"][0][0][2] for e in prov["entries"]] == ["C", [2], [4]]


def test_a_pinned_served_kernel_refuses_a_second_signature(store: Store) -> None:
    """The guard of the layout key: a pinned kernel serves one launch signature; another one
    (here the same layout with A at an odd address) raises `LayoutChanged` before any lookup."""
    from ctbuild.arch import Arch
    from ctbuild.serve.served_kernel import LayoutChanged
    tuned = KERNELS["matmul"]
    w = tuned.workloads[0]
    cfg = tuned.default_config(w)
    a = w["A"]
    misaligned = Workload({**w, "A": Tensor(a.shape, a.dtype, a.strides, align=2)})
    sig = derive_signature(tuned.kernel, tuned.kernel_args(cfg, w))
    other = derive_signature(tuned.kernel, tuned.kernel_args(cfg, misaligned))
    assert sig.symbol != other.symbol
    pinned = ServedKernel(tuned, cfg, CubinSource(store, TC), pinned=True)
    for _ in range(2):  # nothing cached: the lookup runs, and misses, for the pinned one
        with pytest.raises(LookupError, match="no CUBIN"):
            pinned.serve(sig, None, Arch("sm_90"))
    with pytest.raises(LayoutChanged, match="differs from the pinned"):
        pinned.serve(other, None, Arch("sm_90"))
    free = ServedKernel(tuned, cfg, CubinSource(store, TC))
    for s in (sig, other):
        with pytest.raises(LookupError):
            free.serve(s, None, Arch("sm_90"))


def test_racing_first_calls_share_one_runtime(store: Store) -> None:
    """16 threads asking a fresh kernel for its runtime at once get the same object."""
    runtime.configure(store=store)
    tuned = KERNELS["matmul"]
    barrier = threading.Barrier(16)
    seen: list[object] = []

    def worker() -> None:
        barrier.wait()
        seen.append(tuned.runtime)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so an unlocked check-then-create races
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert len(seen) == 16 and len({id(r) for r in seen}) == 1
