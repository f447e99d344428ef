"""Hostile bundles: a decompression/size bomb, unreferenced blobs, a failed write part-way, and
authenticity (signed bundles; a tampered or unsigned one refused when a signature is required).

Imports run in real `python -m ctbuild.cache` child processes; memory is the child's own ru_maxrss."""

import gzip
import io
import json
import os
import resource
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from ctbuild.cache import CacheError, Store, digest_of
from ctbuild.cache import bundle as bundle_mod

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def env() -> dict:
    full = {k: v for k, v in os.environ.items() if k != "CTBUILD_CACHE_DIR"}
    full.update({"PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"})
    return full


def run_cache(*args: str, preexec=None) -> tuple[int, str, str]:
    """Run `python -m ctbuild.cache ARGS`; returns (exit code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "ctbuild.cache", *args], env=env(), capture_output=True, text=True,
                          preexec_fn=preexec, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


#: Runs argv[1:] and prints the child's exit code and own peak RSS (ru_maxrss survives exec, so
#: the child is forked from this small launcher, not from the test process).
LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
_, status, usage = os.wait4(pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024)
"""


def peak_rss(*args: str) -> tuple[int, str, int]:
    """Run `python -m ctbuild.cache ARGS`; returns (exit code, stderr, the child's own peak RSS in bytes)."""
    proc = subprocess.run([sys.executable, "-c", LAUNCHER, "-m", "ctbuild.cache", *args], env=env(),
                          capture_output=True, text=True, timeout=120)
    code, rss = proc.stdout.split()[-2:]
    return int(code), proc.stderr, int(rss)


def member_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0o644
    return info.tobuf(tarfile.PAX_FORMAT)


def pad(size: int) -> bytes:
    return b"\0" * (-size % 512)


MANIFEST = json.dumps({"format": "ctbuild-cache-bundle", "version": 1}).encode()


def write_bomb(out: io.RawIOBase | gzip.GzipFile, blob_size: int, *, sparse: bool) -> None:
    """A valid-looking bundle whose one blob (referenced by no entry) is ``blob_size`` zero bytes,
    written without ever holding it: seeked over (sparse) or streamed in chunks."""
    for name, data in (("manifest.json", MANIFEST), ("compile.json", b"{}")):
        out.write(member_header(name, len(data)) + data + pad(len(data)))
    out.write(member_header(f"blobs/{'ab' * 16}", blob_size))
    if sparse:
        out.seek(blob_size, os.SEEK_CUR)
    else:
        for start in range(0, blob_size, 1 << 22):
            out.write(b"\0" * min(1 << 22, blob_size - start))
    out.write(pad(blob_size) + b"\0" * 1024)


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


@pytest.mark.parametrize("suffix", [".tar", ".tgz"])
def test_a_1gib_bomb_is_refused_with_bounded_memory_and_nothing_written(tmp_path, suffix):
    bomb = tmp_path / f"bomb{suffix}"
    if suffix == ".tar":
        with open(bomb, "wb") as f:
            write_bomb(f, GIB, sparse=True)
    else:
        with gzip.open(bomb, "wb", compresslevel=1) as f:
            write_bomb(f, GIB, sparse=False)
        assert bomb.stat().st_size < 8 * 2**20  # a few MiB that claim a GiB
    dst = tmp_path / "dst"
    Store(dst).close()
    before = tree(dst)
    code, stderr, rss = peak_rss("import", "--cache", str(dst), str(bomb))
    assert code == 2, stderr
    assert "above the 256 MiB limit" in stderr and "nothing was imported" in stderr
    assert "Traceback" not in stderr
    assert rss < 100 * 2**20, f"peak RSS {rss / 2**20:.0f} MiB"
    assert tree(dst) == before


def test_member_limit_is_configurable_and_unreferenced_blobs_are_refused(tmp_path):
    bundle = tmp_path / "b.tar"
    with open(bundle, "wb") as f:
        write_bomb(f, 3 * 2**20, sparse=False)
    dst = tmp_path / "dst"
    code, stderr, _ = peak_rss("import", "--cache", str(dst), "--max-member-size", "1M", str(bundle))
    assert code == 2 and "above the 1 MiB limit" in stderr
    unused = tmp_path / "unused.tar"
    data = os.urandom(4096)
    with open(unused, "wb") as f:
        for name, content in (("manifest.json", MANIFEST), ("compile.json", b"{}"), (f"blobs/{digest_of(data)}", data)):
            f.write(member_header(name, len(content)) + content + pad(len(content)))
        f.write(b"\0" * 1024)
    code, stderr, _ = peak_rss("import", "--cache", str(dst), str(unused))
    assert code == 2 and "no compile entry uses" in stderr and "Traceback" not in stderr
    assert Store(dst).stats()["blobs"] == 0


