"""A `Dim` bucket split by ``ctbuild tune`` on a real GPU (marked ``gpu``; skipped without one).

The example `softmax_rows` (a `Dim` row count in buckets up to 64, 1024 and 8192) is compiled
in-process into a fresh cache (no Ray), then tuned with ``--refine 3`` and a tie band of 0.1%,
so that no config is within it at every size of some bucket. Every split recorded must have its
sub-bucket's record, and a real call at a size inside a sub-bucket must be served with the
sub-bucket's tuning key and winner (the runtime's provenance says which).
Set CTBUILD_TEST_OUT=DIR to keep the tune's JSON there.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import EXAMPLES, cuda_available, run_cli

if not cuda_available():
    pytest.skip("needs a CUDA GPU (none visible)", allow_module_level=True)

import torch  # noqa: E402

pytestmark = pytest.mark.gpu

KERNEL = "softmax_rows"


def _compiled_cache(path: Path) -> None:
    """Every softmax_rows candidate of the declared buckets for this GPU, compiled in-process."""
    from ctbuild.arch import Arch
    from ctbuild.cache import Store
    from ctbuild.compile.compile_pool import CompilePool
    from ctbuild.compile.plan import make_plan
    from ctbuild.project import load_project
    from ctbuild.toolchain import probe
    store = Store(path)
    project = load_project(EXAMPLES / "ctbuild.toml")
    tc = probe()
    store.put_toolchain(tc.fingerprint, {**tc.profile, "created": "test"})
    major, minor = torch.cuda.get_device_capability()
    kernels = [k for k in project.kernels() if k.name == KERNEL]
    plan = make_plan(kernels, [Arch(f"sm_{major}{minor}")], tc.fingerprint, project.cap)
    pool = CompilePool(store, paths=[str(p) for p in project.paths])
    try:
        for job in plan.jobs.values():
            pool.submit(job)
        assert len(list(pool.arrivals(plan.jobs))) == len(plan.jobs)
    finally:
        pool.close()
    assert not pool.errors, pool.errors


def test_a_split_is_served_with_the_sub_buckets_record(tmp_path: Path) -> None:
    from ctbuild import runtime
    from ctbuild.cache import Store
    from ctbuild.project import load_project
    cache = tmp_path / "cache"
    _compiled_cache(cache)
    r = run_cli("tune", "--config", str(EXAMPLES / "ctbuild.toml"), "--cache", str(cache),
                "--kernel", KERNEL, "--refine", "3", "--tie-band", "0.1", "--json")
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout)
    if os.environ.get("CTBUILD_TEST_OUT"):
        keep = Path(os.environ["CTBUILD_TEST_OUT"])
        keep.mkdir(parents=True, exist_ok=True)
        (keep / "refine-tune.json").write_text(json.dumps(out, indent=1, default=str))
    splits = [(s, p) for s in out["entries"]
              for p in (s["record"].get("refined") or {}).get("splits", [])]
    worst = {json.dumps(s["record"]["regret"]["bucket"]): s["record"]["regret"]["worst_pct"]
             for s in out["entries"] if s["record"].get("regret")}
    assert splits, f"no bucket lost more than 0.1% at any size on this GPU: {worst}"
    store = Store(cache)
    subs = {json.dumps(r["workload"]["X"]["tensor"][0]): r for _, r in store.tuning_records()
            if r.get("source") == "split"}
    for _, p in splits:
        sub = subs[json.dumps(p["sizes"]["ROWS"])]
        p["winner"] = sub["config"]
        assert sub["regret"]["bucket"] == p["sizes"]
    # Serve real calls: the split point itself and the size below it (inside the sub-bucket
    # unless the split is at the bucket's lower bound), each from the sub-bucket's record.
    kernel = next(k for k in load_project(EXAMPLES / "ctbuild.toml").kernels()
                  if k.name == KERNEL)
    runtime.configure(store=Store(cache, readonly=True), mode="default")
    try:
        for s, p in splits:
            rows = p["sizes"]["ROWS"]
            sub_key = subs[json.dumps(rows)]["tuning_key"]
            for n in {rows, max(rows - 1, s["record"]["regret"]["lower"]["ROWS"])}:
                x = torch.randn(n, 1024, dtype=torch.float16, device="cuda")
                y = torch.empty_like(x)
                kernel(x, y)
                torch.cuda.synchronize()
                torch.testing.assert_close(y.float(), torch.softmax(x.float(), dim=1),
                                           atol=2e-3, rtol=2e-2)
                row = next(e for e in kernel.runtime.provenance()["entries"]
                           if e["workload"]["X"]["tensor"][0] == n)
                assert row["sub_bucket"] == p["sizes"], (n, row)
                assert json.loads(json.dumps(row["tuning_key"])) == sub_key, (n, row)
                assert row["config"] == p["winner"], row
                assert row["config_from"] in ("cache", "memory"), row  # the record, once read
    finally:
        runtime.reset()
