"""Odd files where ctbuild reads: a FIFO, a device, a sparse GB file in place of a cache value
file, a layout marker or a file a user names (``--ledger``, ``--from-record``,
``--require-signature``). Each is refused (or, in the cache, a miss) in one line naming the path,
before a byte is read: never a hang, never a GB in memory (`ctbuild.cache.user_files.read_regular`).
Real FIFOs, links and sparse files (truncate) in tmp_path; commands run in a process of their own,
so a regression fails on a timeout instead of blocking the suite."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ctbuild.cache import Store
from ctbuild.cache.errors import ReadOnlyCacheError
from ctbuild.cache.user_files import FileTooLargeError, NotAFileError, file_target, read_regular

REPO = Path(__file__).resolve().parents[2]
CUBIN = b"\x7fELF" + bytes(range(256)) * 8


def run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -c code ARGS`` in a process of its own; a hang fails the test after 30 s."""
    try:
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                              timeout=30, env={**os.environ, "PYTHONPATH": str(REPO)})
    except subprocess.TimeoutExpired:
        pytest.fail("hung")


CLI = "import sys; from ctbuild.cli import main; sys.exit(main(sys.argv[1:]))"
#: The peak RSS of this process since its exec, in MiB (``ru_maxrss`` survives exec: a child
#: forked from a large test process would report the parent's).
PEAK_MIB = "int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) // 1024"
RSS = ("import sys; from ctbuild.cli import main; code = main(sys.argv[1:]); "
       f"print('RSS_MIB', {PEAK_MIB}); sys.exit(code)")


def refused_in_one_line(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err


def odd(path: Path, kind: str) -> Path:
    """Make ``path`` a FIFO, a link to /dev/zero or a sparse 3 GB file."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    else:
        path.touch()
        os.truncate(path, 3 * 2**30)
    return path


WHAT = {"fifo": "FIFO", "dev_zero": "character device", "sparse": "bytes, more than"}


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "sparse"])
def test_read_regular_refuses_before_reading(tmp_path: Path, kind: str) -> None:
    path = odd(tmp_path / "f", kind)
    error = FileTooLargeError if kind == "sparse" else NotAFileError
    with pytest.raises(error, match=WHAT[kind]):
        read_regular(path, limit=1024, what="a test file")
    (tmp_path / "ok").write_bytes(b"x" * 1024)
    assert read_regular(tmp_path / "ok", limit=1024, what="a test file") == b"x" * 1024


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "sparse"])
def test_doctor_ledger_refuses_an_odd_file(tmp_path: Path, kind: str) -> None:
    path = odd(tmp_path / "ledger.json", kind)
    proc = run(RSS, "doctor", "--ledger", str(path))
    refused_in_one_line(proc, str(path), WHAT[kind], "CTBUILD_LEDGER")
    assert int(proc.stdout.split()[-1]) < 500


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_record_file_and_a_key_file_that_are_not_files_are_refused(tmp_path: Path, kind: str) -> None:
    from ctbuild.cache.signing import load_key
    from ctbuild.compile.miss_records import RecordFileError, read_records
    path = odd(tmp_path / "f", kind)
    with pytest.raises(RecordFileError, match=WHAT[kind]):
        read_records([str(path)], [])
    with pytest.raises(Exception, match=WHAT[kind]):
        load_key(path)
    Store(tmp_path / "c").close()
    proc = run(CLI, "cache", "import", "--cache", str(tmp_path / "c"), "--require-signature",
               str(path), str(tmp_path / "bundle.tar"))
    refused_in_one_line(proc, str(path), WHAT[kind])


@pytest.mark.parametrize("kind", ["fifo", "sparse"])
def test_stats_refuses_an_odd_layout_marker(tmp_path: Path, kind: str) -> None:
    Store(tmp_path / "c").close()
    marker = odd(tmp_path / "c" / "ctbuild-cache.json", kind)
    proc = run(RSS, "cache", "stats", "--cache", str(tmp_path / "c"))
    refused_in_one_line(proc, str(marker), WHAT[kind])
    assert int(proc.stdout.split()[-1]) < 500


def test_a_blob_file_far_larger_than_any_cubin_is_a_miss_not_a_gb_read(tmp_path: Path) -> None:
    with Store(tmp_path / "c") as store:
        store.put_compile("k1", CUBIN, symbol="s", meta={"kernel": "x"})
    blob = odd(next((tmp_path / "c" / "blobs").rglob("*.val")), "sparse")
    code = ("import json, sys; from ctbuild.cache import Store\n"
            "s = Store(sys.argv[1], readonly=True)\n"
            "print(json.dumps({'hit': s.get_compile('k1') is not None, 'damage': s.damage,"
            f" 'rss': {PEAK_MIB}}}))")
    proc = run(code, str(tmp_path / "c"))
    out = json.loads(proc.stdout.splitlines()[-1])
    assert not out["hit"] and str(blob) in out["damage"] and out["rss"] < 500, (out, proc.stderr)


def test_safe_disk_never_opens_a_fifo_value_file_blocking(tmp_path: Path) -> None:
    """The disk's own check, whatever the namespace checked before (the file may be swapped)."""
    code = ("import sys; from diskcache.core import MODE_BINARY; from ctbuild.cache.safe_disk import SafeDisk\n"
            "try:\n    SafeDisk(sys.argv[1]).fetch(MODE_BINARY, 'v.val', None, False)\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc)")
    os.mkfifo(tmp_path / "v.val")
    out = run(code, str(tmp_path)).stdout
    assert out.startswith("DamagedCacheError") and "FIFO" in out, out


def test_a_path_to_a_pipe_through_proc_is_refused_as_a_fifo() -> None:
    """``--report /proc/self/fd/1`` with stdout a pipe: refused as the FIFO it is, not "No such
    file" from a temporary file beside ``pipe:[N]``."""
    read, write = os.pipe()
    try:
        with pytest.raises(NotAFileError, match="FIFO"):
            file_target(f"/proc/self/fd/{write}")
    finally:
        os.close(read)
        os.close(write)


def test_writing_a_cache_that_cannot_be_written_says_so_without_api_words(tmp_path: Path) -> None:
    (tmp_path / "file").touch()
    with pytest.raises(ReadOnlyCacheError) as raised:
        Store(tmp_path / "file" / "cache", readonly=False)
    assert "readonly=False" not in str(raised.value) and "--cache" in str(raised.value)


@pytest.mark.parametrize("side", ["-wal", "-shm"])
def test_a_fifo_beside_an_index_is_damage_not_a_hang(tmp_path: Path, side: str) -> None:
    """SQLite opens an index's -wal and -shm files itself, and blocks on a FIFO for ever: the
    reader and the writer refuse them before connecting."""
    with Store(tmp_path / "c") as store:
        store.put_blob(CUBIN)
    os.mkfifo(tmp_path / "c" / "blobs" / f"cache.db{side}")
    code = ("import sys\nfrom ctbuild.cache import Store\nfrom ctbuild.cache.errors import "
            "DamagedCacheError\nwith Store(sys.argv[1], readonly=True) as s:\n"
            "    print('READ', s.integrity())\ntry:\n    with Store(sys.argv[1]) as s:\n"
            "        s.put_blob(b'x' * 64)\nexcept DamagedCacheError as exc:\n"
            "    print('WRITE', exc)\n")
    proc = run(code, str(tmp_path / "c"))
    read, write = proc.stdout.splitlines()
    assert "'blobs'" in read and "not a regular file" in read, (proc.stdout, proc.stderr)
    assert write.startswith("WRITE") and write.endswith(f"cache.db{side} is not a regular file")