def real_bundle(tmp_path: Path, *, size: int = 3 * 2**20) -> Path:
    src = Store(tmp_path / "src")
    data = os.urandom(size)
    src.put_compile("kA", data, symbol="sA", meta={"kernel": "a", "arch": "sm_90"})
    src.put_compile("kB", b"cubin-of-b" * 100, symbol="sB", meta={"kernel": "b", "arch": "sm_90"})
    src.export_bundle(tmp_path / "real.tar")
    return tmp_path / "real.tar"


def test_a_write_failing_part_way_leaves_nothing_behind(tmp_path):
    """A file-size limit in the child makes the 3 MiB blob's write fail part-way (as a full disk
    does): the import fails with one line and the cache holds no partial file, row or entry."""
    bundle = real_bundle(tmp_path)
    dst = tmp_path / "dst"
    Store(dst).close()
    before = tree(dst)

    def limit_file_size():
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, 2**20))

    code, _, stderr = run_cache("import", "--cache", str(dst), str(bundle), preexec=limit_file_size)
    assert code == 2 and "nothing was imported" in stderr and "Traceback" not in stderr, stderr
    store = Store(dst)
    assert store.stats()["blobs"] == 0 and store.stats()["compile_entries"] == 0
    assert not [p for p in dst.rglob("*.val")], "a partial value file was left behind"
    assert {p for p in tree(dst) if not p.endswith(("-wal", "-shm"))} <= before | {"blobs", "blobs/cache.db"}


def tiny_bundle(path: Path, n: int, *, tuning: bytes = b"{}") -> Path:
    """A bundle of ``n`` four-byte blobs, each with its compile entry: little to download, but a
    file, a directory block and a row each to store."""
    blobs = [i.to_bytes(4, "little") for i in range(n)]
    digests = [digest_of(b) for b in blobs]
    compile_doc = json.dumps({f"k{i}": {"digest": d, "symbol": "s", "kernel": "k", "arch": "sm_90"}
                              for i, d in enumerate(digests)}).encode()
    with open(path, "wb") as f:
        for name, data in (("manifest.json", MANIFEST), ("compile.json", compile_doc), ("tuning.json", tuning),
                           *((f"blobs/{d}", b) for d, b in zip(digests, blobs))):
            f.write(member_header(name, len(data)) + data + pad(len(data)))
        f.write(b"\0" * 1024)
    return path


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 80 MiB tmpfs (64 MiB of it the import's margin); skipped where mounting is not allowed."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=80m", "ctbuild-test", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "--lazy", str(mnt)], check=False)  # something still holds it open


def test_many_tiny_members_are_refused_by_what_they_take_on_disk(tmp_path, small_tmpfs):
    """5,000 four-byte blobs are 20 KB of data but about 42 MiB of files, directories and rows:
    refused from the headers on an 80 MiB filesystem with nothing written; a real bundle fits."""
    bundle = tiny_bundle(tmp_path / "tiny.tar", 5_000)
    cache = small_tmpfs / "cache"
    Store(cache).close()
    before = tree(cache)
    code, stderr, _ = peak_rss("import", "--cache", str(cache), str(bundle))
    assert code == 2 and "not enough free space" in stderr and "4096-byte blocks" in stderr, stderr
    assert "nothing was imported" in stderr and "Traceback" not in stderr
    assert tree(cache) == before
    code, stderr, _ = peak_rss("import", "--cache", str(cache), str(real_bundle(tmp_path, size=2**20)))
    assert code == 0, stderr
    with Store(cache) as store:
        assert store.stats()["compile_entries"] == 2


def test_member_count_and_disk_size_caps(tmp_path):
    bundle = tiny_bundle(tmp_path / "tiny.tar", 300)
    dst = tmp_path / "dst"
    code, stderr, _ = peak_rss("import", "--cache", str(dst), "--max-members", "100", str(bundle))
    assert code == 2 and "more than 100 members (--max-members)" in stderr, stderr
    code, stderr, _ = peak_rss("import", "--cache", str(dst), "--max-size", "1M", str(bundle))
    assert code == 2 and "more than 1 MiB on disk (--max-size" in stderr, stderr
    assert Store(dst).stats()["blobs"] == 0


def test_a_tuning_record_needs_its_compile_entry(tmp_path):
    record = {"t": {"kernel": "k", "arch": "sm_90", "compile_key": "no-such-key"}}
    bundle = tiny_bundle(tmp_path / "t.tar", 2, tuning=json.dumps(record).encode())
    dst = Store(tmp_path / "dst")
    with pytest.raises(CacheError, match="record 't' names compile key 'no-such-key', which is neither in the "
                                         "bundle nor in the cache"):
        dst.import_bundle(bundle)
    assert dst.stats()["blobs"] == 0 and dst.stats()["tuning_records"] == 0


def json_bundle(path: Path, compile_doc: bytes, *, compress: bool = False) -> Path:
    opener = gzip.open if compress else open
    with opener(path, "wb") as f:
        for name, data in (("manifest.json", MANIFEST), ("compile.json", compile_doc)):
            f.write(member_header(name, len(data)) + data + pad(len(data)))
        f.write(b"\0" * 1024)
    return path


def test_json_bombs_are_refused_before_parsing_in_bounded_memory(tmp_path):
    """A 30 MiB document of empty lists (10 million values; about 700 MB once parsed) and one
    200,000 deep: one line each, exit 2, and the child's peak RSS stays far below 512 MiB."""
    dst = tmp_path / "dst"
    wide = b'{"k": [' + b"[]," * (10 * 2**20) + b"[]]}"
    deep = b'{"k": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    for bundle, message in [(json_bundle(tmp_path / "wide.tgz", wide, compress=True), "holds more than"),
                            (json_bundle(tmp_path / "deep.tar", deep), "nests JSON more than 32 deep")]:
        code, stderr, rss = peak_rss("import", "--cache", str(dst), str(bundle))
        assert code == 2 and message in stderr and "nothing was imported" in stderr, stderr
        assert len(stderr.splitlines()) == 1 and "Traceback" not in stderr, stderr
        assert rss < 256 * 2**20, f"{bundle.name}: peak RSS {rss / 2**20:.0f} MiB"
    big = json_bundle(tmp_path / "big.tar", b'{"k": "' + b"x" * (33 * 2**20) + b'"}')
    code, stderr, _ = peak_rss("import", "--cache", str(dst), str(big))
    assert code == 2 and "JSON documents exceed 32 MiB (--max-json-size)" in stderr, stderr


