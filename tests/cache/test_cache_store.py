"""Store API on a real on-disk cache: round trips, integrity, refusal of pickles, eviction."""

import logging
import os
import time
from pathlib import Path

import diskcache
import pytest

from ctbuild.cache import CacheError, CompileHit, Store, digest_of
from ctbuild.cache.safe_disk import SafeDisk


def cubin(n: int, size: int = 10_000) -> bytes:
    return (f"cubin-{n}-".encode() * (size // 8 + 1))[:size]


def meta(kernel: str = "matmul", arch: str = "sm_90") -> dict:
    return {"kernel": kernel, "kernel_fp": "fp1", "arch": arch, "toolchain": "tc1", "compile_seconds": 0.25,
            "config": {"tile_m": 64}, "workload": "w1"}


def blob_files(root: Path) -> list[Path]:
    return sorted((root / "blobs").glob("??/??/*.val"))


def test_round_trip_and_dedup(tmp_path):
    with Store(tmp_path / "c") as store:
        d1 = store.put_compile("k1", cubin(1), symbol="sym1", meta=meta())
        d2 = store.put_compile("k2", cubin(1), symbol="sym2", meta=meta())  # same bytes, another key
        assert d1 == d2 == digest_of(cubin(1))
        assert len(blob_files(store.path)) == 1
        hit = store.get_compile("k1")
        assert isinstance(hit, CompileHit)
        assert (hit.key, hit.cubin, hit.symbol) == ("k1", cubin(1), "sym1")
        assert hit.meta["config"] == {"tile_m": 64} and hit.meta["digest"] == d1 and hit.meta["size"] == 10_000
        assert store.has_compile("k1") and not store.has_compile("nope")
        assert store.get_compile("nope") is None
        assert store.get_blob(d1) == cubin(1) and store.get_blob("0" * 32) is None
        store.put_tuning("t1", {"kernel": "matmul", "arch": "sm_90", "compile_key": "k1", "config": {"tile_m": 64}})
        assert store.get_tuning("t1")["compile_key"] == "k1" and "created" in store.get_tuning("t1")
        store.put_toolchain("tc1", {"tileiras": "13.4.92"})
        assert store.get_toolchain("tc1") == {"tileiras": "13.4.92"}
        assert store.toolchains() == {"tc1": {"tileiras": "13.4.92"}}
        assert dict(store.compile_entries()).keys() == {"k1", "k2"}
        assert [k for k, _ in store.tuning_records()] == ["t1"]
        stats = store.stats()
        assert (stats["blobs"], stats["compile_entries"], stats["tuning_records"], stats["toolchains"]) == (1, 2, 1, 1)
        assert stats["bytes"] == 10_000 and stats["digest_failures"] == 0 and stats["readonly"] is False
        assert store.verify() == {"ok": True, "problems": [],
                                  "checked": {"blobs": 1, "compile": 2, "tuning": 1, "toolchains": 1}}
        assert store.remove_kernel("matmul", "k2") == 1
        assert store.remove_kernel("matmul") == 2  # k1 and t1
        assert store.get_compile("k1") is None and store.get_tuning("t1") is None


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path):
    with Store(tmp_path) as store:
        with pytest.raises(ValueError, match="empty CUBIN"):
            store.put_compile("k", b"", symbol="s", meta={})
        with pytest.raises(ValueError, match="JSON"):
            store.put_compile("k", b"x", symbol="s", meta={"bad": object()})
        with pytest.raises(ValueError, match="compile_key"):
            store.put_tuning("t", {"kernel": "k", "arch": "sm_90"})
        # what a reader would skip is not stored (fields_problem, shared with import and readers)
        with pytest.raises(ValueError, match="field 'arch' is \\['sm_90'\\], not text"):
            store.put_compile("k", b"x", symbol="s", meta={"kernel": "k", "arch": ["sm_90"]})
        with pytest.raises(ValueError, match="field 'config' is 'x', not a JSON object"):
            store.put_tuning("t", {"kernel": "k", "arch": "sm_90", "compile_key": "c", "config": "x"})
        assert store.stats()["blobs"] == 0 and not blob_files(tmp_path)
        assert store.get_tuning("t") is None


def test_flipped_byte_is_a_counted_logged_miss_and_quarantined(tmp_path, caplog):
    store = Store(tmp_path)
    digest = store.put_compile("k", cubin(7), symbol="s", meta=meta())
    (blob,) = blob_files(tmp_path)
    data = bytearray(blob.read_bytes())
    data[5000] ^= 0x01
    blob.write_bytes(bytes(data))

    with caplog.at_level(logging.ERROR, logger="ctbuild.cache"):
        assert store.get_compile("k") is None
    assert store.stats()["digest_failures"] == 1
    assert [r for r in caplog.records if digest in r.getMessage()]
    assert not store.has_compile("k")  # quarantined: the next precompile rebuilds it
    (bad,) = (tmp_path / "quarantine").iterdir()
    assert bad.read_bytes() == bytes(data)
    store.put_compile("k", cubin(7), symbol="s", meta=meta())
    assert store.get_compile("k").cubin == cubin(7)


def test_corrupt_blob_in_read_only_store_logged_once_counted_each_time(tmp_path, caplog):
    with Store(tmp_path) as store:
        digest = store.put_compile("k", cubin(3), symbol="s", meta=meta())
    (blob,) = blob_files(tmp_path)
    blob.write_bytes(b"X" + blob.read_bytes()[1:])
    ro = Store(tmp_path, readonly=True)
    with caplog.at_level(logging.ERROR, logger="ctbuild.cache"):
        assert ro.get_compile("k") is None
        assert ro.get_blob(digest) is None
    assert ro.stats()["digest_failures"] == 2
    assert len([r for r in caplog.records if digest in r.getMessage() and "does not match" in r.getMessage()]) == 1
    result = ro.verify()
    assert not result["ok"]
    assert {p["kind"] for p in result["problems"]} == {"corrupt_blob", "missing_blob"}
    assert not (tmp_path / "quarantine").exists()


class Evil:
    """Unpickling this creates a marker file: proof that something was unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_planted_pickles_are_refused_and_never_unpickled(tmp_path):
    root = tmp_path / "c"
    marker = tmp_path / "UNPICKLED"
    with Store(root) as store:
        store.put_compile("good", cubin(1), symbol="s", meta=meta())
        store.put_tuning("t-good", {"kernel": "matmul", "arch": "sm_90", "compile_key": "good"})
    with diskcache.Cache(str(root / "compile")) as plain:  # plain diskcache pickles what is not bytes/str
        plain.set("evil-inline", Evil(marker))
        plain.set("evil-file", [Evil(marker), b"x" * 100_000])
        plain.set(("pickled", "key"), "value")
    with diskcache.Cache(str(root / "tuning")) as plain:
        plain.set("t-evil", {"kernel": "matmul", "arch": "sm_90", "compile_key": Evil(marker)})
    with diskcache.Cache(str(root / "blobs")) as plain:
        plain.set(digest_of(b"x"), Evil(marker))

    store = Store(root)
    assert store.get_compile("evil-inline") is None
    assert store.get_compile("evil-file") is None
    assert store.get_tuning("t-evil") is None
    assert store.get_blob(digest_of(b"x")) is None
    assert [k for k, _ in store.compile_entries()] == ["good"]
    assert [k for k, _ in store.tuning_records()] == ["t-good"]
    assert store.get_compile("good").cubin == cubin(1)
    result = store.verify()
    kinds = sorted(p["kind"] for p in result["problems"])
    assert kinds == ["bad_key", "unsafe_value", "unsafe_value", "unsafe_value", "unsafe_value"]
    assert store.stats()["refused_values"] >= 4
    repaired = store.verify(repair=True)
    assert repaired["repaired"] == 5  # the pickled-key row is deleted by its rowid
    assert store.verify()["ok"]
    assert not marker.exists()


def test_safe_disk_refuses_to_write_anything_that_would_be_pickled(tmp_path):
    with diskcache.Cache(str(tmp_path), disk=SafeDisk) as cache:
        with pytest.raises(TypeError, match="bytes or str"):
            cache.set("k", {"a": 1})
        with pytest.raises(TypeError, match="keys must be str"):
            cache.set(("a",), "v")
        assert len(cache) == 0


def _puts(store: Store, n: int) -> None:
    for i in range(n):
        store.put_compile(f"e{i}", cubin(i), symbol="s", meta=meta())
        time.sleep(0.01)


def test_gc_evicts_least_recently_used_and_keeps_tuned_winners(tmp_path):
    store = Store(tmp_path, size_limit=25_000)
    _puts(store, 5)  # 5 x 10_000 bytes
    store.put_tuning("t1", {"kernel": "matmul", "arch": "sm_90", "compile_key": "e1"})
    assert store.get_compile("e0") is not None  # e0 becomes the most recently used
    assert store.has_compile("e2")  # has_compile is not an access

    result = store.gc()
    assert [k for k, _ in store.compile_entries()] == ["e0", "e1"]
    assert (result["evicted_entries"], result["evicted_blobs"], result["bytes_after"],
            result["limit_met"]) == (3, 3, 20_000, True)

    result = store.gc(size_limit=5_000)
    assert [k for k, _ in store.compile_entries()] == ["e1"] and not result["limit_met"]
    assert store.get_tuning("t1") is not None

    result = store.gc(size_limit=5_000, evict_tuned=True)
    assert list(store.compile_entries()) == [] and result["dropped_tuning_records"] == 1 and result["limit_met"]
    assert store.get_tuning("t1") is None
    assert store.verify()["ok"] and store.stats()["bytes"] == 0 and not blob_files(tmp_path)


def test_gc_shared_blobs_and_orphans(tmp_path):
    store = Store(tmp_path)
    store.put_compile("a", cubin(1), symbol="s", meta=meta("ka"))
    store.put_compile("b", cubin(1), symbol="s", meta=meta("kb"))
    store.put_compile("c", cubin(2), symbol="s", meta=meta("kc"))
    assert store.remove_kernel("ka") == 1 and store.remove_kernel("kc") == 1
    assert store.gc()["orphan_blobs_removed"] == 0  # young orphans may be puts in flight
    result = store.gc(orphan_grace_s=0)
    assert result["orphan_blobs_removed"] == 1  # cubin(2); cubin(1) is still used by "b"
    assert store.get_compile("b").cubin == cubin(1) and len(blob_files(tmp_path)) == 1
    stray = tmp_path / "blobs" / "ab" / "cd" / "0123.val"  # what a writer killed before commit leaves
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"partial")
    os.utime(stray, (0, 0))
    assert store.gc()["stray_files_removed"] == 1 and not stray.exists()


def test_unknown_layout_version_is_refused(tmp_path):
    Store(tmp_path).close()
    (tmp_path / "ctbuild-cache.json").write_text('{"format": "ctbuild-cache", "version": 99}')
    with pytest.raises(CacheError, match="version"):
        Store(tmp_path)
