"""A full disk under the cache stops the build: exit 1, a clear message, what was stored is kept."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures" / "farm_project"))
from cli_helpers import ROOT, SMALL, explain  # noqa: E402

pytestmark = pytest.mark.slow


def _can_unshare() -> bool:
    return os.geteuid() == 0 and subprocess.run(
        ["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare -m for a small tmpfs")
def test_full_disk_stops_the_build_and_keeps_what_landed(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    cache = disk / "cache"
    py = shlex.quote(sys.executable)
    # A 1 MiB tmpfs holding a cache built for sm_80, then filled up to 160 KiB of room: a few
    # CUBINs (16 KiB each) fit, the six of this project for sm_90 do not.
    script = (f"mount -t tmpfs -o size=1m none {disk} && "
              f"{py} -m ctbuild precompile --config {SMALL} --cache {cache} --workers 1 "
              f"--arch sm_80 >/dev/null 2>&1 && "
              f"(dd if=/dev/zero of={disk}/fill bs=4k 2>/dev/null; true) && "
              f"truncate -s -160K {disk}/fill && "
              f"{py} -m ctbuild precompile --config {SMALL} --cache {cache} --workers 1 "
              f"--report {tmp_path}/report.json >&2; echo \"precompile=$?\" >&2; "
              f"rm {disk}/fill; "
              f"{py} -m ctbuild cache verify --cache {cache} >&2; echo \"verify=$?\" >&2; "
              f"{py} -c 'from ctbuild.cache import Store; "
              f"print(sum(1 for _ in Store(\"{cache}\").compile_entries()))'")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=400)
    assert "precompile=1" in proc.stderr and "verify=0" in proc.stderr, explain(proc)
    assert "is full" in proc.stderr and "Traceback" not in proc.stderr, explain(proc)
    rows = json.loads((tmp_path / "report.json").read_text())["jobs"]
    by = {s: [r for r in rows if r["status"] == s] for s in ("compiled", "failed")}
    assert [r["error_type"] for r in by["failed"]].count("CacheWriteError") == 1, rows
    assert len(by["compiled"]) < 6
    assert int(proc.stdout.strip().splitlines()[-1]) == 6 + len(by["compiled"])  # all kept
