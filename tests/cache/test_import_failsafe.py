"""An import that does not finish leaves the cache as it was: entries it replaced are put back,
entries and blobs it added are removed, whether it failed (a file-size limit, a full disk) or
was interrupted (SIGINT). Bad input is refused before anything is written: odd field types in
an unsigned bundle, an unpacked tree with a member too large (never copied). And an export that
leaves entries out says so and exits non-zero."""
from __future__ import annotations

import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

import ctbuild.cache.__main__ as cache_main
from ctbuild.cache import Store

KERNEL = {"kernel": "kern", "arch": "sm_90"}


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """`python -m ctbuild.cache ARGV` in this process: (exit code, stdout + stderr)."""
    code = cache_main.main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def run_import(cache: Path, bundle: Path, *, fsize: int | None = None) -> subprocess.Popen[str]:
    """The import CLI as a process of its own, under a file-size limit if given."""
    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.Popen([sys.executable, "-m", "ctbuild.cache", "import", "--cache", str(cache), str(bundle)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=limit)


def tuned_cache(root: Path, records: int, config: dict) -> Path:
    with Store(root) as store:
        store.put_compile("k0", os.urandom(4000), symbol="s0", meta=dict(KERNEL))
        for i in range(records):
            store.put_tuning(f"tk{i}", {**KERNEL, "compile_key": "k0", "config": config})
    return root


def tunings(root: Path) -> dict[str, dict]:
    with Store(root, readonly=True) as store:
        return {key: record["config"] for key, record in store.tuning_records()}


def test_a_failed_import_puts_back_what_it_replaced(tmp_path):
    target = tuned_cache(tmp_path / "target", 1, {"A": 1})
    source = tuned_cache(tmp_path / "source", 1, {"B": 2})  # tk1's new value, then a record too big to store
    with Store(source) as store:
        store.put_tuning("tk9", {**KERNEL, "compile_key": "k0", "pad": "p" * (3 << 20)})
        store.export_bundle(tmp_path / "b.tgz")
    shutil.copytree(target, tmp_path / "before")

    proc = run_import(target, tmp_path / "b.tgz", fsize=2 << 20)
    out = proc.communicate(timeout=60)[0]

    assert proc.returncode == 2, out
    assert "restored to what it held before" in out and "Traceback" not in out
    assert tunings(target) == tunings(tmp_path / "before") == {"tk0": {"A": 1}}


def test_an_interrupted_import_puts_back_what_it_replaced(tmp_path):
    records = 6000
    target = tuned_cache(tmp_path / "target", records, {"A": 1})
    with Store(tuned_cache(tmp_path / "source", records, {"B": 2})) as store:
        store.put_compile("k1", os.urandom(4000), symbol="s1", meta=dict(KERNEL))  # a blob and entry to add
        store.export_bundle(tmp_path / "b.tar")
    wal = target / "tuning" / "cache.db-wal"
    start = wal.stat().st_size if wal.exists() else 0

    proc = run_import(target, tmp_path / "b.tar")
    deadline = time.monotonic() + 30
    while (not wal.exists() or wal.stat().st_size == start) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)  # until it writes tuning records: some are replaced already
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=60)[0]

    assert proc.returncode == 2, out
    assert "import interrupted" in out and "restored" in out and "Traceback" not in out
    assert tunings(target) == {f"tk{i}": {"A": 1} for i in range(records)}
    with Store(target, readonly=True) as store:
        assert [key for key, _ in store.compile_entries()] == ["k0"]
        assert store.stats()["blobs"] == 1


@pytest.mark.parametrize(("field", "value"), [("size", "big"), ("arch", ["sm_90"]), ("kernel_fp", ["a"]),
                                              ("config", "x"), ("symbol", "s" * 5000)])
def test_import_refuses_fields_of_the_wrong_type(tmp_path, capsys, field, value):
    with Store(tmp_path / "source") as store:
        store.put_compile("k0", os.urandom(100), symbol="s0", meta=dict(KERNEL))
        store.export_bundle(tmp_path / "b.tar")
    bundle = rewrite(tmp_path / "b.tar", "compile.json", lambda doc: doc["k0"].update({field: value}))

    code, out = cli(capsys, "import", "--cache", str(tmp_path / "target"), str(bundle))

    assert code == 2 and f"field {field!r}" in out and "nothing was imported" in out, out
    assert not (tmp_path / "target").exists()


