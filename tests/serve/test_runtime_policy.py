"""Miss policy on a CPU machine: strict errors, default fallback, records, DISABLE_AUTOTUNE.

The runtime's ``resolve`` does everything a call does except the launch; with ``arch``/``gpu``
given it needs no GPU, so host tensors exercise the key computation and the policy.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from conftest import RUNTIME_TOOLCHAIN  # noqa: E402
from gpu_runtime_examples import host_tensors, load_examples  # noqa: E402

from ctbuild import runtime  # noqa: E402
from ctbuild.cache import Store  # noqa: E402
from ctbuild.keys import tuning_record_key  # noqa: E402
from ctbuild.serve.miss_policy import CacheMissError, RuntimeConfigError  # noqa: E402
from ctbuild.signature import derive_signature  # noqa: E402
from ctbuild.specs import Workload, spec_from_json  # noqa: E402

KERNELS = load_examples()
GPU = "NVIDIA H100 80GB HBM3"
TC = RUNTIME_TOOLCHAIN


@pytest.fixture
def store(runtime_store: Store) -> Store:
    return runtime_store


def record_for(store: Store, name: str, cfg: dict, w: Workload | None = None) -> str:
    tuned = KERNELS[name]
    w = w or tuned.workloads[0]
    key = tuning_record_key(kernel_fp=tuned.fingerprint, tuning_key=tuned.tuning_key(w),
                            arch="sm_90", gpu=GPU, toolchain_fp=TC)
    store.put_tuning(key, {"kernel": name, "arch": "sm_90", "gpu": GPU, "config": cfg,
                           "compile_key": "k" * 32})
    return key


def put_cubin(store: Store, name: str, cfg_json: dict, w: Workload | None = None) -> str:
    """A fake CUBIN under the compile key the runtime derives for this config + workload."""
    from ctbuild.space import Config
    tuned = KERNELS[name]
    w = w or tuned.workloads[0]
    cfg = Config(cfg_json, name)
    sig = derive_signature(tuned.kernel, tuned.kernel_args(cfg, w))
    ctx = runtime.context()
    key = ctx.source.key_for(tuned, cfg, sig, "sm_90")
    store.put_compile(key, b"\x7fELF fake cubin", symbol=sig.symbol, meta={"kernel": name})
    return key


def resolve(name: str, **kw):
    tuned = KERNELS[name]
    return tuned.runtime.resolve(host_tensors(tuned.workloads[0], values=False), arch="sm_90", gpu=GPU, **kw)


def test_strict_tuning_miss_is_counted_and_served_when_a_cubin_covers(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """Strict mode raises only when nothing covers the call: without a tuning record the
    default config serves from its cached CUBIN, and the miss is counted and logged with the
    kernel, the keys, the arch and the fix."""
    runtime.configure(store=store, mode="strict")
    tuned = KERNELS["matmul"]
    default = tuned.default_config(tuned.workloads[0])
    with pytest.raises(CacheMissError) as err:  # no CUBIN either: nothing covers the call
        resolve("matmul")
    assert err.value.what == "cubin" and err.value.kernel == "matmul"
    put_cubin(store, "matmul", default.to_json())
    runtime.configure(store=store, mode="strict")
    with caplog.at_level("WARNING", logger="ctbuild.runtime"):
        res = resolve("matmul")
    assert res.config == default and res.config_from == "default"
    assert res.cubin_class == "exact"
    assert tuned.runtime.provenance()["misses"] == {"tuning": 1}
    text = next(r.getMessage() for r in caplog.records if "no tuning record" in r.getMessage())
    assert "'matmul'" in text and "sm_90" in text and GPU in text
    tk = tuned.tuning_key(tuned.workloads[0])
    assert json.dumps(tk) in text and res.record_key in text


def test_strict_cubin_miss_names_compile_key(store: Store) -> None:
    runtime.configure(store=store, mode="strict")
    record_for(store, "matmul", {"TM": 64, "TN": 64, "TK": 32, "num_ctas": 1})
    with pytest.raises(CacheMissError) as err:
        resolve("matmul")
    assert err.value.what == "cubin"
    text = str(err.value)
    assert err.value.key in text and "'matmul'" in text and "sm_90" in text
    assert "ctbuild precompile --config ctbuild.toml --arch sm_90" in text
    assert '"TM": 64' in text


def test_strict_hit_resolves_from_cache(store: Store) -> None:
    runtime.configure(store=store, mode="strict")
    cfg = {"TM": 64, "TN": 64, "TK": 32, "num_ctas": 1}
    record_for(store, "matmul", cfg)
    key = put_cubin(store, "matmul", cfg)
    res = resolve("matmul")
    assert res.config == cfg and res.config_from == "cache" and res.cubin_from == "cache"
    assert res.compile_key == key and res.grid == (64, 64)
    # the second resolution comes from memory, not the store
    assert resolve("matmul").config_from == "memory"
    assert KERNELS["matmul"].runtime.provenance()["misses"] == {}


def test_default_mode_falls_back_and_counts_once_per_key(store: Store, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    record = tmp_path / "misses.jsonl"
    runtime.configure(store=store, mode="default", record=record)
    with caplog.at_level("WARNING", logger="ctbuild.runtime"):
        for _ in range(3):
            res = resolve("rmsnorm")
    tuned = KERNELS["rmsnorm"]
    assert res.config == tuned.default_config(tuned.workloads[0])
    assert res.config_from == "default" and res.cubin_from == "jit"
    misses = tuned.runtime.provenance()["misses"]
    assert misses["tuning"] == 1  # remembered after the first miss (no repeated lookups)
    assert misses["cubin"] == 3
    logged = [r for r in caplog.records if "no CUBIN" in r.getMessage()]
    assert len(logged) == 1  # logged once per key
    lines = [json.loads(s) for s in record.read_text().splitlines()]
    assert len(lines) == 1  # one distinct (kernel, workload, arch)
    assert set(lines[0]) == {"kernel", "workload", "arch"}
    assert lines[0]["kernel"] == "rmsnorm" and lines[0]["arch"] == "sm_90"
    w = {k: spec_from_json(v) for k, v in lines[0]["workload"].items()}
    assert list(w) == list(tuned.params)
    assert w["X"].shape == (4096, 4096) and w["X"].dtype == "float16" and w["X"].align >= 16
    assert w["eps"].dtype == "float32"
    # the recorded workload plans to the same tuning key as the call
    assert tuned.tuning_key(Workload(w)) == tuned.tuning_key(tuned.workloads[0])


def test_record_file_is_not_repeated_across_processes(store: Store, tmp_path: Path) -> None:
    record = tmp_path / "misses.jsonl"
    runtime.configure(store=store, record=record)
    resolve("silu_mul")
    runtime.configure(store=store, record=record)  # a new context: as another process
    resolve("silu_mul")
    assert len(record.read_text().splitlines()) == 1
    tuned = KERNELS["silu_mul"]
    tuned.runtime.resolve(host_tensors(tuned.workloads[1], values=False), arch="sm_90", gpu=GPU)
    assert len(record.read_text().splitlines()) == 2


def test_disable_autotune_ignores_records(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = {"TILE": 512, "occupancy": 8}
    record_for(store, "silu_mul", cfg)
    runtime.configure(store=store)
    assert resolve("silu_mul").config == cfg
    monkeypatch.setenv("CTBUILD_DISABLE_AUTOTUNE", "1")
    runtime.configure(store=store, mode="default")
    res = resolve("silu_mul")
    assert res.config == {"TILE": 1024, "occupancy": 2} and res.config_from == "disabled"
    assert KERNELS["silu_mul"].runtime.provenance()["misses"].get("tuning", 0) == 0


@pytest.mark.parametrize("cfg", [{"TILE": 333, "occupancy": 2},
                                 {"TILE": [1024], "occupancy": {"a": 2}}, [1, 2], "x", 5, True])
def test_stale_record_outside_the_space_is_a_miss(store: Store, cfg: Any) -> None:
    """A record naming a config the space does not hold (stale, or from a hostile shared
    cache: values no config has, or no config at all) is a miss, served by the default."""
    key = record_for(store, "silu_mul", {"TILE": 333, "occupancy": 2})
    # as a hostile writer of a shared cache would, past the store's own checks
    store.namespaces.tuning.set(key, json.dumps({
        "kernel": "silu_mul", "arch": "sm_90", "gpu": GPU, "config": cfg, "compile_key": "k" * 32,
        "by_class": {"N:n": {"config": cfg}}}))
    runtime.configure(store=store, mode="default")
    res = resolve("silu_mul")
    assert res.config_from == "default"


def test_env_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CTBUILD_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("CTBUILD_MODE", "STRICT")
    monkeypatch.setenv("CTBUILD_RECORD", str(tmp_path / "r.jsonl"))
    runtime.reset()
    try:
        ctx = runtime.context()
        assert ctx.mode == "strict" and ctx.cache_dir == tmp_path / "c"
        assert ctx.settings.record == tmp_path / "r.jsonl"
        assert ctx.settings.max_layouts == 4096
        monkeypatch.setenv("CTBUILD_MODE", "sometimes")
        with pytest.raises(RuntimeConfigError, match="CTBUILD_MODE"):
            runtime.configure()
        monkeypatch.setenv("CTBUILD_MODE", "strict")
        monkeypatch.setenv("CTBUILD_MAX_LAYOUTS", "20000")
        assert runtime.configure().settings.max_layouts == 20000
        for bad in ("lots", "8", "1e6", str(1 << 21)):
            monkeypatch.setenv("CTBUILD_MAX_LAYOUTS", bad)
            with pytest.raises(RuntimeConfigError, match="CTBUILD_MAX_LAYOUTS=.* from 16 to"):
                runtime.configure()
    finally:
        runtime.reset()


def test_no_toolchain_in_cache_means_every_cubin_misses(tmp_path: Path) -> None:
    runtime.configure(store=Store(tmp_path / "empty"), mode="strict")
    try:
        with pytest.raises(CacheMissError, match="no toolchain recorded"):
            resolve("matmul")
    finally:
        runtime.reset()


def test_host_tensors_and_bad_arguments_name_the_kernel(store: Store) -> None:
    runtime.configure(store=store)
    tuned = KERNELS["matmul"]
    args = host_tensors(tuned.workloads[0], values=False)
    with pytest.raises(runtime.KernelCallError, match="kernel 'matmul'.*'A' is a cpu tensor"):
        tuned(*args)
    with pytest.raises(TypeError, match="kernel 'matmul'"):
        tuned(args[0], args[1])
    with pytest.raises(TypeError, match="kernel 'matmul'"):
        tuned(*args, D=args[0])
    with pytest.raises(runtime.KernelCallError, match="kernel 'matmul'.*no CUDA tensor"):
        tuned(1, 2, 3)
