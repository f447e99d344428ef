"""Files a user names (reports, the ledger, bundles, keys) are written by one rule
(`ctbuild.cache.user_files`): a regular file or a new path is replaced whole, a symlink is
followed to its target, and a device node, FIFO or directory is refused in one line with nothing
written. Real device nodes (mknod, where permitted), FIFOs and links in tmp_path; never /dev."""
from __future__ import annotations

import contextlib
import io
import os
import stat
from pathlib import Path

import pytest

from ctbuild.cache import Store
from ctbuild.cache.__main__ import main as cache_main
from ctbuild.cache.user_files import NotAFileError, write_file


def null_device(path: Path) -> Path:
    """A character device like /dev/null (1, 3) at ``path``; skips where mknod is not permitted."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod of a character device needs root (CAP_MKNOD)")
    return path


def cli(*args: str) -> tuple[int, str, str]:
    """`ctbuild cache ARGS` in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cache_main(list(args))
    return code, out.getvalue(), err.getvalue()


def one_line_refusal(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err


def test_a_regular_file_is_replaced_whole_and_keeps_its_mode(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    report.write_text("old")
    report.chmod(0o640)
    write_file(report, b"new")
    assert report.read_bytes() == b"new" and stat.S_IMODE(report.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_a_symlink_is_followed_and_stays_a_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "r.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_file(link, b"new")
    assert link.is_symlink() and target.read_bytes() == b"new"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "real" / "new.json")
    write_file(dangling, b"made")
    assert dangling.is_symlink() and (tmp_path / "real" / "new.json").read_bytes() == b"made"


@pytest.mark.parametrize("kind", ["fifo", "chardev", "directory", "link to fifo"])
def test_a_device_fifo_or_directory_is_refused_and_left_as_it_was(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "out"
    if kind == "chardev":
        null_device(path)
    elif kind == "directory":
        path.mkdir()
    else:
        os.mkfifo(tmp_path / "fifo")
        path = tmp_path / "fifo" if kind == "fifo" else path
        if kind == "link to fifo":
            path.symlink_to(tmp_path / "fifo")
    before = os.lstat(path)
    with pytest.raises(NotAFileError, match="not a regular file") as raised:
        write_file(path, b"x")
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)
    after = os.lstat(path)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)
    assert not [p for p in tmp_path.rglob(".*.tmp")]


def test_export_follows_a_link_and_refuses_a_device(tmp_path: Path) -> None:
    with Store(tmp_path / "cache") as store:
        store.put_compile("k", b"c" * 64, symbol="s", meta={"kernel": "k", "arch": "sm_90"})
    link = tmp_path / "k.tar"
    link.symlink_to(tmp_path / "real.tar")
    assert cli("export", "--cache", str(tmp_path / "cache"), str(link))[0] == 0
    assert link.is_symlink() and (tmp_path / "real.tar").stat().st_size > 0
    device = null_device(tmp_path / "null")
    code, _, err = cli("export", "--cache", str(tmp_path / "cache"), str(device))
    one_line_refusal(code, err, str(device), "a character device")
    assert stat.S_ISCHR(os.lstat(device).st_mode)


def test_keygen_refuses_one_path_for_both_keys_and_never_overwrites_without_force(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    same = tmp_path / "same.pem"
    one_line_refusal(*cli("keygen", str(same), str(same))[::2], "one file")
    one_line_refusal(*cli("keygen", str(same), str(tmp_path / "." / "same.pem"))[::2], "one file")
    assert not same.exists()

    private, public = tmp_path / "ci.pem", tmp_path / "ci.pub.pem"
    assert cli("keygen", str(private), str(public))[0] == 0
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    keys = private.read_bytes(), public.read_bytes()
    one_line_refusal(*cli("keygen", str(private), str(tmp_path / "other.pub.pem"))[::2], "exists", "--force")
    one_line_refusal(*cli("keygen", str(tmp_path / "other.pem"), str(public))[::2], "exists", "--force")
    assert (private.read_bytes(), public.read_bytes()) == keys
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ci.pem", "ci.pub.pem"]

    code, _, err = cli("keygen", "--force", str(private), str(public))
    assert code == 0, err
    assert private.read_bytes() != keys[0] and public.read_bytes() != keys[1]
    assert stat.S_IMODE(private.stat().st_mode) == 0o600


def test_keygen_writes_neither_key_when_one_cannot_be_written(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    os.mkfifo(tmp_path / "fifo")
    code, _, err = cli("keygen", "--force", str(tmp_path / "ci.pem"), str(tmp_path / "fifo"))
    one_line_refusal(code, err, "a FIFO")
    code, _, err = cli("keygen", str(tmp_path / "ci.pem"), str(tmp_path / "no" / "ci.pub.pem"))
    one_line_refusal(code, err, "cannot write the key pair", str(tmp_path / "no" / "ci.pub.pem"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]
