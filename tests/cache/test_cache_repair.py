"""`cache verify --repair` never removes what it could not read: a file or index this user may
not read is a reported problem ("permission denied: ..."), left as it is; a blob whose bytes do
not match its digest is moved into quarantine/, not deleted."""
from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest

import ctbuild.cache.__main__ as cache_main
from ctbuild.cache import Store

NOBODY = 65534


def build(root: Path) -> Path:
    with Store(root) as store:
        for i in range(3):
            store.put_compile(f"k{i}", os.urandom(5000 + i), symbol=f"s{i}",
                              meta={"kernel": "kern", "arch": "sm_90"})
        store.put_tuning("t0", {"kernel": "kern", "arch": "sm_90", "compile_key": "k0"})
    return root


def blob_file(store: Store, key: str) -> Path:
    digest = store.get_compile(key).meta["digest"]
    (row,) = [r for r in store.namespaces.blobs.rows() if r.key == digest]
    return store.namespaces.blobs.directory / row.filename


def cache_cli(out: Path, *argv: str) -> int:
    """`python -m ctbuild.cache ARGV` in this process (or a fork of it), its output into ``out``."""
    with open(out, "w") as stream:
        saved = os.dup(1), os.dup(2), sys.stdout, sys.stderr
        os.dup2(stream.fileno(), 1)
        os.dup2(stream.fileno(), 2)
        sys.stdout, sys.stderr = os.fdopen(os.dup(1), "w"), os.fdopen(os.dup(2), "w")
        try:
            return cache_main.main(list(argv))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            sys.stdout, sys.stderr = saved[2], saved[3]


def as_unprivileged(out: Path, *argv: str) -> tuple[int, str]:
    """Run the cache CLI as a user that file modes apply to: this one, or, as root (whom chmod
    000 does not stop), a fork that drops to nobody. Returns (exit code, output)."""
    out.touch()
    os.chmod(out, 0o666)
    if os.getuid() != 0:
        return cache_cli(out, *argv), out.read_text()
    pid = os.fork()
    if pid == 0:  # the child: already holds every module it needs (nobody cannot read /root)
        code = 98
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
        except OSError:
            os._exit(99)
        try:
            code = cache_cli(out, *argv)
        except BaseException as exc:  # noqa: BLE001 - said in the output the test reads
            with open(out, "a") as stream:
                stream.write(f"the unprivileged child failed: {exc!r}\n")
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 99:
        pytest.skip("cannot drop root privileges here to make a file unreadable")
    return code, out.read_text()


@pytest.fixture
def shared_dir():
    """A directory outside pytest's root-only tmp tree, which nobody can reach."""
    base = Path(tempfile.mkdtemp(prefix="ct-perm-", dir="/tmp"))
    os.chmod(base, 0o755)
    yield base
    for path in [base, *base.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, 0o700)
    shutil.rmtree(base)


HINT = "permission denied: fix ownership or run as the cache's owner"


def test_what_cannot_be_read_is_reported_and_left(shared_dir):
    cache = build(shared_dir / "cache")
    with Store(cache) as store:
        locked = blob_file(store, "k0")  # the tuned winner's CUBIN
        before = {k: store.get_compile(k).cubin for k in ("k0", "k1", "k2")}
    if os.getuid() == 0:
        for path in [cache, *cache.rglob("*")]:
            os.chown(path, NOBODY, NOBODY)
    out = shared_dir / "out.txt"

    os.chmod(locked, 0)  # a CUBIN: reported, its entry and the tuning record naming it stay
    code, text = as_unprivileged(out, "verify", "--repair", "--cache", str(cache))
    assert code == 1, text
    (denied,) = [line for line in text.splitlines() if line.startswith("  permission_denied: ")]
    assert str(locked) in denied and HINT in denied, text
    assert "missing" not in text and "Traceback" not in text, text

    index = cache / "tuning" / "cache.db"
    os.chmod(index, 0)  # an index: reported, not "damaged"; a repair refuses to start
    code, text = as_unprivileged(out, "verify", "--cache", str(cache))
    assert code == 1 and f"permission_denied: tuning {cache / 'tuning' / 'cache.db'}: " in text, text
    assert "damaged" not in text and "missing" not in text, text
    code, text = as_unprivileged(out, "verify", "--repair", "--cache", str(cache))
    assert code == 2 and f"{index} is not writable: {HINT}" in text, text

    os.chmod(locked, stat.S_IRUSR | stat.S_IWUSR)
    os.chmod(index, stat.S_IRUSR | stat.S_IWUSR)
    with Store(cache) as store:  # everything is still there, intact
        assert {k: store.get_compile(k).cubin for k in before} == before
        assert store.get_tuning("t0")["compile_key"] == "k0"
        assert store.verify()["ok"]
    assert not (cache / "quarantine").exists()


def test_a_corrupt_blob_is_moved_into_quarantine_not_deleted(tmp_path, capsys):
    cache = build(tmp_path / "cache")
    with Store(cache) as store:
        bad = blob_file(store, "k1")
    data = bytearray(bad.read_bytes())
    data[100] ^= 0xFF
    bad.write_bytes(bytes(data))
    inode = bad.stat().st_ino

    assert cache_main.main(["verify", "--repair", "--cache", str(cache)]) == 1
    assert "corrupt_blob: blobs" in capsys.readouterr().out
    (kept,) = (cache / "quarantine").iterdir()
    assert kept.stat().st_ino == inode and kept.read_bytes() == bytes(data)  # the same file, moved
    assert not bad.exists()
    with Store(cache) as store:
        assert store.get_compile("k1") is None and store.get_compile("k0") is not None
        assert store.verify()["ok"]


def test_an_unreadable_blob_directory_is_named_as_a_permission_problem(shared_dir):
    cache = build(shared_dir / "cache")
    if os.getuid() == 0:
        for path in [cache, *cache.rglob("*")]:
            os.chown(path, NOBODY, NOBODY)
    blocked = next((cache / "blobs").glob("??"))
    os.chmod(blocked, 0)  # every CUBIN below it: the directory is named, with the fix
    code, text = as_unprivileged(shared_dir / "out.txt", "verify", "--repair", "--cache", str(cache))
    os.chmod(blocked, 0o700)
    assert code == 1 and f"{blocked}: {HINT}" in text and f"chmod -R u+rwX {blocked}" in text, text
    assert "a permission problem, not damage" in text and "repaired 0" in text
    assert "re-run precompile" not in text and "removes them" not in text


def test_a_namespace_it_may_not_read_is_a_permission_error_not_damage(shared_dir):
    """``stats`` on a cache whose compile/ this user may not enter: exit 2 (the command could
    not run) with who owns it and the fix; exit 1 is for what a command found (damage)."""
    cache = build(shared_dir / "cache")
    if os.getuid() == 0:
        for path in [cache, *cache.rglob("*")]:
            os.chown(path, NOBODY, NOBODY)
    out = shared_dir / "out.txt"
    os.chmod(cache / "compile", 0)
    code, text = as_unprivileged(out, "stats", "--cache", str(cache))
    assert code == 2 and "permission denied" in text and "damaged" not in text.lower(), text
    os.chmod(cache / "compile", 0o700)