def test_signature_is_checked_before_any_document_is_parsed(tmp_path):
    key = tmp_path / "ci.key"
    key.write_bytes(os.urandom(32).hex().encode())
    bomb = json_bundle(tmp_path / "bomb.tar", b"[" * 200_000)
    code, _, err = run_cache("import", "--cache", str(tmp_path / "dst"), "--require-signature", str(key), str(bomb))
    assert code == 2 and "not signed" in err and "JSON" not in err, err


def test_signed_bundle_round_trips_and_tampering_is_refused(tmp_path):
    src = Store(tmp_path / "src")
    src.put_compile("kA", b"cubin of kernel A" * 50, symbol="sA", meta={"kernel": "a", "arch": "sm_90"})
    src.put_compile("kB", b"cubin of kernel B" * 50, symbol="sB", meta={"kernel": "b", "arch": "sm_90"})
    src.close()
    key, other = tmp_path / "ci.key", tmp_path / "other.key"
    key.write_bytes(os.urandom(32).hex().encode() + b"\n")
    other.write_bytes(os.urandom(32).hex().encode())
    signed, unsigned = tmp_path / "signed.tgz", tmp_path / "unsigned.tgz"
    code, out, err = run_cache("export", "--cache", str(tmp_path / "src"), "--sign", str(key), str(signed))
    assert code == 0 and "signed" in out, err
    assert run_cache("export", "--cache", str(tmp_path / "src"), str(unsigned))[0] == 0

    code, out, err = run_cache("import", "--cache", str(tmp_path / "ok"), "--require-signature", str(key), str(signed))
    assert code == 0 and "signature verified" in out, err
    assert Store(tmp_path / "ok").get_compile("kA").cubin == b"cubin of kernel A" * 50

    # The attack of an unauthenticated bundle: serve kernel B's CUBIN under kernel A's key.
    tampered = tmp_path / "tampered.tgz"
    with tarfile.open(signed) as tar_in, tarfile.open(tampered, "w:gz") as tar_out:
        for info in tar_in:
            data = tar_in.extractfile(info).read()
            if info.name == "compile.json":
                doc = json.loads(data)
                doc["kA"] = {**doc["kB"], "kernel": "a"}
                data = json.dumps(doc).encode()
                info.size = len(data)
            tar_out.addfile(info, io.BytesIO(data))
    for bundle, keyfile, message in [(tampered, key, "tampered"), (unsigned, key, "not signed"),
                                     (signed, other, "does not verify")]:
        dst = tmp_path / f"dst-{bundle.stem}-{keyfile.stem}"
        code, _, err = run_cache("import", "--cache", str(dst), "--require-signature", str(keyfile), str(bundle))
        assert code == 2 and message in err and "nothing was imported" in err and "Traceback" not in err, err
        assert Store(dst).stats()["compile_entries"] == 0
    # Without --require-signature a signed bundle imports like any other (the signature is ignored).
    assert run_cache("import", "--cache", str(tmp_path / "plain"), str(signed))[0] == 0


def test_short_or_missing_key_files_are_refused(tmp_path):
    for secret in ("abc\n", "0123456789abcdef" * 1 + "0123456789abcde"):  # 3 and 31 bytes
        (tmp_path / "short.key").write_text(secret)
        with pytest.raises(CacheError, match="at least 32"):
            bundle_mod.read_key(tmp_path / "short.key")
    with pytest.raises(CacheError, match="cannot read key file"):
        bundle_mod.read_key(tmp_path / "absent.key")
