"""``ctbuild tune --refine`` on a real GPU (marked ``gpu``; skipped without a CUDA GPU).

The example `softmax_rows` (a `Dim` row count in buckets up to 64, 1024 and 8192) is compiled
in-process into a fresh cache (no Ray), then tuned with ``--refine 3 --compile-missing`` and a
tie band of 0.1%, so that the regret at some of the nine interior sizes exceeds it. Every split
recorded must have its sub-bucket's record, and a real call at a size inside a sub-bucket must
be served with the sub-bucket's tuning key and winner (the runtime's provenance says which).
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


def test_a_refined_split_is_served_with_the_sub_buckets_record(tmp_path: Path) -> None:
    from ctbuild import runtime
    from ctbuild.cache import Store
    from ctbuild.project import load_project
    cache = tmp_path / "cache"
    _compiled_cache(cache)
    r = run_cli("tune", "--config", str(EXAMPLES / "ctbuild.toml"), "--cache", str(cache),
                "--kernel", KERNEL, "--refine", "3", "--tie-band", "0.1", "--compile-missing",
                "--json")
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout)
    if os.environ.get("CTBUILD_TEST_OUT"):
        keep = Path(os.environ["CTBUILD_TEST_OUT"])
        keep.mkdir(parents=True, exist_ok=True)
        (keep / "refine-tune.json").write_text(json.dumps(out, indent=1, default=str))
    regrets = {json.dumps(s["record"]["regret"]["bucket"]): s["record"]["regret"]["sizes"]
               for s in out["entries"] if s["record"].get("regret")}
    splits = [(s, p) for s in out["entries"] for p in s.get("refined", {}).get("splits", [])]
    assert splits, f"no interior size had a regret above 0.1% on this GPU: {regrets}"
    store = Store(cache)
    for s, p in splits:
        assert p["status"] == "tuned", p
        assert store.get_tuning(p["record_key"])["config"] == p["winner"]
        recorded = store.get_tuning(s["record_key"])["refined"]["splits"]
        assert p["sizes"] in [q["sizes"] for q in recorded]
    # Serve real calls: the split point itself and the size below it (inside the sub-bucket
    # unless the split is at the bucket's lower bound), each from the sub-bucket's record.
    kernel = next(k for k in load_project(EXAMPLES / "ctbuild.toml").kernels()
                  if k.name == KERNEL)
    runtime.configure(store=Store(cache, readonly=True), mode="default")
    try:
        for s, p in splits:
            rows = p["sizes"]["ROWS"]
            sub_key = store.get_tuning(p["record_key"])["tuning_key"]
            for n in {rows, max(rows - 1, s["record"]["regret"]["sizes"][0]["sizes"]["ROWS"])}:
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
