"""The serving read path (`ctbuild.serve.cache_reader`) meets odd files in a shared cache: a FIFO
in place of a value or index file, a value file far larger than its row records, a link to
``/dev/zero``, a namespace this user may not read. Each lookup is a miss with one warning, never
a hang, a traceback or a GB read; a permission problem is never called damage. Real FIFOs,
links and sparse files (truncate) in tmp_path; permissions under setpriv when run as root."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ctbuild.cache import Store

REPO = Path(__file__).resolve().parents[2]
CUBIN = b"\x7fELF" + bytes(range(256)) * 8
DROP_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--inh-caps=-all"]


def _cache(root: Path) -> Path:
    """A cache with one compile entry (key ``k1``); returns its blob's value file."""
    with Store(root) as store:
        store.put_compile("k1", CUBIN, symbol="sym1", meta={"kernel": "x"})
    return next((root / "blobs").rglob("*.val"))


READER = """
import json, logging, sys
from pathlib import Path
from ctbuild.serve.cache_reader import CacheReader
records = []
handler = logging.Handler()
handler.emit = records.append
logging.getLogger("ctbuild.runtime").addHandler(handler)
reader = CacheReader.open(Path(sys.argv[1]))
out = {"opened": reader is not None}
if reader is not None:
    out.update(hit=reader.get_compile("k1") is not None, has=reader.has_compile("k1"),
               damage=reader.damage)
out.update(log=[r.getMessage() for r in records],
           rss_mib=int(next(line for line in open('/proc/self/status')  # since exec
                            if line.startswith('VmHWM')).split()[1]) // 1024)
print(json.dumps(out))
"""


def lookup(root: Path, *, as_user: bool = False) -> dict[str, Any]:
    """Open a reader on ``root`` and look ``k1`` up, in a process of its own (a lookup blocked on
    a FIFO inside SQLite cannot be interrupted): what it found, logged and took in memory.
    ``as_user``: as root, without the capabilities that bypass permission bits."""
    prefix = []
    if as_user and os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot make a reader subject to permission bits")
        prefix = DROP_DAC
    try:
        proc = subprocess.run([*prefix, sys.executable, "-c", READER, str(root)], capture_output=True,
                              text=True, timeout=30, env={**os.environ, "PYTHONPATH": str(REPO)})
    except subprocess.TimeoutExpired:
        pytest.fail("the lookup hung")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


@pytest.mark.parametrize("odd", ["fifo", "dev_zero", "sparse_1g"])
def test_an_odd_value_file_is_a_miss_with_a_warning(tmp_path: Path, odd: str) -> None:
    blob = _cache(tmp_path / "c")
    if odd == "fifo":
        _fifo(blob)
    elif odd == "dev_zero":
        blob.unlink()
        blob.symlink_to("/dev/zero")
    else:
        os.truncate(blob, 2**30)  # sparse: no disk, but read whole it is a GB of memory
    out = lookup(tmp_path / "c")
    assert not out["hit"] and not out["has"] and out["rss_mib"] < 500, out
    messages = out["log"]
    assert str(blob) in messages[0] and all("compile entry k1" in m for m in messages[1:]), messages
    assert {"fifo": "FIFO", "dev_zero": "character device", "sparse_1g": str(2**30)}[odd] in messages[0]


@pytest.mark.parametrize("index", ["compile/cache.db", "blobs/cache.db-wal", "blobs/cache.db-shm"])
def test_an_index_file_that_is_a_fifo_is_damage_not_a_hang(tmp_path: Path, index: str) -> None:
    _cache(tmp_path / "c")
    _fifo(tmp_path / "c" / index)
    out = lookup(tmp_path / "c")
    assert not out["hit"] and "FIFO" in out["damage"], out


@pytest.mark.parametrize("odd", ["fifo", "sparse_2g"])
def test_an_odd_layout_marker_is_left_to_the_store(tmp_path: Path, odd: str) -> None:
    _cache(tmp_path / "c")
    marker = tmp_path / "c" / "ctbuild-cache.json"
    _fifo(marker) if odd == "fifo" else os.truncate(marker, 2**31)
    out = lookup(tmp_path / "c")
    assert out["opened"] is False and out["rss_mib"] < 500, out  # the store refuses it in one line


@pytest.mark.parametrize("denied", ["compile", "blobs/cache.db"])
def test_an_unreadable_namespace_is_a_miss_said_as_a_permission_problem(tmp_path: Path,
                                                                      denied: str) -> None:
    """A reader (as root: without the capabilities that bypass permission bits) of a cache
    whose ``compile/`` it may not enter, or whose blob index it may not open: a miss, one
    warning naming the path, its owner and mode, never a traceback and never "damaged"."""
    _cache(tmp_path / "c")
    (tmp_path / "c" / denied).chmod(0o000)
    try:
        out = lookup(tmp_path / "c", as_user=True)
    finally:
        (tmp_path / "c" / denied).chmod(0o755 if denied == "compile" else 0o644)
    assert not out["hit"] and not out["has"] and out["damage"] is None, out
    line, *rest = out["log"]
    assert all("compile entry k1" in m for m in rest), out["log"]
    assert "permission denied" in line and "damaged" not in line, line
    assert str(tmp_path / "c" / denied) in line and "chmod" in line and "owned by" in line, line
