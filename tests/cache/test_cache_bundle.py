"""Bundles: exact round trips, arch filtering, idempotent import, and refusal of unsafe bundles
with nothing written."""

import hashlib
import io
import json
import os
import stat
import tarfile
from pathlib import Path

import pytest

from ctbuild.cache import CacheError, Store, digest_of


def cubin(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (300 + 11 * i)


@pytest.fixture
def source(tmp_path) -> Store:
    store = Store(tmp_path / "src")
    for i in range(12):
        arch = ("sm_90", "sm_100", "sm_80")[i % 3]
        store.put_compile(f"k{i}", cubin(i), symbol=f"s{i}",
                          meta={"kernel": f"kern{i % 2}", "arch": arch, "config": {"i": i}})
    for i in range(0, 12, 2):
        store.put_tuning(f"t{i}", {"kernel": f"kern{i % 2}", "arch": ("sm_90", "sm_100", "sm_80")[i % 3],
                                   "compile_key": f"k{i}", "ms": 0.1 * i})
    store.put_toolchain("tc", {"tileiras": "13.4.92"})
    return store


def contents(store: Store) -> tuple:
    compiles = {k: (e, store.get_compile(k).cubin) for k, e in store.compile_entries()}
    return compiles, dict(store.tuning_records()), store.toolchains()


def files_of(root: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_mtime_ns, st.st_size)
    return out


@pytest.mark.parametrize("name", ["bundle.tar", "bundle.tgz"])
def test_round_trip_is_exact_and_import_is_idempotent(source, tmp_path, name):
    bundle = tmp_path / name
    exported = source.export_bundle(bundle)
    assert (exported["compile_entries"], exported["tuning_records"], exported["toolchains"],
            exported["blobs"]) == (12, 6, 1, 12)
    with Store(tmp_path / "dst") as dst:
        first = dst.import_bundle(bundle)
        assert (first["blobs_added"], first["entries_written"], first["entries_unchanged"]) == (12, 19, 0)
        assert contents(dst) == contents(source)  # entries incl. digest/created and CUBIN bytes, bit for bit
        before = files_of(tmp_path / "dst")
        second = dst.import_bundle(bundle)
        assert (second["blobs_added"], second["entries_written"], second["entries_unchanged"]) == (0, 0, 19)
        assert contents(dst) == contents(source)
        assert {k for k in files_of(tmp_path / "dst")} == set(before)
        assert dst.verify()["ok"]


def test_export_is_reproducible_and_filters_archs(source, tmp_path):
    source.export_bundle(tmp_path / "a.tar")
    source.export_bundle(tmp_path / "b.tar")
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()

    result = source.export_bundle(tmp_path / "hopper.tar", archs=["sm_90", "sm_100"])
    assert result["compile_entries"] == 8 and result["tuning_records"] == 4
    with tarfile.open(tmp_path / "hopper.tar") as tar:
        names = tar.getnames()
        compile_doc = json.load(tar.extractfile("compile.json"))
    assert {e["arch"] for e in compile_doc.values()} == {"sm_90", "sm_100"}
    assert sorted(n for n in names if n.startswith("blobs/")) == \
        sorted(f"blobs/{e['digest']}" for e in compile_doc.values())
    with Store(tmp_path / "dst") as dst:
        dst.import_bundle(tmp_path / "hopper.tar")
        assert {e["arch"] for _, e in dst.compile_entries()} == {"sm_90", "sm_100"}


def test_export_skips_entries_with_a_corrupt_blob(source, tmp_path):
    (blob,) = [p for p in source.path.glob("blobs/??/??/*.val") if p.read_bytes() == cubin(0)]
    blob.write_bytes(b"rotten")
    result = source.export_bundle(tmp_path / "b.tar")
    # the tuning record whose winner is k0 goes with it: an import refuses a record without its winner
    assert result["skipped"] == ["k0", "t0"] and result["compile_entries"] == 11
    assert result["tuning_records"] == 5
    with Store(tmp_path / "dst") as dst:
        assert dst.import_bundle(tmp_path / "b.tar")["tuning_records"] == 5


def member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE,
           link: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, len(data) if kind == tarfile.REGTYPE else 0, link
    return info, data


def make_bundle(path: Path, members: list) -> Path:
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


MANIFEST = member("manifest.json", json.dumps({"format": "ctbuild-cache-bundle", "version": 1}).encode())
GOOD_BLOB = member(f"blobs/{digest_of(b'cubin')}", b"cubin")
ENTRY = {"k": {"digest": digest_of(b"cubin"), "symbol": "s", "kernel": "x", "arch": "sm_90"}}
COMPILE = member("compile.json", json.dumps(ENTRY).encode())


# Each bad bundle also carries a valid blob and entry: an importer that writes as it reads would leak them.
@pytest.mark.parametrize(
    "members, message",
    [
        ([MANIFEST, GOOD_BLOB, COMPILE, member("../evil", b"x")], "unsafe path"),
        ([MANIFEST, GOOD_BLOB, COMPILE, member("blobs/../../evil", b"x")], "unsafe path"),
        ([MANIFEST, GOOD_BLOB, COMPILE, member("/tmp/evil", b"x")], "unsafe path"),
        ([MANIFEST, GOOD_BLOB, COMPILE, member(f"blobs/{'0' * 32}", kind=tarfile.SYMTYPE, link="/etc/passwd")],
         "symlink"),
        ([MANIFEST, GOOD_BLOB, COMPILE, member(f"blobs/{'1' * 32}", kind=tarfile.LNKTYPE, link="manifest.json")],
         "hard link"),
        ([MANIFEST, GOOD_BLOB, COMPILE, member(f"blobs/{'2' * 32}", kind=tarfile.CHRTYPE)], "device"),
        ([member("manifest.json", json.dumps({"format": "ctbuild-cache-bundle", "version": 2}).encode()),
          GOOD_BLOB, COMPILE], "version"),
        ([GOOD_BLOB, MANIFEST, COMPILE], "does not start with"),
        ([MANIFEST, GOOD_BLOB, COMPILE, member(f"blobs/{digest_of(b'other')}", b"cubin")], "does not match its digest"),
        ([MANIFEST, COMPILE], "neither in the bundle"),
        ([MANIFEST, GOOD_BLOB, member("compile.json", b"{not json")], "not valid JSON"),
        ([MANIFEST, GOOD_BLOB, COMPILE, member("extra.txt", b"x")], "not part of the bundle format"),
        ([MANIFEST, GOOD_BLOB, COMPILE, GOOD_BLOB], "appears twice"),
    ],
)
def test_unsafe_or_broken_bundles_are_refused_with_nothing_written(tmp_path, members, message):
    bundle = make_bundle(tmp_path / "bad.tar", members)
    store = Store(tmp_path / "dst")
    before = files_of(tmp_path)
    with pytest.raises(CacheError, match=message):
        store.import_bundle(bundle)
    assert files_of(tmp_path) == before
    assert store.stats()["blobs"] == 0 and store.stats()["compile_entries"] == 0
    assert not (tmp_path / "evil").exists() and not Path("/tmp/evil").exists()


def test_a_valid_hand_made_bundle_imports(tmp_path):
    bundle = make_bundle(tmp_path / "ok.tar", [MANIFEST, GOOD_BLOB, member("compile.json", json.dumps(ENTRY).encode())])
    with Store(tmp_path / "dst") as store:
        store.import_bundle(bundle)
        assert store.get_compile("k").cubin == b"cubin"


def test_not_a_tar_is_refused(tmp_path):
    (tmp_path / "junk.tar").write_bytes(b"definitely not a tar" * 100)
    with pytest.raises(CacheError, match="not a readable tar"):
        Store(tmp_path / "dst").import_bundle(tmp_path / "junk.tar")


def test_failed_export_leaves_no_file(source, tmp_path):
    with pytest.raises(CacheError):
        source.export_bundle(tmp_path / "missing-dir" / "b.tar")
    assert not (tmp_path / "missing-dir").exists()
    assert not [p for p in tmp_path.iterdir() if stat.S_ISREG(p.stat().st_mode)]
