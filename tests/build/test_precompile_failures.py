"""Planted failures: a compile error, a tileiras hang (worker-side timeout) and a Python hang
(driver-side timeout, worker killed): reported, isolated, never cached; exit 1 unless
--allow-failures."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures" / "farm_project"))
from cli_helpers import FAULTY, explain, precompile  # noqa: E402

from ctbuild.cache import Store  # noqa: E402

HANG = {"FARM_FIXTURE_HANG": "1"}


def test_failures_reported_isolated_and_not_cached(tmp_path):
    cache, report = tmp_path / "cache", tmp_path / "out" / "report.json"
    report.parent.mkdir()
    args = ("--config", str(FAULTY), "--cache", str(cache), "--compile-timeout", "3",
            "--workers", "2")
    proc, _, _ = precompile(*args, "--report", str(report), env=HANG)  # timeout: hang guard
    assert proc.returncode == 1, explain(proc)
    text = proc.stdout
    assert "FAILED (3 jobs, 3 causes):" in text, explain(proc)
    assert "faulty sm_90 float16 {TM=96, TK=64}: TypeCheckingError" in text
    # both hangs were cut by the build's own timeouts (tileiras' on the worker, the driver's
    # on a Python hang), not by the test's guard
    assert "faulty sm_90 float16 {TM=1024, TK=512}: CompilerTimeoutError" in text
    assert "faulty sm_90 float16 {TM=128, TK=64}: Timeout: no result after" in text
    # one line per cause; those with no file:line of their own name the declaration's
    declared = "(declared at tests/fixtures/farm_project/farm_kernels/faulty.py:25)"
    assert {line.split("}")[0].split("TM=")[1]: line.endswith(declared)
            for line in text.splitlines() if line.startswith("  faulty sm_90 ")} == {
        "96, TK=64": False, "1024, TK=512": True, "128, TK=64": True}, explain(proc)

    data = json.loads(report.read_text())
    rows = {(r["kernel"], r["config"].get("TM"), r["config"].get("TILE"),
             r["config"].get("occupancy")): r for r in data["jobs"]}
    assert data["summary"]["failed"] == 3 and data["summary"]["compiled"] == 7
    assert data["summary"]["restarts"] >= 1  # the hung worker was replaced
    failed = {r["key"]: r for r in data["jobs"] if r["status"] == "failed"}
    assert {r["error_type"] for r in failed.values()} == {
        "TypeCheckingError", "CompilerTimeoutError", "Timeout"}
    assert "not a power of two" in rows[("faulty", 96, None, None)]["error"]
    with Store(cache) as store:
        for r in data["jobs"]:
            assert store.has_compile(r["key"]) == (r["status"] == "compiled"), r
    assert not list(report.parent.glob(".*tmp"))  # the report was written atomically

    # --allow-failures: same failures (they were not cached, so they are tried again), exit 0;
    # --json keeps stdout one JSON object
    proc, _, out = precompile(*args, "--allow-failures", "--json", env=HANG)
    assert proc.returncode == 0, explain(proc)
    assert out["failed"] == 3 and out["cached"] == 7 and out["compiled"] == 0
    assert {(f["kernel"], f["config"]["TM"], f["error_type"]) for f in out["failures"]} == {
        ("faulty", 96, "TypeCheckingError"), ("faulty", 1024, "CompilerTimeoutError"),
        ("faulty", 128, "Timeout")}
    assert all(f["error"] and "\n" not in f["error"] for f in out["failures"])