def test_readers_skip_an_existing_entry_with_a_bad_field(tmp_path, capsys, caplog):
    with Store(tmp_path / "c") as store:
        store.put_compile("k0", os.urandom(100), symbol="s0", meta=dict(KERNEL))
        store.put_compile("k1", os.urandom(100), symbol="s1", meta=dict(KERNEL))
        entry = json.loads(store.read_entry(store.namespaces.compile, "k1")[1])
        store.namespaces.compile.set("k1", json.dumps({**entry, "size": "big", "arch": ["sm_90"]}),
                                     tag=entry["digest"])

    code, out = cli(capsys, "ls", "--cache", str(tmp_path / "c"))
    assert code == 0 and "1 compile entries" in out, out
    assert "refusing compile entry 'k1': field 'arch' is ['sm_90']" in caplog.text
    code, out = cli(capsys, "export", "--cache", str(tmp_path / "c"), "--arch", "sm_90", str(tmp_path / "b.tar"))
    assert code == 1 and "1 stored values that could not be read or are malformed" in out, out


def rewrite(bundle: Path, name: str, change) -> Path:
    """A copy of an unsigned bundle with one JSON member changed."""
    out = bundle.with_name("changed.tar")
    with tarfile.open(bundle) as src, tarfile.open(out, "w") as dst:
        for member in src:
            data = src.extractfile(member).read()
            if member.name == name:
                doc = json.loads(data)
                change(doc)
                data = json.dumps(doc).encode()
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    return out


def _bytes_read() -> int:
    """The bytes this process has read so far (``rchar``: every read call, cached or not)."""
    with open("/proc/self/io") as stream:
        return next(int(line.split()[1]) for line in stream if line.startswith("rchar:"))


def test_a_tree_member_too_large_is_refused_unread_and_nothing_is_copied(tmp_path, capsys):
    with Store(tmp_path / "source") as store:
        store.put_compile("k0", os.urandom(100), symbol="s0", meta=dict(KERNEL))
        store.export_bundle(tmp_path / "b.tar")
    tree = tmp_path / "tree"
    with tarfile.open(tmp_path / "b.tar") as tar:
        tar.extractall(tree, filter="data")
    target = tmp_path / "target"

    code, out = cli(capsys, "import", "--cache", str(target), str(tree))  # read in place: no temporary copy
    assert code == 0 and "1 new CUBINs" in out, out
    assert not [name for name in os.listdir(target) if name.startswith(".")]

    (blob,) = (tree / "blobs").iterdir()
    os.truncate(blob, 2 << 30)  # sparse: refused from its size, never read
    before = _bytes_read()
    code, out = cli(capsys, "import", "--cache", str(target), str(tree))
    assert code == 2 and "above the 256 MiB limit" in out, out
    assert _bytes_read() - before < 16 << 20  # its 2 GiB of zeros were not read


def test_export_exits_non_zero_when_it_leaves_entries_out(tmp_path, capsys):
    cache = tmp_path / "c"
    with Store(cache) as store:
        for i in range(3):
            store.put_compile(f"k{i}", os.urandom(1000), symbol=f"s{i}", meta=dict(KERNEL))
        row = next(r for r in store.namespaces.blobs.rows())
    with open(cache / "blobs" / row.filename, "r+b") as f:
        f.write(b"corrupt")

    code, out = cli(capsys, "export", "--cache", str(cache), str(tmp_path / "b.tar"))
    assert code == 1 and "left out 1 entries whose CUBIN is missing, corrupt or unreadable" in out, out

    with open(cache / "compile" / "cache.db", "r+b") as f:
        f.write(b"garbage garbage garbage")  # the header: the index cannot be read at all
    code, out = cli(capsys, "export", "--cache", str(cache), str(tmp_path / "c.tar"))
    assert code == 2 and "the compile index is damaged" in out and "nothing was written" in out, out
    assert not (tmp_path / "c.tar").exists()
