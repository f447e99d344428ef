"""Read-only caches: a directory the reader cannot write (``chmod -R a-w``; when the tests run as
root, the reader runs as root *without* the capabilities that bypass file permissions, via
``setpriv``), and explicit ``readonly=True``. Every lookup is served, every write refused, and no
byte, file or mtime of the cache changes."""

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ctbuild.cache import ReadOnlyCacheError, Store

REPO = Path(__file__).resolve().parents[2]
N = 20
# Root ignores permission bits through these capabilities; a reader without them is refused writes.
DROP_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--inh-caps=-all"]


def cubin(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (500 + 37 * i)


def populate(root: Path) -> None:
    with Store(root) as store:
        for i in range(N):
            store.put_compile(f"k{i}", cubin(i), symbol=f"sym{i}", meta={"kernel": f"kern{i % 4}", "arch": "sm_90"})
        for i in range(0, N, 4):
            store.put_tuning(f"t{i}", {"kernel": f"kern{i % 4}", "arch": "sm_90", "compile_key": f"k{i}"})
        store.put_toolchain("tc", {"tileiras": "13.4.92"})


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under root with its mode, mtime and content hash: any write shows up here."""
    snap = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else None
            snap[str(path.relative_to(root))] = (st.st_mode, st.st_mtime_ns, st.st_size, digest)
    return snap


def chmod_tree(root: Path, dir_mode: int, file_mode: int) -> None:
    for dirpath, _, filenames in os.walk(root):
        os.chmod(dirpath, dir_mode)
        for name in filenames:
            os.chmod(Path(dirpath, name), file_mode)


@pytest.fixture
def frozen_cache(tmp_path):
    """A populated cache made unwritable (a-w)."""
    root = tmp_path / "cache"
    populate(root)
    chmod_tree(root, 0o555, 0o444)
    yield root
    chmod_tree(root, 0o755, 0o644)


READER = f'''
import hashlib, json, logging, sys
from ctbuild.cache import ReadOnlyCacheError, Store
records = []
handler = logging.Handler()
handler.emit = records.append
logging.getLogger("ctbuild.cache").addHandler(handler)
def cubin(i):
    return hashlib.sha256(str(i).encode()).digest() * (500 + 37 * i)
store = Store(sys.argv[1])
served = sum(store.get_compile(f"k{{i}}").cubin == cubin(i) for i in range({N}))
served += sum(store.get_tuning(f"t{{i}}")["compile_key"] == f"k{{i}}" for i in range(0, {N}, 4))
refusals = []
for write in (lambda: store.put_compile("new", b"x", symbol="s", meta={{}}), lambda: store.put_blob(b"x"),
              lambda: store.put_tuning("t", {{"kernel": "k", "arch": "a", "compile_key": "c"}}),
              lambda: store.remove_kernel("kern0"), lambda: store.gc()):
    try:
        write()
    except ReadOnlyCacheError as exc:
        refusals.append(str(exc))
print(json.dumps({{"readonly": store.readonly, "warnings": [r.getMessage() for r in records], "served": served,
                  "refusals": refusals, "stats": store.stats(), "verify": store.verify()["ok"],
                  "has": store.has_compile("k3"), "toolchains": store.toolchains()}}))
'''


def run_reader(*args: str) -> subprocess.CompletedProcess:
    """Run python with ``args`` unable to bypass file permissions (also when we are root)."""
    prefix = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot make a reader subject to permission bits")
        prefix = DROP_DAC
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("CTBUILD_CACHE_DIR", None)
    return subprocess.run([*prefix, sys.executable, *args], cwd="/", env=env, capture_output=True, text=True,
                          timeout=60)


def test_unwritable_dir_is_detected_serves_lookups_and_refuses_writes(frozen_cache):
    before = snapshot(frozen_cache)
    proc = run_reader("-c", READER, str(frozen_cache))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["readonly"] is True
    assert len(out["warnings"]) == 1 and "read-only" in out["warnings"][0]
    assert out["served"] == N + N // 4
    assert len(out["refusals"]) == 5
    assert all(str(frozen_cache) in msg and "read-only" in msg for msg in out["refusals"])
    assert out["stats"]["compile_entries"] == N and out["stats"]["readonly"] is True
    assert out["verify"] and out["has"] and out["toolchains"] == {"tc": {"tileiras": "13.4.92"}}

    for args, code in ((["stats"], 0), (["ls"], 0), (["verify"], 0), (["gc"], 2), (["rm", "kern0"], 2)):
        proc = run_reader("-m", "ctbuild.cache", *args, "--cache", str(frozen_cache), "--json")
        assert proc.returncode == code, (args, proc.stdout, proc.stderr)
        result = json.loads(proc.stdout)
        if code == 2:
            assert "read-only" in result["error"] and "read-only" in proc.stderr
        if args == ["stats"]:
            assert result["compile_entries"] == N and result["writable"] is False
    assert snapshot(frozen_cache) == before


def test_explicit_readonly_modifies_nothing_even_as_root(frozen_cache):
    before = snapshot(frozen_cache)
    with Store(frozen_cache, readonly=True) as store:
        assert all(store.get_compile(f"k{i}").cubin == cubin(i) for i in range(N))
        assert store.get_blob(store.get_compile("k1").meta["digest"]) == cubin(1)
        assert len(dict(store.compile_entries())) == N and store.verify()["ok"]
        assert store.stats()["compile_entries"] == N
        with pytest.raises(ReadOnlyCacheError, match="read-only"):
            store.put_compile("new", b"x", symbol="s", meta={})
        with pytest.raises(ReadOnlyCacheError):
            store.import_bundle(frozen_cache / "nope.tar")
    assert snapshot(frozen_cache) == before


def test_readonly_on_missing_dir_is_an_empty_cache(tmp_path):
    store = Store(tmp_path / "absent", readonly=True)
    assert store.get_compile("k") is None and store.stats()["compile_entries"] == 0
    assert not (tmp_path / "absent").exists()


def test_readonly_reader_follows_a_live_writer(tmp_path):
    populate(tmp_path)
    assert not list(tmp_path.glob("*/cache.db-wal"))  # writer closed: the reader starts immutable
    reader = Store(tmp_path, readonly=True)
    assert reader.get_compile("k0").cubin == cubin(0)
    with Store(tmp_path) as writer:
        writer.put_compile("late", cubin(99), symbol="s", meta={"kernel": "x", "arch": "sm_90"})
        assert reader.get_compile("late").cubin == cubin(99)
        writer.put_compile("later", cubin(98), symbol="s", meta={"kernel": "x", "arch": "sm_90"})
        assert reader.has_compile("later") and reader.get_compile("later").cubin == cubin(98)
