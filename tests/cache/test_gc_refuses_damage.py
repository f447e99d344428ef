"""`ctbuild cache gc` refuses, removing nothing, where orphans cannot be told from entries: a
compile index that was deleted (directory gone, emptied, or its file truncated) while CUBINs are
stored, and an index that fails its integrity check. Everything runs on real caches through the
CLI; an intact cache still has its genuine orphans collected."""
from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

import ctbuild.cache.__main__ as cache_main
from ctbuild.cache import Store

KERNEL = {"kernel": "kern", "arch": "sm_90"}


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cache_main.main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def build(root: Path) -> tuple[dict[str, bytes], str]:
    """Four compile entries and one genuine orphan blob; returns the CUBINs and the orphan's digest."""
    cubins = {f"k{i}": os.urandom(3000 + i) for i in range(4)}
    with Store(root) as store:
        for key, cubin in cubins.items():
            store.put_compile(key, cubin, symbol="s", meta=dict(KERNEL))
        orphan = store.put_blob(os.urandom(500))
    return cubins, orphan


def blobs_left(root: Path) -> int:
    with Store(root, readonly=True) as store:
        return store.stats()["blobs"]


@pytest.mark.parametrize("loss", ["compile/ deleted", "compile/ emptied", "index truncated"])
def test_gc_refuses_when_the_compile_index_is_gone(tmp_path, capsys, loss):
    cubins, _ = build(tmp_path)
    if loss == "compile/ deleted":
        shutil.rmtree(tmp_path / "compile")
    elif loss == "compile/ emptied":
        for path in (tmp_path / "compile").iterdir():
            path.unlink()
    else:
        (tmp_path / "compile" / "cache.db").write_bytes(b"")

    code, out = cli(capsys, "gc", "--orphan-grace", "0", "--cache", str(tmp_path))
    (line,) = out.splitlines()
    assert code == 2 and "compile/cache.db is gone" in line and "5 CUBINs" in line, out
    assert "nothing was removed" in line and "verify --repair` cannot bring deleted entries back" in line, out
    assert blobs_left(tmp_path) == 5  # every CUBIN, the orphan too: it cannot be told apart

    # writing the entries again (as precompile would) makes the orphan tellable, and gc takes only it
    with Store(tmp_path) as store:
        for key, cubin in cubins.items():
            store.put_compile(key, cubin, symbol="s", meta=dict(KERNEL))
    code, out = cli(capsys, "gc", "--orphan-grace", "0", "--cache", str(tmp_path))
    assert code == 0 and "removed 1 orphan blobs" in out, out
    assert blobs_left(tmp_path) == 4


def test_gc_refuses_a_damaged_index_until_it_is_repaired(tmp_path, capsys):
    cubins, orphan = build(tmp_path)
    index = tmp_path / "compile" / "cache.db"
    with sqlite3.connect(index) as con:  # an index page SQLite's integrity check flags, rows still readable
        (page,) = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'Cache_key_raw'").fetchone()
        page_size = con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    with open(index, "r+b") as f:
        f.seek((page - 1) * page_size + 8)
        f.write(b"\xff" * 64)

    code, out = cli(capsys, "gc", "--orphan-grace", "0", "--cache", str(tmp_path))
    (line,) = out.splitlines()
    assert code == 2 and "the compile index is damaged" in line and "nothing was removed" in line, out
    assert f"`ctbuild cache verify --repair --cache {tmp_path}`" in line, out
    assert blobs_left(tmp_path) == 5

    cli(capsys, "verify", "--repair", "--cache", str(tmp_path))
    code, out = cli(capsys, "gc", "--orphan-grace", "0", "--cache", str(tmp_path))
    assert code == 0 and "removed 1 orphan blobs" in out, out
    with Store(tmp_path, readonly=True) as store:
        assert not store.has_blob(orphan)
        assert all((hit := store.get_compile(key)) is not None and hit.cubin == cubin
                   for key, cubin in cubins.items())
