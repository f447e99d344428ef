"""Incremental builds skip cached keys; --from-record adds runtime workloads; bad input exits 2."""
from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures" / "farm_project"))
from cli_helpers import SMALL, explain, precompile  # noqa: E402

from ctbuild.cache import Store  # noqa: E402
from ctbuild.specs import Tensor, spec_to_json  # noqa: E402


def _record(n: int, arch: str = "sm_90") -> str:
    w = {"X": spec_to_json(Tensor((n,), "float16")), "OUT": spec_to_json(Tensor((n,), "float16"))}
    return json.dumps({"kernel": "scale", "workload": w, "arch": arch})


def test_incremental_and_from_record(tmp_path):
    cache = tmp_path / "cache"
    base = ("--config", str(SMALL), "--cache", str(cache), "--json", "--workers", "2")
    proc, _, one = precompile(*base, "--arch", "sm_90")
    assert proc.returncode == 0, explain(proc)
    assert (one["jobs"], one["compiled"], one["cached"]) == (6, 6, 0)

    # a second arch: only its jobs compile, the sm_90 ones are skipped as cached
    report = tmp_path / "r.json"
    proc, _, two = precompile(*base, "--arch", "sm_90,sm_100", "--report", str(report))
    assert proc.returncode == 0, explain(proc)
    assert (two["jobs"], two["compiled"], two["cached"]) == (12, 6, 6)
    rows = json.loads(report.read_text())["jobs"]
    assert {r["arch"] for r in rows if r["status"] == "compiled"} == {"sm_100"}

    # workloads recorded at run time (fp16 instead of the declared fp32; one on sm_100,
    # which is not a target of this run and gets added), duplicates ignored
    rec = tmp_path / "records.jsonl"
    rec.write_text("\n".join([_record(1 << 12), _record(1 << 12), "", _record(1 << 12, "sm_100")])
                   + "\n")
    proc, _, three = precompile(*base, "--arch", "sm_90", "--from-record", str(rec))
    assert proc.returncode == 0, explain(proc)
    assert three["archs"] == ["sm_90", "sm_100"]
    assert three["jobs"] == 24 and three["cached"] == 12 and three["compiled"] == 12
    with Store(cache) as store:
        n = sum(1 for _ in store.compile_entries())
    assert n == 24

    proc, _, four = precompile(*base, "--arch", "sm_90", "--from-record", str(rec))
    assert proc.returncode == 0 and four["compiled"] == 0 and four["workers"] == 0


def test_bad_input_exits_2_and_writes_nothing(tmp_path):
    cache = tmp_path / "cache"
    base = ("--config", str(SMALL), "--cache", str(cache))
    bad, nope, mismatch = tmp_path / "bad.jsonl", tmp_path / "nope.jsonl", tmp_path / "mm.jsonl"
    bad.write_text(_record(64) + "\n{oops\n")
    long = tmp_path / "long.jsonl"
    long.write_text("x" * (65 * 1024))
    nope.write_text(json.dumps({"kernel": "nope", "workload": {}, "arch": "sm_90"}) + "\n")
    mismatch.write_text(json.dumps({"kernel": "scale", "workload": {"X": 1}, "arch": "sm_90"})
                        + "\n")
    cases = [
        (("--workers", "0"), "must be >= 1"),
        (("--compile-timeout", "-1"), "must be > 0"),
        (("--arch", "sm_12"), "unknown GPU arch"),
        (("--report", str(tmp_path / "missing" / "r.json")), "does not exist"),
        (("--from-record", str(bad)), "bad.jsonl:2: not JSON"),
        (("--from-record", str(tmp_path / "nope.jsonl.absent")), "cannot read"),
        (("--from-record", "/dev/zero"), "/dev/zero is a character device, not a regular file"),
        (("--from-record", str(long)), "long.jsonl:1: line longer than 64 KiB"),
        (("--from-record", str(nope)), "no kernel named 'nope'"),
        (("--from-record", str(mismatch)), "do not match scale's"),
    ]
    # independent processes, each refused before it writes anything: two at a time
    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = list(pool.map(lambda case: precompile(*base, *case[0])[0], cases))
    for (args, message), proc in zip(cases, procs):
        assert proc.returncode == 2, (args, explain(proc))
        assert message in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "missing").exists()
    assert not cache.exists() or not any(Store(cache).compile_entries())
