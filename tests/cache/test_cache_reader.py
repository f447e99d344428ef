"""The serving read path (`ctbuild.serve.cache_reader`): the cache's files read without diskcache,
with the store's checks (digests, pickles, required fields, damage)."""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from conftest import python_json
from test_robustness_cache import flip_table_page

from ctbuild.cache import Store
from ctbuild.serve.cache_reader import CacheReader

TC = "e" * 32
CUBIN = b"\x7fELF" + bytes(range(256)) * 8


def _filled(root: Path) -> Store:
    store = Store(root)
    store.put_toolchain(TC, {"cuda_tile": "1.7.0", "env": {}})
    store.put_compile("k1", CUBIN, symbol="sym1", meta={"kernel": "x", "compile_seconds": 2.5})
    store.put_tuning("t1", {"kernel": "x", "arch": "sm_90", "compile_key": "k1", "seconds": 9.0})
    return store


def test_layout_constants_agree_with_the_cache_package() -> None:
    from ctbuild.cache import entries, layout
    from ctbuild.serve import cache_reader
    assert (cache_reader.LAYOUT_FILE, cache_reader.LAYOUT) == (layout.LAYOUT_FILE, layout.LAYOUT)
    assert cache_reader.COMPILE_REQUIRED == entries.COMPILE_REQUIRED
    assert cache_reader.TUNING_REQUIRED == entries.TUNING_REQUIRED


def test_reads_what_the_store_wrote(tmp_path: Path) -> None:
    _filled(tmp_path / "c")
    reader = CacheReader.open(tmp_path / "c")
    assert reader is not None and not reader.readonly
    assert reader.toolchains() == {TC: {"cuda_tile": "1.7.0", "env": {}}}
    assert reader.get_tuning("t1")["compile_key"] == "k1" and reader.get_tuning("nope") is None
    assert reader.has_compile("k1") and not reader.has_compile("k2")
    hit = reader.get_compile("k1")
    assert hit is not None and (hit.cubin, hit.symbol) == (CUBIN, "sym1")
    assert [k for k, _ in reader.tuning_records()] == ["t1"]
    assert CacheReader.open(tmp_path / "none") is None  # no cache yet: the store creates it


def test_a_corrupt_cubin_is_a_miss_and_quarantined(tmp_path: Path) -> None:
    _filled(tmp_path / "c").close()
    blob = next((tmp_path / "c" / "blobs").rglob("*.val"))
    blob.write_bytes(blob.read_bytes()[:-1] + b"\x00")
    reader = CacheReader.open(tmp_path / "c")
    assert reader is not None
    assert reader.get_compile("k1") is None and not reader.has_compile("k1")
    assert list((tmp_path / "c" / "quarantine").rglob("*"))  # the store moved it aside


def test_the_cubin_a_resolve_checked_is_launched_from_that_read(tmp_path: Path) -> None:
    """Resolving checks the CUBIN it will serve (`has_compile` reads and hashes its blob); the
    launch's `get_compile` right after serves those verified bytes instead of reading and
    hashing the file again. Only the blob verified last is held: another's damage is found."""
    store = _filled(tmp_path / "c")
    store.put_compile("k2", CUBIN[::-1], symbol="sym2", meta={"kernel": "x"})
    store.close()
    reader = CacheReader.open(tmp_path / "c")
    assert reader is not None and reader.has_compile("k1")
    blobs = list((tmp_path / "c" / "blobs").rglob("*.val"))
    assert len(blobs) == 2
    for blob in blobs:  # both damaged on disk after the check
        blob.write_bytes(b"\x00" * 8)
    hit = reader.get_compile("k1")
    assert hit is not None and (hit.cubin, hit.symbol) == (CUBIN, "sym1")
    assert reader.get_compile("k2") is None


