"""`ctbuild precompile` on the examples: every planned job compiles; a rerun compiles nothing."""
from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures" / "farm_project"))
from cli_helpers import ROOT, explain, precompile  # noqa: E402

from ctbuild.cache import Store  # noqa: E402

pytestmark = pytest.mark.slow


def test_examples_clean_then_incremental(tmp_path):
    cache = tmp_path / "cache"
    report = tmp_path / "report.json"
    # one arch: the two-arch build is exercised end to end by test_container_flow
    args = ("--config", str(ROOT / "examples" / "ctbuild.toml"), "--arch", "sm_90",
            "--cache", str(cache), "--json")
    with ThreadPoolExecutor(max_workers=1) as pool:  # the plan runs while Ray starts
        plan = pool.submit(subprocess.run, [
            sys.executable, "-m", "ctbuild", "plan", "--config",
            str(ROOT / "examples/ctbuild.toml"), "--arch", "sm_90", "--json"],
            capture_output=True, text=True, cwd=ROOT, check=True)
        proc, _, out = precompile(*args, "--report", str(report))
        planned = json.loads(plan.result().stdout)
    assert proc.returncode == 0, explain(proc)
    assert out["jobs"] == planned["jobs"] > 50
    assert out["compiled"] == out["jobs"] and out["failed"] == 0 and out["cached"] == 0
    assert out["failures"] == [] and out["archs"] == ["sm_90"]
    assert out["toolchain"] == planned["toolchain"] and out["workers"] >= 1
    assert {k["kernel"] for k in out["kernels"]} == {k["name"] for k in planned["kernels"]}
    rows = json.loads(report.read_text())["jobs"]
    assert len(rows) == out["jobs"] and all(r["status"] == "compiled" for r in rows)
    with Store(cache) as store:
        assert all(store.has_compile(r["key"]) for r in rows)
        hit = store.get_compile(rows[0]["key"])
        assert hit.cubin[:4] == b"\x7fELF" and hit.symbol
        assert hit.meta["arch"] == rows[0]["arch"] and hit.meta["kernel"] == rows[0]["kernel"]
        profile = store.toolchains()[hit.meta["toolchain"]]  # what serving nodes select by
        assert profile["cuda_tile"] == version("cuda-tile") and profile["created"]
        assert out["toolchain"] in store.toolchains()

    # every entry's key still maps to the TileIR it was built from (no fingerprint hole)
    identity = subprocess.run(
        [sys.executable, "-m", "ctbuild", "cache", "verify", "--identity", "--config",
         str(ROOT / "examples/ctbuild.toml"), "--cache", str(cache), "--json"],
        capture_output=True, text=True, cwd=ROOT)
    assert identity.returncode == 0, explain(identity)
    checked = json.loads(identity.stdout)
    assert checked["checked"] == out["jobs"] and checked["mismatches"] == []

    proc, _, again = precompile(*args)
    assert proc.returncode == 0, explain(proc)
    assert again["compiled"] == 0 and again["cached"] == out["jobs"] and again["failed"] == 0
    assert again["workers"] == 0  # nothing to compile: Ray is not started
