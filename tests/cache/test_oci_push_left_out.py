"""`ctbuild cache push` says what its image leaves out, as `export` does (the image's layer is
the export's bundle): entries whose CUBIN is corrupt, tuning records naming them, stored values
that cannot be read. It pushes what is intact and exits 1, never a silent success. Pushed to an
OCI image layout on disk (no registry needed) and pulled back from it."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import ctbuild.cache.__main__ as cache_main
from ctbuild.cache import Store

KERNEL = {"kernel": "kern", "arch": "sm_90"}


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cache_main.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def damaged_cache(root: Path) -> None:
    """k0 and k2 intact; k1's CUBIN corrupt and t1 naming it; one compile value that is not JSON."""
    with Store(root) as store:
        digests = {f"k{i}": store.put_compile(f"k{i}", os.urandom(1000 + i), symbol="s", meta=dict(KERNEL))
                   for i in range(3)}
        store.put_tuning("t0", {**KERNEL, "compile_key": "k0"})
        store.put_tuning("t1", {**KERNEL, "compile_key": "k1"})
        store.namespaces.compile.set("garbled", "{not json", tag=digests["k2"])
        (row,) = [r for r in store.namespaces.blobs.rows() if r.key == digests["k1"]]
    with open(root / "blobs" / row.filename, "r+b") as f:
        f.write(b"corrupt")


def test_push_names_what_it_left_out_and_exits_1(tmp_path, capsys):
    cache, layout = tmp_path / "cache", tmp_path / "layout"
    damaged_cache(cache)

    code, out, err = cli(capsys, "push", "--cache", str(cache), "--layout", str(layout), "v1")
    first, left_out = out.splitlines()
    assert code == 1 and first.startswith("pushed v1 to ") and "2 compile entries, 1 tuning records" in first, out
    assert left_out == ("left out 2 entries whose CUBIN is missing, corrupt or unreadable, or tuning records "
                        "naming them (k1, t1) and 1 stored values that could not be read or are malformed: "
                        "see `ctbuild cache verify`"), out

    code, out, _ = cli(capsys, "push", "--cache", str(cache), "--layout", str(layout), "--json", "v2")
    result = json.loads(out)
    assert code == 1 and result["skipped"] == ["k1", "t1"] and result["unreadable"] == 1, out

    # what was pushed is whole: the intact entries, pulled back
    code, out, err = cli(capsys, "pull", "v1", "--layout", str(layout), "--cache", str(tmp_path / "dst"),
                         "--arch", "sm_90")
    assert code == 0, err
    with Store(tmp_path / "dst", readonly=True) as store:
        assert {key for key, _ in store.compile_entries()} == {"k0", "k2"}
        assert {key for key, _ in store.tuning_records()} == {"t0"}


def test_push_of_an_intact_cache_exits_0_and_says_nothing_was_left_out(tmp_path, capsys):
    with Store(tmp_path / "cache") as store:
        store.put_compile("k0", os.urandom(1000), symbol="s", meta=dict(KERNEL))
    code, out, _ = cli(capsys, "push", "--cache", str(tmp_path / "cache"), "--layout", str(tmp_path / "l"), "v1")
    assert code == 0 and "left out" not in out and len(out.splitlines()) == 1, out
