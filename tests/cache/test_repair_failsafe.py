"""`verify --repair` never loses an intact CUBIN: an interrupted rebuild's aside directory is
recovered by the next repair, a missing or unusable index (gone, not a file, a link to a
device) is reported as damage and rebuilt from the value files, a rebuild reads only regular
files of a bounded size (never a link's target, never a FIFO), and a value file that is not a
regular file is quarantined while a permission problem is named as one, not as damage."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import ctbuild.cache.__main__ as cache_main
from ctbuild.cache import Store, digest_of

KERNEL = {"kernel": "kern", "arch": "sm_90"}


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cache_main.main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def build(root: Path) -> dict[str, bytes]:
    cubins = {f"k{i}": os.urandom(3000 + i) for i in range(4)}
    with Store(root) as store:
        for key, cubin in cubins.items():
            store.put_compile(key, cubin, symbol="s", meta=dict(KERNEL))
    return cubins


def intact(root: Path, cubins: dict[str, bytes]) -> bool:
    with Store(root, readonly=True) as store:
        return all((hit := store.get_compile(key)) is not None and hit.cubin == cubin
                   for key, cubin in cubins.items())


def test_a_repair_recovers_what_an_interrupted_rebuild_left_aside(tmp_path, capsys):
    cubins = build(tmp_path)
    (tmp_path / "blobs").rename(tmp_path / ".blobs.damaged.1")  # the rebuild's first step, then Ctrl-C

    code, out = cli(capsys, "stats", "--cache", str(tmp_path))
    assert code == 1 and "an interrupted repair left" in out, out
    code, out = cli(capsys, "verify", "--repair", "--cache", str(tmp_path))
    assert "interrupted_repair" in out and "missing_blob" not in out, out
    assert intact(tmp_path, cubins) and not list(tmp_path.glob(".blobs.damaged.*"))
    assert cli(capsys, "verify", "--cache", str(tmp_path))[0] == 0


@pytest.mark.parametrize("damage", ["missing index", "namespace is a file", "index links to /dev/zero"])
def test_a_missing_or_unusable_index_is_damage_and_repaired(tmp_path, capsys, damage):
    cubins = build(tmp_path)
    if damage == "missing index":
        (tmp_path / "blobs" / "cache.db").unlink()
        wanted = cubins  # rebuilt from the value files
    elif damage == "namespace is a file":
        shutil.rmtree(tmp_path / "compile")
        (tmp_path / "compile").write_text("x")
        wanted = {}
    else:
        (tmp_path / "compile" / "cache.db").unlink()
        (tmp_path / "compile" / "cache.db").symlink_to("/dev/zero")
        wanted = {}

    assert cli(capsys, "stats", "--cache", str(tmp_path))[0] == 1
    code, out = cli(capsys, "verify", "--cache", str(tmp_path))
    assert code == 1 and "damaged_index" in out, out
    code, out = cli(capsys, "verify", "--repair", "--cache", str(tmp_path))
    assert "rebuilt the" in out, out
    assert cli(capsys, "verify", "--cache", str(tmp_path))[0] == 0
    assert intact(tmp_path, wanted)
    with Store(tmp_path) as store:
        assert store.stats()["compile_entries"] == len(wanted) and store.stats()["blobs"] == 4


def test_gc_refuses_a_namespace_whose_index_is_missing(tmp_path, capsys):
    cubins = build(tmp_path)
    (tmp_path / "blobs" / "cache.db").unlink()
    code, out = cli(capsys, "gc", "--orphan-grace", "0", "--cache", str(tmp_path))
    assert code == 2 and "verify --repair" in out, out
    cli(capsys, "verify", "--repair", "--cache", str(tmp_path))
    assert intact(tmp_path, cubins)


def test_a_rebuild_reads_regular_files_only(tmp_path, capsys):
    cubins = build(tmp_path)
    secret = tmp_path.parent / "secret.txt"
    secret.write_bytes(b"top secret")
    planted = tmp_path / "blobs" / "aa" / "bb"
    planted.mkdir(parents=True)
    (planted / "planted.val").symlink_to(secret)
    os.mkfifo(planted / "fifo.val")  # would block a reader forever
    (tmp_path / "blobs" / "ab").symlink_to(planted, target_is_directory=True)
    with open(tmp_path / "blobs" / "cache.db", "r+b") as f:
        f.write(b"garbage garbage garbage")

    code, out = cli(capsys, "verify", "--repair", "--cache", str(tmp_path))
    assert "rebuilt the blobs index: kept 4 entries" in out, out
    with Store(tmp_path, readonly=True) as store:
        assert store.stats()["blobs"] == 4
    assert intact(tmp_path, cubins)


@pytest.mark.parametrize("odd", ["fifo", "sparse"])
def test_a_value_file_that_is_not_a_file_is_quarantined(tmp_path, capsys, odd):
    """A FIFO, or a file of another size than its row records (a sparse GiB: not what the
    cache wrote, and never read whole), is moved to quarantine/ by a repair (it was reported
    as unreadable and left, "check the disk", for ever)."""
    cubins = build(tmp_path)
    with Store(tmp_path) as store:
        row = next(r for r in store.namespaces.blobs.rows())
    path = tmp_path / "blobs" / row.filename
    if odd == "fifo":
        path.unlink()
        os.mkfifo(path)
    else:
        os.truncate(path, 2**30)

    code, out = cli(capsys, "verify", "--cache", str(tmp_path))
    assert code == 1 and "--repair` removes them" in out, out
    assert ("is a FIFO" if odd == "fifo" else f"is a file of {2**30} bytes where its row "
            f"records {row.size}") in out, out
    code, out = cli(capsys, "verify", "--repair", "--cache", str(tmp_path))
    assert "repaired 2" in out, out
    assert cli(capsys, "verify", "--cache", str(tmp_path))[0] == 0
    assert len(list((tmp_path / "quarantine").iterdir())) == 1
    assert intact(tmp_path, {key: cubin for key, cubin in cubins.items() if digest_of(cubin) != row.key})
