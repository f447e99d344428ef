"""A damaged cache: one flipped byte in an SQLite page or in a CUBIN.

`cache stats` reports the damaged index, `cache verify --repair` rebuilds it, `precompile`
rebuilds what was lost and re-compiles a corrupt CUBIN it would otherwise skip; the runtime
falls back in default mode and says the cache is damaged in strict mode. Real tileiras, real Ray,
real SQLite files."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ctbuild.cache import Store

REPO = Path(__file__).resolve().parents[2]
PROJECT = REPO / "tests" / "fixtures" / "robust_project"


def flip_table_page(db: Path) -> None:
    """Flip the page-type byte of the Cache table's root page (one byte; every row on it unreadable)."""
    with sqlite3.connect(db) as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'Cache'").fetchone()[0]
        page_size = con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    offset = (root - 1) * page_size + (100 if root == 1 else 0)
    with open(db, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def ctbuild(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CTBUILD_CACHE_DIR"}
    env.update({"PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"})
    return subprocess.run([sys.executable, "-m", "ctbuild", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def no_traceback(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    return proc


def test_corrupt_cubin_and_damaged_index_are_found_repaired_and_rebuilt(tmp_path):
    project = tmp_path / "project"
    shutil.copytree(PROJECT, project)
    cache = tmp_path / "cache"
    build = ("precompile", "--cache", str(cache), "--workers", "1")
    first = no_traceback(ctbuild(*build, cwd=project))
    assert first.returncode == 0 and "2 compiled, 0 cached" in first.stdout, first.stdout + first.stderr

    # Case 2: a CUBIN silently corrupted on disk is rebuilt, not counted as cached.
    (blob,) = sorted(cache.glob("blobs/??/??/*.val"))[:1]
    flip_byte(blob)
    again = no_traceback(ctbuild(*build, cwd=project))
    assert again.returncode == 0 and "1 compiled, 1 cached" in again.stdout, again.stdout + again.stderr
    assert no_traceback(ctbuild("cache", "verify", "--cache", str(cache), cwd=project)).returncode == 0

    # Case 1: one flipped byte in compile/cache.db.
    flip_table_page(cache / "compile" / "cache.db")
    stats = no_traceback(ctbuild("cache", "stats", "--cache", str(cache), cwd=project))
    assert stats.returncode == 1 and "DAMAGED" in stats.stdout and "verify --repair" in stats.stdout, stats.stdout
    verify = no_traceback(ctbuild("cache", "verify", "--cache", str(cache), cwd=project))
    assert verify.returncode == 1 and "damaged_index: compile" in verify.stdout, verify.stdout + verify.stderr
    repair = no_traceback(ctbuild("cache", "verify", "--repair", "--cache", str(cache), cwd=project))
    assert "rebuilt the compile index" in repair.stdout, repair.stdout + repair.stderr
    assert list((cache / "quarantine").glob("compile.*.cache.db")), "the damaged index is kept for inspection"
    assert no_traceback(ctbuild("cache", "stats", "--cache", str(cache), cwd=project)).returncode == 0
    with Store(cache) as store:
        lost = 2 - store.stats()["compile_entries"]
    assert lost == 2  # both rows lived on the flipped page

    rebuilt = no_traceback(ctbuild(*build, cwd=project))
    assert rebuilt.returncode == 0 and f"{lost} compiled" in rebuilt.stdout, rebuilt.stdout + rebuilt.stderr
    final = no_traceback(ctbuild("cache", "verify", "--cache", str(cache), cwd=project))
    assert final.returncode == 0 and "ok" in final.stdout
    with Store(cache) as store:
        assert store.stats()["compile_entries"] == 2


def test_store_reads_on_a_damaged_index_are_counted_misses(tmp_path):
    root = tmp_path / "c"
    with Store(root) as store:
        store.put_compile("k", b"cubin" * 100, symbol="s", meta={"kernel": "x", "arch": "sm_90"})
        store.put_tuning("t", {"kernel": "x", "arch": "sm_90", "compile_key": "k"})
    flip_table_page(root / "compile" / "cache.db")
    seen = []
    store = Store(root, on_damage=seen.append)
    assert store.get_compile("k") is None and not store.has_compile("k")
    assert store.get_tuning("t") is not None  # other namespaces still serve
    assert store.damage and len(seen) == 1  # reported once
    stats = store.stats()
    assert stats["read_errors"] >= 2 and "compile" in stats["damaged"]


def test_stats_on_an_unrelated_directory_writes_nothing(tmp_path):
    other = tmp_path / "photos"
    other.mkdir()
    (other / "a.jpg").write_bytes(b"x")
    proc = no_traceback(ctbuild("cache", "stats", "--cache", str(other), cwd=tmp_path))
    assert proc.returncode == 2 and "not a ctbuild cache" in proc.stderr
    assert sorted(p.name for p in other.iterdir()) == ["a.jpg"]
    cache = tmp_path / "cache"
    Store(cache).close()
    before = sorted(p.name for p in cache.rglob("*"))
    assert no_traceback(ctbuild("cache", "stats", "--cache", str(cache), cwd=tmp_path)).returncode == 0
    assert sorted(p.name for p in cache.rglob("*")) == before


def test_has_compile_skips_only_intact_cubins(tmp_path):
    root = tmp_path / "c"
    with Store(root) as store:
        store.put_compile("k", b"cubin" * 100, symbol="s", meta={"kernel": "x", "arch": "sm_90"})
    (blob,) = root.glob("blobs/??/??/*.val")
    flip_byte(blob)
    with Store(root) as store:  # a new process's view: nothing verified yet
        assert not store.has_compile("k")
        assert store.stats()["digest_failures"] == 1 and list((root / "quarantine").iterdir())


def test_ls_shows_the_config_of_each_entry(tmp_path):
    root = tmp_path / "c"
    with Store(root) as store:
        for occupancy in (1, 2):  # differ only in a hint
            store.put_compile(f"key-{occupancy}", b"cubin", symbol="s",
                              meta={"kernel": "x", "arch": "sm_90", "config": {"TILE": 64, "occupancy": occupancy}})
    env = {k: v for k, v in os.environ.items() if k != "CTBUILD_CACHE_DIR"}
    env["PYTHONPATH"] = str(REPO)
    text = subprocess.run([sys.executable, "-m", "ctbuild.cache", "ls", "--cache", str(root)], env=env,
                          capture_output=True, text=True, timeout=60).stdout
    assert "TILE=64,occupancy=1" in text and "TILE=64,occupancy=2" in text
    out = subprocess.run([sys.executable, "-m", "ctbuild.cache", "ls", "--cache", str(root), "--json"], env=env,
                         capture_output=True, text=True, timeout=60).stdout
    assert sorted(c["config"]["occupancy"] for c in json.loads(out)["compile"]) == [1, 2]


@pytest.fixture
def examples():
    pytest.importorskip("torch")
    from gpu_runtime_examples import load_examples
    return load_examples()


def resolve(kernels, name: str):
    from gpu_runtime_examples import host_tensors
    tuned = kernels[name]
    return tuned.runtime.resolve(host_tensors(tuned.workloads[0], values=False), arch="sm_90",
                                 gpu="NVIDIA H100 80GB HBM3")


def test_runtime_on_a_damaged_cache_falls_back_in_default_and_says_so_in_strict(runtime_store, examples):
    from ctbuild import runtime
    from ctbuild.serve.miss_policy import CacheMissError
    from ctbuild.signature import derive_signature
    from ctbuild.space import Config
    tuned = examples["silu_mul"]
    cfg = tuned.default_config(tuned.workloads[0])
    runtime.configure(store=runtime_store, mode="strict")
    sig = derive_signature(tuned.kernel, tuned.kernel_args(Config(cfg.to_json(), tuned.name), tuned.workloads[0]))
    key = runtime.context().source.key_for(tuned, cfg, sig, "sm_90")
    runtime_store.put_compile(key, b"\x7fELF fake cubin", symbol=sig.symbol, meta={"kernel": tuned.name})
    root = runtime_store.path
    runtime_store.close()
    flip_table_page(root / "compile" / "cache.db")

    runtime.configure(store=Store(root), mode="default", disable_autotune=True)
    res = resolve(examples, "silu_mul")
    assert res.cubin_from == "jit" and res.compile_key == key  # a miss, not an exception

    runtime.configure(store=Store(root), mode="strict", disable_autotune=True)
    with pytest.raises(CacheMissError) as err:
        resolve(examples, "silu_mul")
    assert "DAMAGED" in str(err.value) and f"ctbuild cache verify --repair --cache {root}" in str(err.value)


def test_unknown_cuda_tile_variable_at_serve_time(runtime_store, examples, monkeypatch, caplog):
    from ctbuild import runtime
    from ctbuild.serve.miss_policy import RuntimeConfigError
    monkeypatch.setenv("CUDA_TILE_SOMETHING_NEW", "1")
    runtime.configure(store=runtime_store, mode="default")
    for _ in range(3):  # every call works: default config, JIT
        res = resolve(examples, "silu_mul")
        assert res.config_from == "default" and res.cubin_from == "jit"
    assert "CUDA_TILE_SOMETHING_NEW" in caplog.text
    with pytest.raises(RuntimeConfigError, match="CUDA_TILE_SOMETHING_NEW.*refuses to serve"):
        runtime.configure(store=runtime_store, mode="strict")