def test_pickled_and_incomplete_entries_are_refused(tmp_path: Path, caplog) -> None:
    import diskcache
    _filled(tmp_path / "c").close()
    with diskcache.Cache(str(tmp_path / "c" / "tuning")) as raw:
        raw.set("pickled", {"kernel": "x", "arch": "sm_90", "compile_key": "k1"})
        raw.set("partial", json.dumps({"kernel": "x"}))
    reader = CacheReader.open(tmp_path / "c")
    assert reader is not None
    with caplog.at_level(logging.ERROR):
        assert reader.get_tuning("pickled") is None and reader.get_tuning("partial") is None
    assert "pickle" in caplog.text and "missing" in caplog.text


def test_a_damaged_index_is_reported_once_and_strict_says_so(tmp_path: Path, caplog) -> None:
    from ctbuild import runtime
    from ctbuild.serve.misses import damage_note
    _filled(tmp_path / "c").close()
    flip_table_page(tmp_path / "c" / "compile" / "cache.db")
    try:
        ctx = runtime.configure(cache_dir=tmp_path / "c", mode="strict")
        assert isinstance(ctx.store, CacheReader)
        with caplog.at_level(logging.ERROR):
            assert ctx.store.get_compile("k1") is None and ctx.store.get_compile("k1") is None
        assert caplog.text.count("is damaged") == 1 and ctx.store.damage is not None
        assert "DAMAGED" in damage_note(ctx.cache_dir)
    finally:
        runtime.reset()


WARM = r"""
import json, sys
sys.path[:0] = [{root!r}, {examples!r}]
import torch
from demo_kernels.rmsnorm import rmsnorm
x = torch.zeros(4096, 4096, dtype=torch.float16)
res = rmsnorm.runtime.resolve((x, torch.zeros(4096, dtype=torch.float16), x.clone(), 1e-6),
                              arch="sm_90", gpu="NVIDIA H100 80GB HBM3")
print(json.dumps({{"from": res.config_from, "store": type(rmsnorm.runtime.ctx.store).__name__,
                  "mods": sorted(m for m in sys.modules if m.split(".")[0] in
                                 ("diskcache", "cache"))}}))
"""


def test_serving_from_a_built_cache_imports_no_diskcache(tmp_path: Path) -> None:
    """A strict first resolution against a real cache reads its record without the cache
    package (a fresh interpreter: what a service pays on its first call)."""
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "examples"))
    from conftest import RUNTIME_TOOLCHAIN
    from gpu_runtime_examples import host_tensors, load_examples

    from ctbuild.keys import record_key_for
    tuned = load_examples()["rmsnorm"]
    store = Store(tmp_path / "c")
    store.put_toolchain(RUNTIME_TOOLCHAIN, {"cuda_tile": "1.7.0", "env": {}, "created": 1.0})
    w = tuned.bind(*host_tensors(tuned.workloads[0]))
    cfg = tuned.default_config(w).to_json()
    from ctbuild.serve.live_args import workload_spec
    key = record_key_for(tuned, tuned.tuning_key(workload_spec(tuned, w)), "sm_90",
                         "NVIDIA H100 80GB HBM3", RUNTIME_TOOLCHAIN)
    from ctbuild.serve.served_kernel import CubinSource
    from ctbuild.signature import derive_signature
    from ctbuild.space import Config
    config = Config(cfg, "rmsnorm")
    sig = derive_signature(tuned.kernel, tuned.kernel_args(config, workload_spec(tuned, w)))
    ckey = CubinSource(store, RUNTIME_TOOLCHAIN).key_for(tuned, config, sig, "sm_90")
    store.put_compile(ckey, CUBIN, symbol=sig.symbol, meta={"kernel": "rmsnorm"})
    store.put_tuning(key, {"kernel": "rmsnorm", "arch": "sm_90", "compile_key": ckey,
                           "config": cfg, "format": 1})
    store.close()
    script = WARM.format(root=str(root), examples=str(root / "examples"))
    env = {"PATH": "/usr/bin:/bin", "CTBUILD_CACHE_DIR": str(tmp_path / "c"),
           "CTBUILD_MODE": "strict", "HOME": str(tmp_path)}
    got = python_json(script, env=env, cwd=tmp_path)
    assert got == {"from": "cache", "store": "CacheReader", "mods": []}
